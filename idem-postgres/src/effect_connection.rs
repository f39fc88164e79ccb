//! The pool connection that carries one effect's transaction (`run_in_transaction`).
//!
//! It goes back to the pool only once its transaction ended cleanly: committed, or rolled
//! back with the server's answer. Anything else (a statement cut off by the engine's deadline,
//! a broken link, a COMMIT in doubt, a panic, the execution dropped) detaches it from the pool
//! and closes it. sqlx pings a connection given back to its pool and waits for the answer
//! without a deadline: a connection cut off mid-statement behind a dead link, or behind a row
//! lock the server waits on, would hold its slot forever and the pool would run dry (C13).
//! Detached, its slot is free at once and the pool opens a new connection when one is needed.

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, Postgres};

/// A pool connection that is closed on drop unless [`kept`](Self::keep).
pub(crate) struct EffectConnection {
    conn: Option<PoolConnection<Postgres>>,
}

impl EffectConnection {
    pub(crate) fn new(conn: PoolConnection<Postgres>) -> Self {
        Self { conn: Some(conn) }
    }

    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        // Always `Some` until `keep` consumes the guard.
        self.conn.as_mut().expect("an effect connection")
    }

    /// Gives the connection back to the pool: its transaction ended cleanly.
    pub(crate) fn keep(mut self) {
        drop(self.conn.take());
    }
}

impl Drop for EffectConnection {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // Closing the socket without a word: the server rolls back whatever was open.
            drop(conn.detach());
        }
    }
}
