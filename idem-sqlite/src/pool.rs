//! The store's connections: one writer and its readers, each owned by a thread of its own and
//! fed by a queue ([`Lane`]): one hop per request, on every path, contended or not.
//!
//! SQLite has one writer at a time. Several connections writing at once spend their time in
//! SQLite's sleeping busy handler; one writer connection, whose thread takes the queued writes
//! back to back, writes with no wake-up between two of them. Readers have connections of their
//! own (`query_only`) that no writer ever holds, so an answer that writes nothing (a replay, an
//! in-flight duplicate, a mismatch) never waits for a writer (C5).
//!
//! A request that may have to write is decided where its statement runs ([`Decide`]): on the
//! writer at once if it is idle; else on a reader, which answers it there or hands it to the
//! writer's queue itself, so the caller is woken once, with the result.
//!
//! A task whose caller left (its future dropped) before it started is not run, and the queue
//! lets go of it at once; one that started runs to its end. A task that carries a wait
//! (`write_within`, a transaction's `decide`) and has not started when it passes is not run
//! either, and its caller is told so at the deadline; one that started first is waited for to
//! its end ([`Claim`]), so nobody is ever told "not run" about work that ran. Work runs inside
//! the caller's Tokio runtime. After every task a connection left inside a transaction is
//! rolled back, or replaced when that fails, so no caller ever sees another's uncommitted
//! writes. The last handle's drop closes the connections before it returns, unless a task is
//! still running (then they close when it ends).

use crate::claim::{AbandonOnDrop, Claim};
use crate::config::SqliteConfig;
use crate::connection::clean;
use crate::lane::{Finished, Home, Lane, Slot, Task};
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
    /// The readers close first and the writer last, alone: SQLite checkpoints the WAL into the
    /// database file and removes it only on a close that finds no other connection open, so two
    /// connections closing at the same time may each see the other and both leave the WAL.
    fn drop(&mut self) {
        let readers_idle = self.readers.close();
        if readers_idle {
            self.readers.join();
        }
        let writer_idle = self.writer.close();
        if readers_idle && writer_idle {
            self.writer.join();
        }
    }
}

fn unavailable(message: impl Into<String>) -> Error {
    Error::store(
        crate::error::BACKEND,
        StoreErrorKind::Unavailable,
        message.into(),
    )
}

fn busy_past_the_wait() -> Error {
    unavailable("the SQLite writer stayed busy past the store timeout")
}

/// Runs `work` on the connection in `slot` (opening one if the slot is empty), then cleans the
/// connection; a panic in `work` is returned as `Err` after the cleaning.
fn run_on<T>(slot: &mut Slot, home: &Home, work: impl FnOnce(&mut Connection) -> T) -> Reply<T> {
    let mut conn = match slot.take() {
        Some(conn) => conn,
        None => home.open()?,
    };
    let result = catch_unwind(AssertUnwindSafe(|| work(&mut conn)));
    *slot = clean(conn);
    Ok(result)
}

/// The caller's Tokio runtime, if any, entered on the connection's thread while its task runs:
/// the work and the engine's observers it calls run inside the caller's runtime, as they did on
/// Tokio's blocking pool (`Handle::current()`, `tokio::spawn` work there).
struct Runtime(Option<tokio::runtime::Handle>);

impl Runtime {
    fn of_caller() -> Self {
        Self(tokio::runtime::Handle::try_current().ok())
    }

    fn enter(&self) -> Option<tokio::runtime::EnterGuard<'_>> {
        self.0.as_ref().map(tokio::runtime::Handle::enter)
    }
}

/// A task that runs `work` and sends what it gave, unless its caller gave up on it (left, or
/// its wait passed) before it started.
fn task<T, F>(work: F, reply: oneshot::Sender<Reply<T>>, claim: Claim) -> Task
where
    F: FnOnce(&mut Connection) -> T + Send + 'static,
    T: Send + 'static,
{
    let runtime = Runtime::of_caller();
    Box::new(move |slot, home, finished| {
        // Past its deadline, whether or not the caller's timer fired yet: not started.
        if claim.passed() {
            if claim.abandon() {
                send(reply, Err(busy_past_the_wait()), finished);
            }
            return;
        }
        if !claim.start() {
            return;
        }
        let entered = runtime.enter();
        let result = run_on(slot, home, work);
        drop(entered);
        send(reply, result, finished);
    })
}

