//! A lane: connections each owned by a thread of its own, fed by one queue.
//!
//! A caller puts a task on the queue and awaits its reply; a thread of the lane takes it, runs
//! it on its connection and takes the next one at once, with no task wake-up or thread dispatch
//! between two tasks. A connection never moves between threads, and nothing here ever blocks
//! the async executor: the caller only pushes (a short lock) and awaits.
//!
//! Tasks whose callers gave up ([`Claim`]) are let go of while they wait, not only when their
//! turn comes: a queue behind a frozen writer holds only the work somebody still waits for.
//! The threads end when the lane is closed and its queue is empty; each closes its connection.

use crate::claim::Claim;
use crate::config::SqliteConfig;
use crate::connection::{connect, read_only};
use idem_core::Error;
use rusqlite::Connection;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

/// A connection slot: `None` after a connection had to be dropped; the next task reopens it.
pub(crate) type Slot = Option<Connection>;

/// One unit of work for a lane's thread. It checks for itself whether it is still wanted (its
/// claim) and sends its own reply, after telling the lane it is [`Finished`].
pub(crate) type Task = Box<dyn FnOnce(&mut Slot, &Home, Finished<'_>) + Send>;

/// A running task's mark on its lane, taken off when the task says it is finished (or when it
/// is dropped, should the task not say so). A task says so before it sends its reply: a caller
/// that drops the last handle on the store as soon as it has its answer finds the lane idle and
/// waits for its connections to close, instead of leaving them to a thread that is only still
/// tidying up.
pub(crate) struct Finished<'a>(Option<&'a Lane>);

impl Finished<'_> {
    /// The task is done with its connection; what it does after this is only send its reply.
    pub(crate) fn now(&mut self) {
        if let Some(lane) = self.0.take() {
            lane.lock().running -= 1;
        }
    }
}

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.now();
    }
}

/// The queue is searched for abandoned tasks once it is this long, then each time it doubles.
const PRUNE_FROM: usize = 64;

/// What a lane's connections are: how a thread opens a new one when its slot is empty.
#[derive(Debug)]
pub(crate) struct Home {
    config: Arc<SqliteConfig>,
    /// Readers are opened `query_only`: the connections that answer never take the write lock.
    read_only: bool,
}

impl Home {
    pub(crate) fn open(&self) -> Result<Connection, Error> {
        let conn = connect(&self.config)?;
        if self.read_only {
            return read_only(conn);
        }
        Ok(conn)
    }
}

struct Queued {
    task: Task,
    claim: Claim,
}

struct Queue {
    tasks: VecDeque<Queued>,
    /// Tasks a thread has taken and not finished.
    running: usize,
    closed: bool,
    /// The length at which abandoned tasks are next let go of.
    prune_at: usize,
}

/// The queue of one kind of connection (the writer, or the readers) and its threads.
pub(crate) struct Lane {
    queue: Mutex<Queue>,
    ready: Condvar,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let queue = self.lock();
        f.debug_struct("Lane")
            .field("queued", &queue.tasks.len())
            .field("running", &queue.running)
            .field("closed", &queue.closed)
            .finish()
    }
}

/// The lane's queue, locked while it is idle: a task pushed through it is the next one to run,
/// with nothing before it.
pub(crate) struct Idle<'a>(MutexGuard<'a, Queue>, &'a Condvar);

impl Idle<'_> {
    pub(crate) fn push(mut self, task: Task, claim: Claim) {
        self.0.tasks.push_back(Queued { task, claim });
        drop(self.0);
        self.1.notify_one();
    }
}

impl Lane {
    /// Starts one thread per connection, named `name-<n>`; `read_only` lanes open their new
    /// connections `query_only` (the ones given are expected to be already).
    pub(crate) fn start(
        name: &str,
        connections: Vec<Connection>,
        config: Arc<SqliteConfig>,
        read_only: bool,
    ) -> std::io::Result<Arc<Lane>> {
        let lane = Arc::new(Lane {
            queue: Mutex::new(Queue {
                tasks: VecDeque::new(),
                running: 0,
                closed: false,
                prune_at: PRUNE_FROM,
            }),
            ready: Condvar::new(),
            threads: Mutex::new(Vec::new()),
        });
        let home = Arc::new(Home { config, read_only });
        for (n, conn) in connections.into_iter().enumerate() {
            let (served, home) = (Arc::clone(&lane), Arc::clone(&home));
            let spawned = std::thread::Builder::new()
                .name(format!("{name}-{n}"))
                .spawn(move || served.serve(Some(conn), &home));
            match spawned {
                Ok(thread) => lock(&lane.threads).push(thread),
                Err(error) => {
                    lane.close();
                    return Err(error);
                }
            }
        }
        Ok(lane)
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        lock(&self.queue)
    }

    /// Queues `task` after those queued before it.
    pub(crate) fn push(&self, task: Task, claim: Claim) {
        let mut queue = self.lock();
        let mut gone = VecDeque::new();
        if queue.tasks.len() >= queue.prune_at {
            let (kept, abandoned) = std::mem::take(&mut queue.tasks)
                .into_iter()
                .partition(|queued| !queued.claim.abandoned());
            queue.tasks = kept;
            gone = abandoned;
            queue.prune_at = (queue.tasks.len() * 2).max(PRUNE_FROM);
        }
        queue.tasks.push_back(Queued { task, claim });
        drop(queue);
        self.ready.notify_one();
        // What abandoned tasks carry is dropped out of the lock: it may hold the last handle on
        // the store, whose drop closes this lane.
        drop(gone);
    }

    /// The queue, if nothing is queued or running: a task pushed through it runs at once.
    pub(crate) fn idle(&self) -> Option<Idle<'_>> {
        let queue = self.lock();
        (queue.tasks.is_empty() && queue.running == 0).then_some(Idle(queue, &self.ready))
    }

    /// Ends the threads once the tasks queued so far have run; whether the lane was idle.
    pub(crate) fn close(&self) -> bool {
        let mut queue = self.lock();
        queue.closed = true;
        let idle = queue.tasks.is_empty() && queue.running == 0;
        drop(queue);
        self.ready.notify_all();
        idle
    }

    /// Waits for the threads to end (after [`close`](Self::close)), so that their connections
    /// are closed when this returns; not from one of the lane's own threads.
    pub(crate) fn join(&self) {
        let here = std::thread::current().id();
        let threads = std::mem::take(&mut *lock(&self.threads));
        if threads.iter().any(|thread| thread.thread().id() == here) {
            return;
        }
        for thread in threads {
            let _ = thread.join();
        }
    }

    fn serve(&self, mut slot: Slot, home: &Home) {
        loop {
            let (queued, wanted) = {
                let mut queue = self.lock();
                loop {
                    match queue.tasks.pop_front() {
                        Some(queued) => {
                            let wanted = !queued.claim.abandoned();
                            queue.running += usize::from(wanted);
                            break (queued, wanted);
                        }
                        None if queue.closed => return,
                        None => {
                            queue = self
                                .ready
                                .wait(queue)
                                .unwrap_or_else(PoisonError::into_inner);
                        }
                    }
                }
            };
            if !wanted {
                // Dropped out of the lock (it may hold the last handle on the store).
                drop(queued);
                continue;
            }
            let task = queued.task;
            let finished = Finished(Some(self));
            // A task catches its work's panic and sends it to its caller; this one keeps the
            // thread alive should anything else in the task panic (the unwind drops `finished`).
            let _ = catch_unwind(AssertUnwindSafe(|| task(&mut slot, home, finished)));
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Only pushes, pops and counts run under these locks: poisoned, they are still consistent.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
