//! A store's change feed, supervised (C5, C13): the loop that delivers what other processes
//! announce ([`Store::announce`](idem_core::Store::announce)) to this process's waiting duplicates
//! ([`Changes::changed`]) for as long as an engine of the store lives ([`Changes::is_closed`],
//! checked every half second). A store gives it its mechanics through [`Listen`]: how to
//! open a listener, receive on it, and send a ping the way its announcements travel; the rest
//! is here, once for every store.
//!
//! - **Silence is a fault.** A connection can die without a word (a partition, a frozen link, a
//!   NAT that forgot the flow, a failover that left the listener on the old server). Every ping
//!   interval the feed sends a ping through the store, as announcements travel, on a channel
//!   only its listener follows; a ping sent that does not arrive within the ping deadline means
//!   the listener is dead: it is dropped and another opened. A ping the store could not send
//!   proves nothing about the listener and is not held against it.
//! - **Reconnection.** A lost, silent or unopenable listener is replaced after a delay that
//!   starts at 100 ms and doubles up to 5 s (`backoff.rs`), back to 100 ms once a
//!   connection proved healthy (its ping arrived). After every (re)connection the feed calls
//!   [`Changes::missed`]: announcements may have been lost meanwhile, so every waiter reads its
//!   record again. Each replacement is reported to the store ([`FeedEvent::Replacing`]).
//! - **Bad payloads.** A payload that is not a record digest wakes every waiter
//!   ([`Changes::missed`]) rather than miss one.

use crate::backoff::Backoff;
use idem_core::store::{digest_from_hex, Changes};
use idem_core::{Error, FencingToken, Field};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::time::Instant;

/// How often the feed checks whether its engines are gone.
const CHECK_EVERY: Duration = Duration::from_millis(500);

/// A ping on its way through the store.
type Sending = Pin<Box<dyn Future<Output = Result<(), PingError>> + Send>>;

/// Why a ping was not sent.
enum PingError {
    /// The store failed.
    Store(Error),
    /// The ping deadline passed first.
    Late,
}

impl std::fmt::Display for PingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PingError::Store(error) => error.fmt(f),
            PingError::Late => f.write_str("the change feed's ping was not sent in time"),
        }
    }
}

/// What every store's change feed is configured with: whether there is one, its channel, and
/// how a silent listener is found. A store checks the channel's name by its own rules; the
/// rest is checked by [`validate`](Self::validate).
///
/// ```
/// use idem_ops::feed::FeedSettings;
/// use std::time::Duration;
/// let mut settings = FeedSettings::new("changes");
/// assert!(settings.enabled);
/// assert_eq!(settings.ping_every, Duration::from_secs(5));
/// assert_eq!(settings.ping_within, Duration::from_secs(2));
/// assert!(settings.validate().is_ok());
/// settings.ping_within = Duration::ZERO;
/// assert!(settings.validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FeedSettings {
    /// Whether the store has a feed at all (default true).
    pub enabled: bool,
    /// The channel announcements travel on.
    pub channel: String,
    /// How often the feed checks that announcements still reach its listener (default 5 s).
    pub ping_every: Duration,
    /// How long a ping the store sent may take to reach the listener before the listener is
    /// judged dead and replaced (default 2 s).
    pub ping_within: Duration,
}

impl FeedSettings {
    /// A feed on `channel`, with the default pings.
    pub fn new(channel: &str) -> Self {
        Self {
            enabled: true,
            channel: channel.to_owned(),
            ping_every: Duration::from_secs(5),
            ping_within: Duration::from_secs(2),
        }
    }

    /// Checks the ping's durations: both more than zero, else [`Error::InvalidInput`].
    pub fn validate(&self) -> Result<(), Error> {
        if self.ping_every.is_zero() || self.ping_within.is_zero() {
            return Err(Error::invalid(
                Field::Config,
                "the change feed's ping interval and deadline must be more than zero",
            ));
        }
        Ok(())
    }
}

