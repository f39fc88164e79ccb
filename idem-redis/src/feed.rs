//! The change feed (C5, C13): a task of its own with a pub/sub connection SUBSCRIBEd to the
//! channel what other processes announce (`PUBLISH <channel> <digest>`), waking this process's
//! waiting duplicates ([`Changes::changed`]) for as long as an engine of the store lives
//! ([`Changes::is_closed`], checked every [`CHECK_EVERY`]).
//!
//! - **Its own connection.** The subscription is a connection of its own (RESP2 pub/sub),
//!   outside the store's supervised connection, which no waiter holds. On a Redis Cluster a
//!   `PUBLISH` reaches the subscribers of every node, so the feed subscribes on one seed node
//!   and moves to the next one when that one fails.
//! - **Silence is a fault.** A connection can die without a word (a partition, a NAT that forgot
//!   the flow, a node that froze). Every ping interval the feed publishes a ping the way
//!   announcements travel (through the store's connection) on a channel only it follows; a ping
//!   published that does not arrive within the ping deadline means the subscription is dead:
//!   it is dropped and another opened. A ping the store could not publish proves nothing about
//!   the subscription and is not held against it.
//! - **Reconnection.** A lost, silent or unopenable subscription is replaced after a delay that
//!   starts at 100 ms and doubles up to 5 s ([`crate::backoff`]), back to 100 ms once a
//!   connection proved healthy (its ping arrived). After every (re)subscription the feed calls
//!   [`Changes::missed`]: announcements may have been lost meanwhile, so every waiter reads its
//!   record again. Each replacement is a warn log on target `idem_redis`.
//! - **Bad payloads.** A payload that is not a record digest wakes every waiter
//!   ([`Changes::missed`]) rather than miss one.

use crate::backoff::Backoff;
use crate::connections::Connections;
use futures_core::Stream;
use idem_core::store::{digest_from_hex, Changes};
use idem_core::{Error, FencingToken};
use redis::aio::{PubSub, PubSubStream};
use redis::Msg;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::time::Instant;

/// How often the feed checks whether its engines are gone.
const CHECK_EVERY: Duration = Duration::from_millis(500);

/// A ping on its way through the store's connection.
type Sending = Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>;

/// Where and how the feed subscribes.
#[derive(Debug, Clone)]
pub(crate) struct Subscribers {
    /// The one Redis, or a Cluster's seed nodes, tried in turn.
    pub(crate) clients: Vec<redis::Client>,
    /// How long opening a subscription (connection and SUBSCRIBE) may take.
    pub(crate) connect_within: Duration,
}

/// One store's feed in this process.
pub(crate) struct Feed {
    /// The store's connections, for the pings; the feed ends when they are gone.
    conns: Weak<Connections>,
    subscribers: Subscribers,
    channel: String,
    /// The channel of this feed's own pings.
    pings: String,
    ping_every: Duration,
    ping_within: Duration,
    changes: Changes,
}

/// Why a subscription ended.
enum End {
    /// The engines are gone: the feed stops.
    Closed,
    /// The subscription failed; `healthy` if a ping had arrived on it.
    Lost { healthy: bool, why: String },
}

impl Feed {
    /// The feed of a store, delivering to `changes`.
    pub(crate) fn new(
        conns: &Arc<Connections>,
        settings: &crate::feed_settings::FeedSettings,
        subscribers: Subscribers,
        changes: Changes,
    ) -> Self {
        let nonce = FencingToken::generate().to_string();
        Self {
            conns: Arc::downgrade(conns),
            subscribers,
            channel: settings.channel.clone(),
            pings: settings.ping_channel(&nonce[..16]),
            ping_every: settings.ping_every,
            ping_within: settings.ping_within,
            changes,
        }
    }

