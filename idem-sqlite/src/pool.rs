//! The store's connections: one writer behind an async queue, and readers of their own.
//!
//! SQLite has one writer at a time. Several connections writing at once spend their time in
//! SQLite's sleeping busy handler; one writer connection, whose callers queue asynchronously
//! (never holding a thread while they wait), writes back to back. Readers have connections of
//! their own that no writer ever holds, so an answer that writes nothing (a replay, an in-flight
//! duplicate, a mismatch) never waits for a writer (C5).
//!
//! Every call runs on Tokio's blocking pool (one hop, never on the async executor) and runs to
//! its end even if the caller's future is dropped. After every call a connection left inside a
//! transaction is rolled back, or replaced when that fails, so no caller ever sees another's
//! uncommitted writes. Readers are a stack (the connection returned last serves next, its page
//! cache warm).

use crate::config::SqliteConfig;
use crate::connection::{clean, connect};
use idem_core::{Error, StoreErrorKind};
use rusqlite::Connection;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard, Semaphore};

/// A connection slot: `None` after a connection had to be dropped; the next use reopens it.
type Slot = Option<Connection>;

#[derive(Debug)]
pub(crate) struct Pool {
    writer: Arc<AsyncMutex<Slot>>,
    readers: Arc<Mutex<Vec<Slot>>>,
    reader_permits: Arc<Semaphore>,
    config: Arc<SqliteConfig>,
}

/// The writer, held: `work` runs on it, on the blocking pool.
pub(crate) struct Writer(OwnedMutexGuard<Slot>);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Only pushes and pops run under the lock: a poisoned stack is still consistent.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn hop_failed(e: tokio::task::JoinError) -> Error {
    Error::store(
        crate::error::BACKEND,
        StoreErrorKind::Unavailable,
        format!("SQLite call did not finish: {e}"),
    )
}

/// Runs `work` on the connection in `slot` (opening one if the slot is empty), then cleans the
/// connection; a panic in `work` is returned as `Err` after the cleaning.
fn run_on<T>(
    slot: &mut Slot,
    config: &SqliteConfig,
    work: impl FnOnce(&mut Connection) -> T,
) -> Result<std::thread::Result<T>, Error> {
    let mut conn = match slot.take() {
        Some(conn) => conn,
        None => connect(config)?,
    };
    let result = catch_unwind(AssertUnwindSafe(|| work(&mut conn)));
    *slot = clean(conn);
    Ok(result)
}

fn resume<T>(result: Result<std::thread::Result<T>, Error>) -> Result<T, Error> {
    match result? {
        Ok(value) => Ok(value),
        Err(panic) => resume_unwind(panic),
    }
}

impl Pool {
    pub(crate) fn new(
        writer: Connection,
        readers: Vec<Connection>,
        config: Arc<SqliteConfig>,
    ) -> Self {
        Self {
            writer: Arc::new(AsyncMutex::new(Some(writer))),
            reader_permits: Arc::new(Semaphore::new(readers.len())),
            readers: Arc::new(Mutex::new(readers.into_iter().map(Some).collect())),
            config,
        }
    }

    /// The writer if no one holds it now, without waiting.
    pub(crate) fn try_writer(&self) -> Option<Writer> {
        Arc::clone(&self.writer).try_lock_owned().ok().map(Writer)
    }

    /// The writer, after the callers queued before this one.
    pub(crate) async fn writer(&self) -> Writer {
        Writer(Arc::clone(&self.writer).lock_owned().await)
    }

    /// Runs `work` on the held writer, on the blocking pool.
    pub(crate) async fn write<T, F>(&self, writer: Writer, work: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Connection) -> T + Send + 'static,
        T: Send + 'static,
    {
        let config = Arc::clone(&self.config);
        let joined = tokio::task::spawn_blocking(move || {
            let mut guard = writer.0;
            run_on(&mut guard, &config, work)
        })
        .await
        .map_err(hop_failed)?;
        resume(joined)
    }

    /// Runs `work` on a reader connection (waiting for a free one), on the blocking pool.
    pub(crate) async fn read<T, F>(&self, work: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Connection) -> T + Send + 'static,
        T: Send + 'static,
    {
        let permit = Arc::clone(&self.reader_permits)
            .acquire_owned()
            .await
            .map_err(|_| {
                Error::store(
                    crate::error::BACKEND,
                    StoreErrorKind::Unavailable,
                    "the SQLite pool is closed",
                )
            })?;
        let (readers, config) = (Arc::clone(&self.readers), Arc::clone(&self.config));
        let joined = tokio::task::spawn_blocking(move || {
            let mut slot = lock(&readers).pop().flatten();
            let result = run_on(&mut slot, &config, work);
            lock(&readers).push(slot);
            drop(permit);
            result
        })
        .await
        .map_err(hop_failed)?;
        resume(joined)
    }
}