/// One message a listener received: the channel it came on and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The channel.
    pub channel: String,
    /// The payload, as sent.
    pub payload: Vec<u8>,
}

/// What a feed tells its store, which logs it on its own target.
#[derive(Debug)]
#[non_exhaustive]
pub enum FeedEvent<'a> {
    /// The listener on `channel` failed (or could not be opened) because of `why`; another is
    /// opened after `retry_in`.
    Replacing {
        /// The feed's channel.
        channel: &'a str,
        /// Why the listener failed.
        why: &'a str,
        /// When the next listener is opened.
        retry_in: Duration,
    },
    /// A ping could not be sent through the store: nothing is learnt about the listener.
    PingNotSent {
        /// The store's error, or that the ping deadline passed.
        error: &'a str,
    },
}

/// A store's mechanics for its change feed ([`Feed`]): its listener's connection, and the way
/// its announcements travel (for the pings).
///
/// ```
/// use idem_core::store::Changes;
/// use idem_ops::feed::{Feed, FeedEvent, FeedSettings, Listen, Received};
/// use idem_core::Error;
/// use std::sync::Arc;
///
/// /// A feed of a store that cannot listen: every listener fails to open.
/// struct Deaf;
///
/// impl Listen for Deaf {
///     type Listener = ();
///     type Store = ();
///     async fn connect(&mut self, _channels: [&str; 2]) -> Result<(), String> {
///         Err("no server".to_owned())
///     }
///     async fn receive(&self, _listener: &mut ()) -> Result<Option<Received>, String> {
///         Ok(None)
///     }
///     async fn ping(_store: Arc<()>, _channel: String, _payload: String) -> Result<(), Error> {
///         Ok(())
///     }
///     fn report(&self, _event: FeedEvent<'_>) {}
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = Arc::new(());
/// let settings = FeedSettings::new("changes");
/// let feed = Feed::new(Deaf, Arc::downgrade(&store), &settings, "changes_ping_", Changes::closed());
/// assert!(feed.pings().starts_with("changes_ping_"));
/// // Its engines are gone: the feed stops at once.
/// feed.run().await;
/// # }
/// ```
pub trait Listen: Send + Sync + 'static {
    /// A connection that follows the feed's channels.
    type Listener: Send;

    /// What the store's clones share, which the pings go through (the feed holds it weakly,
    /// and stops once every clone of the store is gone).
    type Store: Send + Sync + 'static;

    /// Opens a listener following both `channels` (the announcements' and the feed's pings'),
    /// within the store's connect deadline; the reason it could not, as text. Called again
    /// after every failure (a store with several nodes may try the next one).
    fn connect(
        &mut self,
        channels: [&str; 2],
    ) -> impl Future<Output = Result<Self::Listener, String>> + Send;

    /// The next message on `listener`; `Ok(None)` once its connection is lost, `Err` with the
    /// reason when it fails otherwise. Dropped before it resolves, it loses no message.
    fn receive(
        &self,
        listener: &mut Self::Listener,
    ) -> impl Future<Output = Result<Option<Received>, String>> + Send;

    /// Sends `payload` on `channel` through `store`, the way announcements travel (the
    /// store's own connections). The feed bounds it by its ping deadline.
    fn ping(
        store: Arc<Self::Store>,
        channel: String,
        payload: String,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Logs what the feed reports, on the store's own target.
    fn report(&self, event: FeedEvent<'_>);
}

/// Writes a store's [`Listen::report`]: each [`FeedEvent`] logged on the store's own `target`
/// (a `tracing` target is a constant, so each store names its own), a replacement at warn with
/// the fields `channel`, `why` and `retry_in`, a ping that could not be sent at debug with the
/// field `error`, each with the store's own words.
///
/// ```
/// use idem_ops::feed::Received;
/// use idem_core::Error;
/// use std::sync::Arc;
/// # struct Deaf;
/// impl idem_ops::feed::Listen for Deaf {
///     // connect, receive, ping ...
/// #   type Listener = ();
/// #   type Store = ();
/// #   async fn connect(&mut self, _: [&str; 2]) -> Result<(), String> { Err(String::new()) }
/// #   async fn receive(&self, _: &mut ()) -> Result<Option<Received>, String> { Ok(None) }
/// #   async fn ping(_: Arc<()>, _: String, _: String) -> Result<(), Error> { Ok(()) }
///     idem_ops::feed_report!(
///         target: "deaf_store",
///         replacing: "the change feed's listener failed: connecting again",
///         ping_not_sent: "the change feed's ping could not be sent",
///     );
/// }
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! feed_report {
    (target: $target:literal, replacing: $replacing:literal, ping_not_sent: $ping:literal $(,)?) => {
        fn report(&self, event: $crate::feed::FeedEvent<'_>) {
            match event {
                $crate::feed::FeedEvent::Replacing {
                    channel,
                    why,
                    retry_in,
                } => $crate::__tracing::warn!(
                    target: $target,
                    channel = %channel,
                    why = %why,
                    retry_in = ?retry_in,
                    $replacing
                ),
                $crate::feed::FeedEvent::PingNotSent { error } => {
                    $crate::__tracing::debug!(target: $target, %error, $ping)
                }
                _ => {}
            }
        }
    };
}

/// One store's change feed in this process: a loop that follows the store's channel through
/// a [`Listen`] until the engines are gone, replacing the listener whenever it fails or goes
/// silent (see [`Listen`] for an example).
pub struct Feed<L: Listen> {
    listen: L,
    /// The store, for the pings; the feed ends when it is gone.
    store: Weak<L::Store>,
    channel: String,
    /// The channel of this feed's own pings.
    pings: String,
    ping_every: Duration,
    ping_within: Duration,
    changes: Changes,
}

impl<L: Listen> std::fmt::Debug for Feed<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feed")
            .field("channel", &self.channel)
            .field("pings", &self.pings)
            .field("ping_every", &self.ping_every)
            .field("ping_within", &self.ping_within)
            .finish_non_exhaustive()
    }
}

