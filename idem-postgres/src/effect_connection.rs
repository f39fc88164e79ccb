//! The connection that carries one effect's transaction (`run_in_transaction`).
//!
//! - On a store that opened its own connections ([`PgStoreBuilder::connect`](
//!   crate::PgStoreBuilder::connect)): one of the store's connections for transactions, taken
//!   and given back without a round trip (sqlx's pool pings a connection given back to it: a
//!   message more per fresh key).
//! - On a store built over the application's pool ([`PgStoreBuilder::pool`](
//!   crate::PgStoreBuilder::pool)): a connection of that pool, so that the effect runs in the
//!   session the application set its connections up for (a role, a `search_path`, a tenant
//!   setting for row-level security, in its `after_connect`), at the cost of that ping.
//!
//! Either goes back at once only when its transaction ended cleanly: committed, or rolled back
//! with the server's answer. Anything else never holds its slot (C13):
//! - once the effect has returned (or before it ran), a step of the store's cut off by the
//!   engine's deadline (`BEGIN`, the completion, `COMMIT`, `ROLLBACK`) or a broken link: one of
//!   the store's own settles in the background, its permit given back at once (its
//!   transaction rolled back, it returns to the stack within its host's share of the acquire
//!   timeout once a round trip finds it outside any transaction, else it closes:
//!   `crate::connections`);
//! - an effect that panicked, was abandoned past the transaction timeout, or was dropped while
//!   it ran (a guard-form caller gone): closed, since its session may hold what no rollback
//!   undoes (an advisory lock it would have released at its end);
//! - one of the application's pool closes either way (sqlx would wait for the answer to its
//!   ping without a deadline).

use crate::connections::Held;
use idem_core::Error;
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, Postgres};
use std::future::Future;
use std::pin::Pin;

/// A connection for an execution's transaction, on its way.
pub(crate) type Acquiring<'a> =
    Pin<Box<dyn Future<Output = Result<EffectConnection<'a>, Error>> + Send + 'a>>;

/// A connection that is closed on drop unless [`kept`](Self::keep): one of the store's own, or
/// one of the application's pool.
pub(crate) struct EffectConnection<'s> {
    own: Option<Held<'s>>,
    pool: Option<PoolConnection<Postgres>>,
}

impl<'s> EffectConnection<'s> {
    /// One of the store's own connections for transactions: dropped, it closes
    /// ([`settle`](Self::settle) says otherwise).
    pub(crate) fn own(mut held: Held<'s>) -> Self {
        held.session_changed();
        Self {
            own: Some(held),
            pool: None,
        }
    }

    /// A connection of the application's pool.
    pub(crate) fn pool(conn: PoolConnection<Postgres>) -> Self {
        Self {
            own: None,
            pool: Some(conn),
        }
    }

    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        match (&mut self.own, &mut self.pool) {
            (Some(held), _) => held.conn(),
            // One of the two is `Some` until `keep` consumes the guard.
            (None, pool) => pool.as_mut().expect("an effect connection"),
        }
    }

    /// Gives the connection back: its transaction ended cleanly.
    pub(crate) fn keep(mut self) {
        if let Some(held) = self.own.take() {
            held.give_back();
        }
        // Dropped, a pool connection goes back to its pool.
        drop(self.pool.take());
    }
}

impl EffectConnection<'_> {
    /// Closes the connection on purpose: what ran on it failed with the server's own answer,
    /// so its server is not suspect.
    pub(crate) fn close(mut self) {
        if let Some(held) = self.own.take() {
            held.close();
        }
    }

    /// Gives up a connection whose transaction did not end cleanly once the effect had
    /// returned, or before it ran: one of the store's own settles (`crate::connections`), its
    /// host suspect; one of the pool closes.
    pub(crate) fn settle(mut self) {
        if let Some(held) = self.own.take() {
            held.settle();
        }
    }
}

impl Drop for EffectConnection<'_> {
    fn drop(&mut self) {
        // A connection of the store's own (`self.own`), dropped, closes, its host then suspect
        // (`crate::connections`).
        if let Some(conn) = self.pool.take() {
            // Closing the socket without a word: the server rolls back whatever was open.
            drop(conn.detach());
        }
    }
}
