//! The change feed's PostgreSQL mechanics (C5, C13): a `LISTEN` on a session of its own, and
//! pings sent by `pg_notify` through the store's connections. The supervision (pings every
//! interval, the ping deadline, reconnection with back-off, [`Changes::missed`] after every
//! (re)connection, the end once the engines are gone) is the core's
//! [`Feed`](idem_ops::feed::Feed).
//!
//! - **Its own connection.** The listener is one session of its own, outside the store's
//!   connections and pool (none is held while duplicates wait), opened with the listener's
//!   connect options (the store's unless the builder was given others: LISTEN needs a session
//!   of its own, so behind a pooler in transaction mode the listener must reach the server
//!   directly), or the store's current host when it follows a failover.
//! - **Pings** are `pg_notify` on the store's own connections, as announcements travel, to
//!   `<channel>_<16 random hex digits>`, a channel only this listener follows.
//! - Each replacement is a warn log on target `idem_postgres`.

use super::{Inner, PgStore};
use crate::feed_settings::ListenerOptions;
use idem_core::store::Changes;
use idem_core::Error;
use idem_ops::feed::{Feed, Listen, Received};
use sqlx::postgres::{PgListener, PgPoolOptions};
use std::sync::Arc;
use std::time::Duration;

/// The feed of the store `inner`, delivering to `changes`.
pub(crate) fn feed(inner: &Arc<Inner>, changes: Changes) -> Feed<PgListen> {
    let listen = PgListen {
        listener: inner.listener.clone(),
        connect_within: inner.connect_within,
    };
    let pings = format!("{}_", inner.feed.channel);
    Feed::new(listen, Arc::downgrade(inner), &inner.feed, &pings, changes)
}

impl PgStore {
    /// A session of its own following `channels`, opened where the store's change feed
    /// listens: the store's host (the current primary when it follows a failover), or where
    /// [`listener_url`](crate::PgStoreBuilder::listener_url) says (behind a pooler in
    /// transaction mode, the server itself: a `LISTEN` through the pooler would stay on a
    /// server connection other clients get). For crates that follow channels of their own
    /// beside the store (the outbox). It never reconnects: `try_recv` answering `None` means
    /// its connection was lost, and a new one is opened by calling this again. Bounded by the
    /// store's acquire timeout.
    ///
    /// ```no_run
    /// # async fn example(store: idem_postgres::PgStore) -> Result<(), idem_core::Error> {
    /// let mut listener = store.listener(&["orders"]).await?;
    /// while let Ok(Some(notification)) = listener.try_recv().await {
    ///     println!("{}", notification.payload());
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn listener(&self, channels: &[&str]) -> Result<PgListener, Error> {
        open_listener(&self.inner.listener, self.inner.connect_within, channels)
            .await
            .map_err(|error| {
                Error::store(
                    crate::error::BACKEND,
                    idem_core::StoreErrorKind::Unavailable,
                    error,
                )
            })
    }
}

/// A listener of `channels` where `listener` says, within `within`.
///
/// Each listener has a pool of its own (one connection, no lifetime or idle limit): a listener
/// dropped while its connection is frozen gives the connection back to its pool from a task
/// sqlx spawns, which waits as long as the network does; the next listener does not depend on
/// it.
async fn open_listener(
    listener: &ListenerOptions,
    within: Duration,
    channels: &[&str],
) -> Result<PgListener, String> {
    let open = async {
        let options = listener.find(within).await;
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .max_lifetime(None)
            .idle_timeout(None)
            .test_before_acquire(false)
            .acquire_timeout(within)
            .connect_lazy_with(options);
        let mut listener = PgListener::connect_with(&pool).await?;
        listener.ignore_pool_close_event(true);
        // A lost connection ends `try_recv` with `None`: the caller replaces the listener
        // itself (the feed with its back-off and a `missed` after it).
        listener.eager_reconnect(false);
        listener.listen_all(channels.iter().copied()).await?;
        Ok::<_, sqlx::Error>(listener)
    };
    match tokio::time::timeout(within, open).await {
        Ok(Ok(listener)) => Ok(listener),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no listener within {within:?}")),
    }
}

/// How one store's feed listens and pings.
pub(crate) struct PgListen {
    listener: ListenerOptions,
    /// How long opening the listener (connection and LISTEN) may take.
    connect_within: Duration,
}

impl Listen for PgListen {
    type Listener = PgListener;
    type Store = Inner;

    /// A new listener on a session of its own, following the channel and the pings.
    async fn connect(&mut self, channels: [&str; 2]) -> Result<PgListener, String> {
        open_listener(&self.listener, self.connect_within, &channels).await
    }

    async fn receive(&self, listener: &mut PgListener) -> Result<Option<Received>, String> {
        match listener.try_recv().await {
            Ok(notification) => Ok(notification.map(|notification| Received {
                channel: notification.channel().to_owned(),
                payload: notification.payload().as_bytes().to_vec(),
            })),
            Err(error) => Err(error.to_string()),
        }
    }

    /// `pg_notify` on one of the store's own connections.
    async fn ping(inner: Arc<Inner>, channel: String, payload: String) -> Result<(), Error> {
        PgStore { inner }.notify(&channel, &payload).await
    }

    idem_ops::feed_report!(
        target: "idem_postgres",
        replacing: "the change feed's listener failed: connecting again",
        ping_not_sent: "the change feed's ping could not be sent",
    );
}