/// Why a listener's session ended.
enum End {
    /// The engines are gone: the feed stops.
    Closed,
    /// The listener failed; `healthy` if a ping had arrived on it.
    Lost { healthy: bool, why: String },
}

impl<L: Listen> Feed<L> {
    /// The feed of `store`, through `listen`, on `settings`' channel and pings, delivering to
    /// `changes`; it ends once `store` is gone, or every engine. Its pings travel on
    /// `ping_prefix` followed by 16 random hex digits, a channel only this feed follows.
    pub fn new(
        listen: L,
        store: Weak<L::Store>,
        settings: &FeedSettings,
        ping_prefix: &str,
        changes: Changes,
    ) -> Self {
        let nonce = FencingToken::generate().to_string();
        Self {
            listen,
            store,
            channel: settings.channel.clone(),
            pings: format!("{ping_prefix}{}", &nonce[..16]),
            ping_every: settings.ping_every,
            ping_within: settings.ping_within,
            changes,
        }
    }

    /// The channel of this feed's pings.
    pub fn pings(&self) -> &str {
        &self.pings
    }

    /// Runs the feed on a task of the current Tokio runtime; false (and nothing runs) outside
    /// one. What [`Store::watch`](idem_core::Store::watch) returns.
    pub fn spawn(self) -> bool {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        drop(runtime.spawn(self.run()));
        true
    }

