//! Whether an effect ended its transaction itself with a COMMIT.
//!
//! The effect gets the transaction to write in, and nothing stops it from running `COMMIT`
//! through it. Its writes are then committed without their completion (and, with one commit,
//! with the reservation), and the store must not answer as if they had rolled back: the key
//! would be given back and the retry would run the effect again. SQLite's own rollbacks (an
//! `ON CONFLICT ROLLBACK` constraint, `RAISE(ROLLBACK)`, an I/O error) leave the connection in
//! autocommit too, so a commit hook tells the two apart.

use rusqlite::Connection;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The commits of one connection from [`start`](Self::start) on.
#[derive(Debug)]
pub(crate) struct CommitWatch(Arc<AtomicBool>);

impl CommitWatch {
    /// Watches `conn`'s commits from now on, in place of the watch before (a hook left from an
    /// earlier transaction only flags a watch nobody reads).
    pub(crate) fn start(conn: &mut Connection) -> Self {
        let flag = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&flag);
        // A hook that cannot be set leaves every end read as before: a rollback.
        let _ = conn.commit_hook(Some(move || {
            seen.store(true, Ordering::Release);
            false
        }));
        Self(flag)
    }

    /// Whether a transaction of the connection committed since [`start`](Self::start).
    pub(crate) fn committed(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}
