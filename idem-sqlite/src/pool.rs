//! The store's connections: one writer and its readers, each owned by a thread of its own and
//! fed by a queue ([`Lane`]): one hop per request, on every path, contended or not.
//!
//! SQLite has one writer at a time. Several connections writing at once spend their time in
//! SQLite's sleeping busy handler; one writer connection, whose thread takes the queued writes
//! back to back, writes with no wake-up between two of them. Readers have connections of their
//! own that no writer ever holds, so an answer that writes nothing (a replay, an in-flight
//! duplicate, a mismatch) never waits for a writer (C5).
//!
//! A request that may have to write is decided where its statement runs ([`Decide`]): on the
//! writer at once if it is idle; else on a reader, which answers it there or hands it to the
//! writer's queue itself, so the caller is woken once, with the result.
//!
//! A task whose caller left (its future dropped) before it started is not run; one that
//! started runs to its end. A task that carries a wait (`write_within`, a transaction's
//! `decide`) and has not started when it passes is not run either, and its caller is told so at
//! the deadline; one that started first is waited for to its end ([`Wait`]), so nobody is ever
//! told "not run" about work that ran. After every task a connection left inside a
//! transaction is rolled back, or replaced when that fails, so no caller ever sees another's
//! uncommitted writes.

use crate::config::SqliteConfig;
use crate::connection::{clean, connect};
use crate::lane::{Lane, Slot, Task};
use crate::wait::Wait;
use idem_core::{Error, StoreErrorKind};
use rusqlite::Connection;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// What a task sends back: its work's value or panic, or why it could not run.
type Reply<T> = Result<std::thread::Result<T>, Error>;

/// A request decided where its statement runs: on a reader first when the writer is busy.
pub(crate) trait Decide: Send + Sized + 'static {
    /// What the caller gets.
    type Output: Send + 'static;

    /// On a reader: the answer when nothing must be written, else the request back, for the
    /// writer.
    fn answer(self, conn: &mut Connection) -> Result<Self::Output, Self>;

    /// On the writer: decide again and write.
    fn write(self, conn: &mut Connection) -> Self::Output;
}

#[derive(Debug)]
pub(crate) struct Pool {
    writer: Arc<Lane>,
    readers: Arc<Lane>,
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.writer.close();
        self.readers.close();
    }
}

fn unavailable(message: impl Into<String>) -> Error {
    Error::store(
        crate::error::BACKEND,
        StoreErrorKind::Unavailable,
        message.into(),
    )
}

/// Runs `work` on the connection in `slot` (opening one if the slot is empty), then cleans the
/// connection; a panic in `work` is returned as `Err` after the cleaning.
fn run_on<T>(
    slot: &mut Slot,
    config: &SqliteConfig,
    work: impl FnOnce(&mut Connection) -> T,
) -> Reply<T> {
    let mut conn = match slot.take() {
        Some(conn) => conn,
        None => connect(config)?,
    };
    let result = catch_unwind(AssertUnwindSafe(|| work(&mut conn)));
    *slot = clean(conn);
    Ok(result)
}

/// A task that runs `work` and sends what it gave, unless its caller left, or gave up at the
/// end of its wait, before it started.
fn task<T, F>(work: F, reply: oneshot::Sender<Reply<T>>, wait: Option<Wait>) -> Task
where
    F: FnOnce(&mut Connection) -> T + Send + 'static,
    T: Send + 'static,
{
    Box::new(move |slot, config| {
        if reply.is_closed() {
            return;
        }
        if let Some(wait) = &wait {
            // Past its deadline, whether or not the caller's timer fired yet: not started.
            if wait.passed() {
                if wait.abandon() {
                    let _ = reply.send(Err(busy_past_the_wait()));
                }
                return;
            }
            if !wait.start() {
                return;
            }
        }
        let _ = reply.send(run_on(slot, config, work));
    })
}

fn busy_past_the_wait() -> Error {
    unavailable("the SQLite writer stayed busy past the store timeout")
}

/// Waits for a task's reply; a panic in the work resumes here.
async fn received<T>(reply: oneshot::Receiver<Reply<T>>) -> Result<T, Error> {
    unpacked(reply.await)
}

