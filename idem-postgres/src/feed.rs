//! The change feed (C5, C13): a task of its own that LISTENs for what other processes announce
//! (`sql/announce.sql`) and wakes this process's waiting duplicates
//! ([`Changes::changed`]), for as long as an engine of the store lives
//! ([`Changes::is_closed`], checked every [`CHECK_EVERY`]).
//!
//! - **Its own connection.** The listener is one session of its own, outside the store's
//!   connections and pool (none is held while duplicates wait), opened with the listener's
//!   connect options (the store's unless the builder was given others: LISTEN needs a session
//!   of its own, so behind a pooler in transaction mode the listener must reach the server
//!   directly).
//! - **Silence is a fault.** A connection can die without a word (a partition, a frozen
//!   network, a failover that left the listener on the old server). Every ping interval the
//!   feed sends a ping the way announcements travel (`pg_notify` on the store's own
//!   connections) to a channel only its listener follows; a ping sent that does not arrive
//!   within the ping deadline means the listener is dead: it is dropped and another opened. A
//!   ping the store could not send proves nothing about the listener and is not held against it.
//! - **Reconnection.** A lost, silent or unopenable listener is replaced after a delay that
//!   starts at 100 ms and doubles up to 5 s ([`crate::backoff`]), back to 100 ms once a
//!   connection proved healthy (its ping arrived). After every (re)connection the feed calls
//!   [`Changes::missed`]: announcements may have been lost meanwhile, so every waiter reads its
//!   record again. Each replacement is a warn log on target `idem_postgres`.
//! - **Bad payloads.** A payload that is not a record digest wakes every waiter
//!   ([`Changes::missed`]) rather than miss one.

use crate::backoff::Backoff;
use crate::store::{Inner, PgStore};
use idem_core::store::{digest_from_hex, Changes};
use idem_core::{Error, FencingToken};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::time::Instant;

/// How often the feed checks whether its engines are gone.
const CHECK_EVERY: Duration = Duration::from_millis(500);

/// A ping on its way through the store's connections.
type Sending = Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>;

/// One store's feed in this process.
pub(crate) struct Feed {
    /// The store, for the pings; the feed ends when it is gone.
    store: Weak<Inner>,
    listener: PgConnectOptions,
    channel: String,
    /// The channel of this feed's own pings: `<channel>_<16 random hex digits>`.
    pings: String,
    ping_every: Duration,
    ping_within: Duration,
    /// How long opening the listener (connection and LISTEN) may take.
    connect_within: Duration,
    changes: Changes,
}

/// Why a listener's session ended.
enum End {
    /// The engines are gone: the feed stops.
    Closed,
    /// The listener failed; `healthy` if a ping had arrived on it.
    Lost { healthy: bool, why: String },
}

impl Feed {
    /// The feed of the store `inner`, delivering to `changes`.
    pub(crate) fn new(inner: &Arc<Inner>, changes: Changes) -> Self {
        let feed = &inner.feed;
        let nonce = FencingToken::generate().to_string();
        Self {
            store: Arc::downgrade(inner),
            listener: inner.listener.0.clone(),
            channel: feed.channel.clone(),
            pings: format!("{}_{}", feed.channel, &nonce[..16]),
            ping_every: feed.ping_every,
            ping_within: feed.ping_within,
            connect_within: inner.connect_within,
            changes,
        }
    }

    /// Follows the channel until the engines are gone, replacing the listener whenever it
    /// fails.
    pub(crate) async fn run(self) {
        let mut backoff = Backoff::new();
        loop {
            if self.closed() {
                return;
            }
            let end = match self.connect().await {
                Ok(mut listener) => {
                    // Announcements may have been sent while no listener followed the channel.
                    self.changes.missed();
                    self.follow(&mut listener).await
                }
                Err(why) => End::Lost {
                    healthy: false,
                    why,
                },
            };
            let End::Lost { healthy, why } = end else {
                return;
            };
            if healthy {
                backoff.reset();
            }
            let delay = backoff.next();
            tracing::warn!(
                target: "idem_postgres",
                channel = %self.channel,
                why = %why,
                retry_in = ?delay,
                "the change feed's listener failed: connecting again"
            );
            if !self.pause(delay).await {
                return;
            }
        }
    }

    fn closed(&self) -> bool {
        self.changes.is_closed() || self.store.strong_count() == 0
    }

    /// Waits `delay`; `false` if the engines went away meanwhile.
    async fn pause(&self, delay: Duration) -> bool {
        let until = Instant::now() + delay;
        while Instant::now() < until {
            if self.closed() {
                return false;
            }
            tokio::time::sleep_until(until.min(Instant::now() + CHECK_EVERY)).await;
        }
        !self.closed()
    }

