//! The store's connections, and the one hop that takes a rusqlite call off the async executor.
//!
//! A call waits (asynchronously) for a free connection, then runs on Tokio's blocking thread
//! pool with the connection that was returned last (a stack): under light load one connection
//! serves call after call and its page cache stays warm, where a round robin over connections
//! would make each write start on a cache that another connection's write invalidated.

use idem_core::Error;
use rusqlite::Connection;
use std::panic::resume_unwind;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Semaphore;

/// The connections, and one permit per connection.
#[derive(Debug)]
pub(crate) struct Pool {
    idle: Arc<Mutex<Vec<Connection>>>,
    permits: Arc<Semaphore>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing runs under the lock but a push or a pop, so a poisoned lock still guards a
    // consistent stack.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Pool {
    pub(crate) fn new(connections: Vec<Connection>) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(connections.len())),
            idle: Arc::new(Mutex::new(connections)),
        }
    }

    /// Runs `work` on a pooled connection, on Tokio's blocking pool, and waits for it without
    /// blocking the executor. A panic in `work` is resumed in the caller; the connection's open
    /// transaction, if any, rolls back as the panic unwinds, and the connection goes back to the
    /// pool. Must be called within a Tokio runtime.
    pub(crate) async fn call<T, F>(&self, work: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Connection) -> T + Send + 'static,
        T: Send + 'static,
    {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| Error::unavailable("the SQLite pool is closed"))?;
        let idle = Arc::clone(&self.idle);
        let joined = tokio::task::spawn_blocking(move || {
            let mut connection = lock(&idle)
                .pop()
                .ok_or_else(|| Error::unavailable("no SQLite connection free under a permit"))?;
            let result =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&mut connection)));
            lock(&idle).push(connection);
            drop(permit);
            Ok(result)
        })
        .await
        .map_err(|e| Error::unavailable(format!("SQLite call did not finish: {e}")))?;
        match joined? {
            Ok(value) => Ok(value),
            Err(panic) => resume_unwind(panic),
        }
    }
}