    /// Follows the channel until the engines are gone, replacing the subscription whenever it
    /// fails (on a Cluster, on the next seed node).
    pub(crate) async fn run(self) {
        let mut backoff = Backoff::new();
        let mut node = 0usize;
        loop {
            if self.closed() {
                return;
            }
            let Some(client) = self
                .subscribers
                .clients
                .get(node % self.subscribers.clients.len().max(1))
            else {
                return;
            };
            let end = match self.subscribe(client).await {
                Ok(pubsub) => {
                    // Announcements may have been published while nobody here subscribed.
                    self.changes.missed();
                    self.follow(pubsub).await
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
            node = node.wrapping_add(1);
            let delay = backoff.next();
            tracing::warn!(
                target: "idem_redis",
                channel = %self.channel,
                why = %why,
                retry_in = ?delay,
                "the change feed's subscription failed: subscribing again"
            );
            if !self.pause(delay).await {
                return;
            }
        }
    }

    fn closed(&self) -> bool {
        self.changes.is_closed() || self.conns.strong_count() == 0
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

    /// A new pub/sub connection to `client`, subscribed to the channel and the pings.
    async fn subscribe(&self, client: &redis::Client) -> Result<PubSub, String> {
        let within = self.subscribers.connect_within;
        let open = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub
                .subscribe(&[self.channel.as_str(), self.pings.as_str()])
                .await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        match tokio::time::timeout(within, open).await {
            Ok(Ok(pubsub)) => Ok(pubsub),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!("no subscription within {within:?}")),
        }
    }

    /// Delivers what arrives on `pubsub` and pings it, until it fails or the engines are gone.
    async fn follow(&self, pubsub: PubSub) -> End {
        // The sink stays: dropping it would end the connection.
        let (_sink, stream) = pubsub.split();
        let mut stream = std::pin::pin!(stream);
        let mut healthy = false;
        let mut seq: u64 = 0;
        // The payload of the ping on its way, until it arrives or proves nothing.
        let mut awaiting: Option<String> = None;
        // When the ping published must have arrived.
        let mut arrive_by: Option<Instant> = None;
        let mut sending: Option<Sending> = None;
        // The first ping at once: a new subscription proves itself before it counts as healthy.
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
                        "a ping published through the store did not arrive within {:?}",
                        self.ping_within
                    ),
                };
            }
            // One ping at a time: a new one only once the last arrived or proved nothing.
            if awaiting.is_none() && sending.is_none() && now >= next_ping {
                let Some(conns) = self.conns.upgrade() else {
                    return End::Closed;
                };
                seq += 1;
                let payload = seq.to_string();
                sending = Some(ping(
                    conns,
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
                received = next(stream.as_mut()) => match received {
                    Some(message) if message.get_channel_name() == self.pings => {
                        if awaiting.as_deref().map(str::as_bytes) == Some(message.get_payload_bytes()) {
                            awaiting = None;
                            arrive_by = None;
                            healthy = true;
                        }
                    }
                    Some(message) => deliver(&self.changes, &message),
                    None => {
                        return End::Lost { healthy, why: "the connection was lost".to_owned() }
                    }
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
                            // The store's path failed: nothing learnt about the subscription.
                            tracing::debug!(
                                target: "idem_redis",
                                %error,
                                "the change feed's ping could not be published"
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

/// The next message of the subscription; `None` once its connection is gone.
async fn next(mut stream: Pin<&mut PubSubStream>) -> Option<Msg> {
    std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await
}

/// Publishes one ping through the store's connection, within `within`.
fn ping(conns: Arc<Connections>, channel: String, payload: String, within: Duration) -> Sending {
    Box::pin(async move {
        tokio::time::timeout(within, conns.publish(&channel, &payload))
            .await
            .unwrap_or_else(|_| {
                Err(Error::store(
                    crate::error::BACKEND,
                    idem_core::StoreErrorKind::Unavailable,
                    "the change feed's ping was not published in time",
                ))
            })
    })
}

/// Hands one announcement to the waiters.
fn deliver(changes: &Changes, message: &Msg) {
    let digest = std::str::from_utf8(message.get_payload_bytes())
        .ok()
        .and_then(digest_from_hex);
    match digest {
        Some(digest) => changes.changed(&digest),
        // Not a digest: wake everyone rather than miss one.
        None => changes.missed(),
    }
}