/// Sends a task's reply once the lane knows the task is finished.
fn send<T>(reply: oneshot::Sender<Reply<T>>, value: Reply<T>, mut finished: Finished<'_>) {
    finished.now();
    let _ = reply.send(value);
}

fn unpacked<T>(reply: Result<Reply<T>, oneshot::error::RecvError>) -> Result<T, Error> {
    match reply {
        Ok(Ok(Ok(value))) => Ok(value),
        Ok(Ok(Err(panic))) => resume_unwind(panic),
        Ok(Err(error)) => Err(error),
        Err(_) => Err(unavailable("the SQLite store was closed")),
    }
}

/// Waits for a task's reply; a panic in the work resumes here. Dropped before the task
/// started, it gives the task up. With a wait, it gives up at the end of it if the task has
/// not started by then (one that started is waited for to its end); without a Tokio time
/// driver, the task itself refuses to start late.
async fn received<T>(mut reply: oneshot::Receiver<Reply<T>>, claim: Claim) -> Result<T, Error> {
    let _gives_up = AbandonOnDrop(&claim);
    let timer = claim.until().and_then(|until| {
        let until = tokio::time::Instant::from_std(until);
        catch_unwind(|| tokio::time::sleep_until(until)).ok()
    });
    let Some(timer) = timer else {
        return unpacked(reply.await);
    };
    tokio::select! {
        biased;
        result = &mut reply => return unpacked(result),
        () = timer => {}
    }
    if claim.abandon() {
        return Err(busy_past_the_wait());
    }
    unpacked(reply.await)
}

impl Pool {
    pub(crate) fn new(
        writer: Connection,
        readers: Vec<Connection>,
        config: Arc<SqliteConfig>,
    ) -> Result<Self, Error> {
        let start = |name: &str, conns: Vec<Connection>, read_only: bool| {
            Lane::start(name, conns, Arc::clone(&config), read_only)
                .map_err(|e| unavailable(format!("cannot start a SQLite thread: {e}")))
        };
        let writer = start("idem-sqlite-writer", vec![writer], false)?;
        let readers = match start("idem-sqlite-reader", readers, true) {
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
        let claim = Claim::new(None);
        self.writer
            .push(task(work, reply, claim.clone()), claim.clone());
        received(answer, claim).await
    }

    /// [`write`](Self::write), not run (an unavailable store error) if it has not started
    /// within `wait`.
    pub(crate) async fn write_within<T, F>(&self, wait: Duration, work: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Connection) -> T + Send + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let claim = Claim::new(Some(wait));
        self.writer
            .push(task(work, reply, claim.clone()), claim.clone());
        received(answer, claim).await
    }

    /// Runs `work` on a reader.
    pub(crate) async fn read<T, F>(&self, work: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Connection) -> T + Send + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let claim = Claim::new(None);
        self.readers
            .push(task(work, reply, claim.clone()), claim.clone());
        received(answer, claim).await
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
        let claim = Claim::new(wait);
        self.dispatch(request, reply, claim.clone());
        received(answer, claim).await
    }

    fn dispatch<D: Decide>(
        &self,
        request: D,
        reply: oneshot::Sender<Reply<D::Output>>,
        claim: Claim,
    ) {
        if let Some(idle) = self.writer.idle() {
            let write = task(move |conn| request.write(conn), reply, claim.clone());
            return idle.push(write, claim);
        }
        let writer = Arc::clone(&self.writer);
        let runtime = Runtime::of_caller();
        let on_reader = claim.clone();
        // The reader's part only reads: it runs unless its caller gave up, and leaves the claim
        // to the writer's part, the one that writes.
        self.readers.push(
            Box::new(move |slot, home, finished| {
                if claim.abandoned() {
                    return;
                }
                // Entered here too: the part forwarded to the writer takes the runtime from here.
                let _entered = runtime.enter();
                match run_on(slot, home, |conn| request.answer(conn)) {
                    Ok(Ok(Err(request))) => {
                        let write = task(move |conn| request.write(conn), reply, claim.clone());
                        writer.push(write, claim);
                    }
                    Ok(Ok(Ok(output))) => send(reply, Ok(Ok(output)), finished),
                    Ok(Err(panic)) => send(reply, Ok(Err(panic)), finished),
                    Err(error) => send(reply, Err(error), finished),
                }
            }),
            on_reader,
        );
    }
}