    /// A new listener on a session of its own, following the channel and the pings.
    ///
    /// Each listener has a pool of its own (one connection, no lifetime or idle limit): a
    /// listener dropped while its connection is frozen gives the connection back to its pool
    /// from a task sqlx spawns, which waits as long as the network does; the next listener
    /// does not depend on it.
    async fn connect(&self) -> Result<PgListener, String> {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .max_lifetime(None)
            .idle_timeout(None)
            .test_before_acquire(false)
            .acquire_timeout(self.connect_within)
            .connect_lazy_with(self.listener.clone());
        let open = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.ignore_pool_close_event(true);
            // A lost connection ends `try_recv` with `None`: the feed replaces the listener
            // itself, with its back-off and a `missed` after it.
            listener.eager_reconnect(false);
            listener
                .listen_all([self.channel.as_str(), self.pings.as_str()])
                .await?;
            Ok::<_, sqlx::Error>(listener)
        };
        match tokio::time::timeout(self.connect_within, open).await {
            Ok(Ok(listener)) => Ok(listener),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!("no listener within {:?}", self.connect_within)),
        }
    }

    /// Delivers what arrives on `listener` and pings it, until it fails or the engines are gone.
    async fn follow(&self, listener: &mut PgListener) -> End {
        let mut healthy = false;
        let mut seq: u64 = 0;
        // The payload of the ping on its way, until it arrives or proves nothing.
        let mut awaiting: Option<String> = None;
        // When the ping sent must have arrived.
        let mut arrive_by: Option<Instant> = None;
        let mut sending: Option<Sending> = None;
        // The first ping at once: a new listener proves itself before it counts as healthy.
        let mut next_ping = Instant::now();
        loop {
            let now = Instant::now();
            if self.changes.is_closed() {
                return End::Closed;
            }
            if arrive_by.is_some_and(|by| now >= by) {
                return End::Lost {
                    healthy,
                    why: format!(
                        "a ping sent through the store did not arrive within {:?}",
                        self.ping_within
                    ),
                };
            }
            // One ping at a time: a new one only once the last arrived or proved nothing.
            if awaiting.is_none() && sending.is_none() && now >= next_ping {
                let Some(inner) = self.store.upgrade() else {
                    return End::Closed;
                };
                seq += 1;
                let payload = seq.to_string();
                sending = Some(ping(
                    PgStore { inner },
                    self.pings.clone(),
                    payload.clone(),
                    self.ping_within,
                ));
                awaiting = Some(payload);
                arrive_by = None;
                next_ping = now + self.ping_every;
            }
            let mut wake = now + CHECK_EVERY;
            if let Some(by) = arrive_by {
                wake = wake.min(by);
            }
            if awaiting.is_none() && sending.is_none() {
                wake = wake.min(next_ping);
            }
            tokio::select! {
                received = listener.try_recv() => match received {
                    Ok(Some(notification)) if notification.channel() == self.pings => {
                        if awaiting.as_deref() == Some(notification.payload()) {
                            awaiting = None;
                            arrive_by = None;
                            healthy = true;
                        }
                    }
                    Ok(Some(notification)) => deliver(&self.changes, notification.payload()),
                    Ok(None) => {
                        return End::Lost { healthy, why: "the connection was lost".to_owned() }
                    }
                    Err(error) => return End::Lost { healthy, why: error.to_string() },
                },
                sent = async {
                    match sending.as_mut() {
                        Some(sending) => sending.await,
                        None => std::future::pending().await,
                    }
                }, if sending.is_some() => {
                    sending = None;
                    match sent {
                        Ok(()) if awaiting.is_some() => {
                            arrive_by = Some(Instant::now() + self.ping_within);
                        }
                        Ok(()) => {}
                        Err(error) => {
                            // The store's path failed: nothing learnt about the listener.
                            tracing::debug!(
                                target: "idem_postgres",
                                %error,
                                "the change feed's ping could not be sent"
                            );
                            awaiting = None;
                        }
                    }
                }
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

/// Sends one ping through the store's connections, within `within`.
fn ping(store: PgStore, channel: String, payload: String, within: Duration) -> Sending {
    Box::pin(async move {
        tokio::time::timeout(within, store.notify(&channel, &payload))
            .await
            .unwrap_or_else(|_| {
                Err(Error::store(
                    crate::error::BACKEND,
                    idem_core::StoreErrorKind::Unavailable,
                    "the change feed's ping was not sent in time",
                ))
            })
    })
}

/// Hands one announcement to the waiters.
fn deliver(changes: &Changes, payload: &str) {
    match digest_from_hex(payload) {
        Some(digest) => changes.changed(&digest),
        // Not a digest: wake everyone rather than miss one.
        None => changes.missed(),
    }
}
