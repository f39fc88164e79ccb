//! A small pool of threads, each owning one SQLite connection: every rusqlite call of the store
//! runs there, off the async executor, in one hop per operation.

use idem_core::Error;
use rusqlite::Connection;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// The worker threads and the queue that feeds them. Dropping the pool closes the queue; each
/// worker finishes its job, closes its connection and exits.
#[derive(Debug)]
pub(crate) struct Pool {
    jobs: mpsc::Sender<Job>,
}

impl Pool {
    /// Starts one worker per connection.
    pub(crate) fn start(connections: Vec<Connection>) -> Result<Self, Error> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for (i, mut connection) in connections.into_iter().enumerate() {
            let queue = Arc::clone(&queue);
            thread::Builder::new()
                .name(format!("idem-sqlite-{i}"))
                .spawn(move || loop {
                    let job = match queue.lock() {
                        Ok(receiver) => receiver.recv(),
                        Err(_) => return,
                    };
                    match job {
                        Ok(job) => job(&mut connection),
                        Err(_) => return,
                    }
                })
                .map_err(Error::unavailable)?;
        }
        Ok(Self { jobs })
    }

    /// Runs `work` on a pooled connection and waits for it without blocking the executor.
    /// A panic in `work` is carried back and resumed in the caller; the connection's open
    /// transaction, if any, rolls back as the panic unwinds through it.
    pub(crate) async fn call<T, F>(&self, work: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Connection) -> T + Send + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |connection| {
            let _ = reply.send(catch_unwind(AssertUnwindSafe(|| work(connection))));
        });
        self.jobs
            .send(job)
            .map_err(|_| Error::unavailable("the SQLite worker threads have stopped"))?;
        match answer.await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(panic)) => resume_unwind(panic),
            Err(_) => Err(Error::unavailable(
                "a SQLite worker thread stopped mid-call",
            )),
        }
    }
}