    /// Follows the channel until the engines are gone, replacing the listener whenever it
    /// fails.
    pub async fn run(mut self) {
        let mut backoff = Backoff::new();
        loop {
            if self.closed() {
                return;
            }
            let channels = [self.channel.as_str(), self.pings.as_str()];
            let end = match self.listen.connect(channels).await {
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
            self.listen.report(FeedEvent::Replacing {
                channel: &self.channel,
                why: &why,
                retry_in: delay,
            });
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

    /// Sends one ping through the store, within the ping deadline; `None` if the store is gone.
    fn ping(&self, payload: &str) -> Option<Sending> {
        let store = self.store.upgrade()?;
        let sent = L::ping(store, self.pings.clone(), payload.to_owned());
        let within = self.ping_within;
        Some(Box::pin(async move {
            match tokio::time::timeout(within, sent).await {
                Ok(sent) => sent.map_err(PingError::Store),
                Err(_) => Err(PingError::Late),
            }
        }))
    }

    /// Delivers what arrives on `listener` and pings it, until it fails or the engines are gone.
    async fn follow(&self, listener: &mut L::Listener) -> End {
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
                seq += 1;
                let payload = seq.to_string();
                let Some(ping) = self.ping(&payload) else {
                    return End::Closed;
                };
                sending = Some(ping);
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
                received = self.listen.receive(listener) => match received {
                    Ok(Some(message)) if message.channel == self.pings => {
                        if awaiting.as_deref().map(str::as_bytes) == Some(message.payload.as_slice()) {
                            awaiting = None;
                            arrive_by = None;
                            healthy = true;
                        }
                    }
                    Ok(Some(message)) => deliver(&self.changes, &message.payload),
                    Ok(None) => {
                        return End::Lost { healthy, why: "the connection was lost".to_owned() }
                    }
                    Err(why) => return End::Lost { healthy, why },
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
                            self.listen.report(FeedEvent::PingNotSent { error: &error.to_string() });
                            awaiting = None;
                        }
                    }
                }
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

/// Hands one announcement to the waiters.
fn deliver(changes: &Changes, payload: &[u8]) {
    let digest = std::str::from_utf8(payload).ok().and_then(digest_from_hex);
    match digest {
        Some(digest) => changes.changed(&digest),
        // Not a digest: wake everyone rather than miss one.
        None => changes.missed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tokio::sync::mpsc;

    /// A store whose announcements and pings travel on an in-memory channel.
    struct Loopback {
        inbox: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Received>>>,
        connects: Arc<Mutex<usize>>,
    }

    impl Listen for Loopback {
        type Listener = ();
        type Store = mpsc::UnboundedSender<Received>;
        async fn connect(&mut self, _channels: [&str; 2]) -> Result<(), String> {
            *self.connects.lock().expect("the count") += 1;
            Ok(())
        }
        async fn receive(&self, _listener: &mut ()) -> Result<Option<Received>, String> {
            Ok(self.inbox.lock().await.recv().await)
        }
        async fn ping(
            sent: Arc<Self::Store>,
            channel: String,
            payload: String,
        ) -> Result<(), Error> {
            let payload = payload.into_bytes();
            sent.send(Received { channel, payload })
                .map_err(|_| Error::invalid(Field::Config, "closed"))
        }
        fn report(&self, _event: FeedEvent<'_>) {}
    }

    #[tokio::test]
    async fn c13_the_feed_connects_and_stops_once_its_engines_are_gone() {
        // Waking waiters by announcement is the change-feed conformance scenarios' (run by
        // the PostgreSQL and Redis stores); here, the loop's own life.
        let (sent, inbox) = mpsc::unbounded_channel();
        let sent = Arc::new(sent);
        let connects = Arc::new(Mutex::new(0));
        let listen = Loopback {
            inbox: Arc::new(tokio::sync::Mutex::new(inbox)),
            connects: Arc::clone(&connects),
        };
        let feed = Feed::new(
            listen,
            Arc::downgrade(&sent),
            &FeedSettings::new("changes"),
            "changes_ping_",
            Changes::closed(),
        );
        sent.send(Received {
            channel: "changes".to_owned(),
            payload: idem_core::store::digest_to_hex(&[3; 32]).into_bytes(),
        })
        .expect("the loopback");
        tokio::time::timeout(Duration::from_secs(2), feed.run())
            .await
            .expect("the feed stops once its engines are gone");
        assert!(*connects.lock().expect("the count") <= 1);
    }
}