fn unpacked<T>(reply: Result<Reply<T>, oneshot::error::RecvError>) -> Result<T, Error> {
    match reply {
        Ok(Ok(Ok(value))) => Ok(value),
        Ok(Ok(Err(panic))) => resume_unwind(panic),
        Ok(Err(error)) => Err(error),
        Err(_) => Err(unavailable("the SQLite store was closed")),
    }
}

/// [`received`], giving up at the end of `wait` if the task has not started by then (one that
/// started is waited for to its end). Without a Tokio time driver, the task itself refuses to
/// start late.
async fn received_within<T>(
    mut reply: oneshot::Receiver<Reply<T>>,
    wait: Option<Wait>,
) -> Result<T, Error> {
    let Some(wait) = wait else {
        return received(reply).await;
    };
    let deadline = tokio::time::Instant::from_std(wait.until());
    let Ok(timer) = catch_unwind(|| tokio::time::sleep_until(deadline)) else {
        return received(reply).await;
    };
    tokio::select! {
        biased;
        result = &mut reply => return unpacked(result),
        () = timer => {}
    }
    if wait.abandon() {
        return Err(busy_past_the_wait());
    }
    received(reply).await
}

impl Pool {
    pub(crate) fn new(
        writer: Connection,
        readers: Vec<Connection>,
        config: Arc<SqliteConfig>,
    ) -> Result<Self, Error> {
        let start = |name: &str, conns: Vec<Connection>| {
            Lane::start(name, conns, Arc::clone(&config))
                .map_err(|e| unavailable(format!("cannot start a SQLite thread: {e}")))
        };
        let writer = start("idem-sqlite-writer", vec![writer])?;
        let readers = match start("idem-sqlite-reader", readers) {
            Ok(readers) => readers,
            Err(error) => {
                writer.close();
                return Err(error);
            }
        };
        Ok(Self { writer, readers })
    }

    /// Runs `work` on the writer, after the writes queued before it.
    pub(crate) async fn write<T, F>(&self, work: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Connection) -> T + Send + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        self.writer.push(task(work, reply, None));
        received(answer).await
    }

    /// [`write`](Self::write), not run (an unavailable store error) if it has not started
    /// within `wait`.
    pub(crate) async fn write_within<T, F>(&self, wait: Duration, work: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Connection) -> T + Send + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let wait = Wait::new(wait);
        self.writer.push(task(work, reply, wait.clone()));
        received_within(answer, wait).await
    }

    /// Runs `work` on a reader.
    pub(crate) async fn read<T, F>(&self, work: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Connection) -> T + Send + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        self.readers.push(task(work, reply, None));
        received(answer).await
    }

    /// Decides `request` where its statement runs: on the writer at once if it is idle; else
    /// on a reader, which answers it or queues it for the writer (not run there if it has not
    /// started within `wait`, when one is given).
    pub(crate) async fn decide<D: Decide>(
        &self,
        request: D,
        wait: Option<Duration>,
    ) -> Result<D::Output, Error> {
        let (reply, answer) = oneshot::channel();
        let wait = wait.and_then(Wait::new);
        self.dispatch(request, reply, wait.clone());
        received_within(answer, wait).await
    }

    fn dispatch<D: Decide>(
        &self,
        request: D,
        reply: oneshot::Sender<Reply<D::Output>>,
        wait: Option<Wait>,
    ) {
        if let Some(idle) = self.writer.idle() {
            return idle.push(task(move |conn| request.write(conn), reply, wait));
        }
        let writer = Arc::clone(&self.writer);
        self.readers.push(Box::new(move |slot, config| {
            if reply.is_closed() {
                return;
            }
            match run_on(slot, config, |conn| request.answer(conn)) {
                Ok(Ok(Err(request))) => {
                    writer.push(task(move |conn| request.write(conn), reply, wait));
                }
                Ok(Ok(Ok(output))) => {
                    let _ = reply.send(Ok(Ok(output)));
                }
                Ok(Err(panic)) => {
                    let _ = reply.send(Ok(Err(panic)));
                }
                Err(error) => {
                    let _ = reply.send(Err(error));
                }
            }
        }));
    }
}
