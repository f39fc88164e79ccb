//! How long the server may keep the store waiting: the deadlines the store sets on every
//! statement and transaction it runs, below the engine's bound on each store call
//! (`Policy::store_timeout`, C13), so that the server itself ends what would hang.

use std::time::Duration;

/// The server-side deadlines of a store; see the builder's
/// [`statement_timeout`](crate::PgStoreBuilder::statement_timeout),
/// [`lock_timeout`](crate::PgStoreBuilder::lock_timeout) and
/// [`idle_in_transaction_timeout`](crate::PgStoreBuilder::idle_in_transaction_timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deadlines {
    /// The longest one of the store's statements runs (`statement_timeout`).
    pub(crate) statement: Duration,
    /// The longest a completion or a release waits for the record's row (`lock_timeout`); a
    /// renewal waits a quarter of it.
    pub(crate) lock: Duration,
    /// The longest the effect's transaction may sit idle between statements
    /// (`idle_in_transaction_session_timeout`): past it the server ends the session, and with
    /// it a transaction whose client is gone.
    pub(crate) idle_in_transaction: Duration,
    /// The longest the effect of `run_in_transaction` may run before its completion, measured
    /// by the process: past it the transaction is abandoned (no COMMIT was sent) and its
    /// connection closed.
    pub(crate) transaction: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Self {
            statement: Duration::from_secs(4),
            lock: Duration::from_secs(3),
            idle_in_transaction: Duration::from_secs(30),
            transaction: Duration::from_secs(30),
        }
    }
}

impl Deadlines {
    /// `statement_timeout` in milliseconds, as PostgreSQL reads it (at least 1: 0 would mean
    /// no deadline).
    pub(crate) fn statement_ms(&self) -> i64 {
        millis(self.statement)
    }

    /// `lock_timeout` for a completion or a release, in milliseconds.
    pub(crate) fn lock_ms(&self) -> i64 {
        millis(self.lock)
    }

    /// `lock_timeout` for a renewal, in milliseconds: a quarter of the lock deadline. A renewal
    /// that cannot take its row soon gives up for this beat; the heartbeat tries again at the
    /// next one.
    pub(crate) fn renew_lock_ms(&self) -> i64 {
        millis(self.lock / 4)
    }

    /// `idle_in_transaction_session_timeout` for the effect's transaction, in milliseconds.
    pub(crate) fn idle_in_transaction_ms(&self) -> i64 {
        millis(self.idle_in_transaction)
    }
}

/// Whole milliseconds, at least 1, at most PostgreSQL's largest timeout (`i32::MAX` ms).
fn millis(duration: Duration) -> i64 {
    idem_core::store::duration_millis(duration).clamp(1, i64::from(i32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c13_deadlines_are_never_zero_nor_beyond_postgres() {
        let tiny = Deadlines {
            statement: Duration::ZERO,
            lock: Duration::from_micros(10),
            idle_in_transaction: Duration::from_secs(u64::MAX),
            transaction: Duration::ZERO,
        };
        assert_eq!(tiny.statement_ms(), 1, "0 would switch the deadline off");
        assert_eq!(tiny.lock_ms(), 1);
        assert_eq!(tiny.renew_lock_ms(), 1);
        assert_eq!(tiny.idle_in_transaction_ms(), i64::from(i32::MAX));
        let defaults = Deadlines::default();
        assert!(
            defaults.statement < Duration::from_secs(5),
            "below the engine's bound"
        );
        assert!(defaults.lock < defaults.statement);
        // An effect that pauses between statements (a provider's call) is cut off by the
        // process's transaction deadline first, which keeps its key (outcome unknown), never by
        // the server's idle deadline, whose broken connection would release it.
        assert!(defaults.idle_in_transaction >= defaults.transaction);
    }
}
