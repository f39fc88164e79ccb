//! Whether an effect ended its transaction itself, with a COMMIT or a ROLLBACK.
//!
//! The effect gets the transaction to write in, and nothing stops it from running `COMMIT`
//! through it. Its writes are then committed without their completion (and, with one commit,
//! with the reservation), and the store must not answer as if they had rolled back: the key
//! would be given back and the retry would run the effect again. SQLite's own rollbacks (an
//! `ON CONFLICT ROLLBACK` constraint, `RAISE(ROLLBACK)`, an I/O error) leave the connection in
//! autocommit too, so a commit hook tells the two apart.
//!
//! A `ROLLBACK` then a `BEGIN` (a helper's reset) leaves the connection in a transaction again,
//! one without the effect's earlier writes: a completion written there would commit alone, or
//! with what the effect wrote after its `BEGIN`. A rollback hook sees it: SQLite calls it when
//! a whole transaction ends (a `ROLLBACK`, or one SQLite makes on an error), never for
//! `ROLLBACK TO` a savepoint nor a failed statement's own undo.
//!
//! The hooks are set only around the store's transaction ([`watching`]): rusqlite keeps a
//! hook's closure in SQLite's client data, which `sqlite3_close` frees before it rolls back a
//! transaction left open, and that rollback would then call a freed rollback hook.

use rusqlite::Connection;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// How the transactions of one connection ended while [`watching`] it.
#[derive(Debug, Default)]
pub(crate) struct CommitWatch {
    committed: Arc<AtomicBool>,
    rolled_back: Arc<AtomicBool>,
}

impl CommitWatch {
    /// Whether a transaction of the connection committed since the watch began.
    pub(crate) fn committed(&self) -> bool {
        self.committed.load(Ordering::Acquire)
    }

    /// Whether a transaction of the connection was rolled back as a whole since the watch
    /// began.
    pub(crate) fn rolled_back(&self) -> bool {
        self.rolled_back.load(Ordering::Acquire)
    }
}

/// `work` on `conn` with its commits and rollbacks watched; the hooks are removed when `work`
/// ends, a panic included (which then resumes), before anything can close the connection.
pub(crate) fn watching<T>(
    conn: &mut Connection,
    work: impl FnOnce(&mut Connection, &CommitWatch) -> T,
) -> T {
    let watch = CommitWatch::default();
    let (committed, rolled_back) = (Arc::clone(&watch.committed), Arc::clone(&watch.rolled_back));
    // A hook that cannot be set leaves every end read as before: a commit unseen is taken for
    // a rollback, a rollback unseen is left to the autocommit check.
    let _ = conn.commit_hook(Some(move || {
        committed.store(true, Ordering::Release);
        false
    }));
    let _ = conn.rollback_hook(Some(move || rolled_back.store(true, Ordering::Release)));
    let worked = catch_unwind(AssertUnwindSafe(|| work(conn, &watch)));
    // Unregistered in SQLite before the closure is freed, even if the removal reports an error.
    let _ = conn.rollback_hook(None::<fn()>);
    let _ = conn.commit_hook(None::<fn() -> bool>);
    worked.unwrap_or_else(|panic| resume_unwind(panic))
}

#[cfg(test)]
mod tests {
    use super::watching;
    use rusqlite::Connection;

    /// (committed, rolled back) for `batch`, the connection closed afterwards as it is left.
    fn watched(batch: &str) -> (bool, bool) {
        let mut conn = Connection::open_in_memory().expect("open");
        conn.execute_batch("CREATE TABLE t (v INTEGER PRIMARY KEY)")
            .expect("table");
        watching(&mut conn, |conn, watch| {
            let _ = conn.execute_batch(batch);
            (watch.committed(), watch.rolled_back())
        })
    }

    #[test]
    fn a_rollback_of_the_transaction_is_seen_and_nothing_less() {
        assert_eq!(
            watched("BEGIN; INSERT INTO t VALUES (1); COMMIT"),
            (true, false)
        );
        assert_eq!(
            watched("BEGIN; INSERT INTO t VALUES (1); ROLLBACK"),
            (false, true)
        );
        assert_eq!(watched("BEGIN; ROLLBACK; BEGIN IMMEDIATE"), (false, true));
        let twice =
            "BEGIN; INSERT OR ROLLBACK INTO t VALUES (1); INSERT OR ROLLBACK INTO t VALUES (1)";
        assert_eq!(watched(twice), (false, true));
        // A savepoint undone, or a failed statement's own undo, ends no transaction.
        let savepoint = "BEGIN; SAVEPOINT s; INSERT INTO t VALUES (1); ROLLBACK TO s; RELEASE s";
        assert_eq!(watched(savepoint), (false, false));
        let failed = "BEGIN; INSERT INTO t VALUES (1); INSERT INTO t VALUES (1)";
        assert_eq!(watched(failed), (false, false));
    }

    #[test]
    fn no_hook_outlives_the_watch() {
        let mut conn = Connection::open_in_memory().expect("open");
        let rolled_back = watching(&mut conn, |conn, watch| {
            conn.execute_batch("BEGIN").expect("begin");
            watch.rolled_back()
        });
        assert!(!rolled_back);
        // Closed inside a transaction: a hook left set would be called once freed.
        drop(conn);
    }
}
