//! A lane: connections each owned by a thread of its own, fed by one queue.
//!
//! A caller puts a task on the queue and awaits its reply; a thread of the lane takes it, runs
//! it on its connection and takes the next one at once, with no task wake-up or thread dispatch
//! between two tasks. A connection never moves between threads, and nothing here ever blocks
//! the async executor: the caller only pushes (a short lock) and awaits.
//!
//! The threads end when the lane is closed and its queue is empty; each closes its connection.

use crate::config::SqliteConfig;
use rusqlite::Connection;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

/// A connection slot: `None` after a connection had to be dropped; the next task reopens it.
pub(crate) type Slot = Option<Connection>;

/// One unit of work for a lane's thread. It checks for itself whether it is still wanted (its
/// caller gone, its deadline passed) and sends its own reply.
pub(crate) type Task = Box<dyn FnOnce(&mut Slot, &SqliteConfig) + Send>;

#[derive(Default)]
struct Queue {
    tasks: VecDeque<Task>,
    /// Tasks a thread has taken and not finished.
    running: usize,
    closed: bool,
}

/// The queue of one kind of connection (the writer, or the readers) and its threads.
pub(crate) struct Lane {
    queue: Mutex<Queue>,
    ready: Condvar,
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
    pub(crate) fn push(mut self, task: Task) {
        self.0.tasks.push_back(task);
        drop(self.0);
        self.1.notify_one();
    }
}

impl Lane {
    /// Starts one thread per connection, named `name-<n>`.
    pub(crate) fn start(
        name: &str,
        connections: Vec<Connection>,
        config: Arc<SqliteConfig>,
    ) -> std::io::Result<Arc<Lane>> {
        let lane = Arc::new(Lane {
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
        });
        for (n, conn) in connections.into_iter().enumerate() {
            let (served, config) = (Arc::clone(&lane), Arc::clone(&config));
            let spawned = std::thread::Builder::new()
                .name(format!("{name}-{n}"))
                .spawn(move || served.serve(Some(conn), &config));
            if let Err(error) = spawned {
                lane.close();
                return Err(error);
            }
        }
        Ok(lane)
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Only pushes, pops and counts run under the lock: a poisoned queue is consistent.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `task` after those queued before it.
    pub(crate) fn push(&self, task: Task) {
        self.lock().tasks.push_back(task);
        self.ready.notify_one();
    }

    /// The queue, if nothing is queued or running: a task pushed through it runs at once.
    pub(crate) fn idle(&self) -> Option<Idle<'_>> {
        let queue = self.lock();
        (queue.tasks.is_empty() && queue.running == 0).then_some(Idle(queue, &self.ready))
    }

    /// Ends the threads once the tasks queued so far have run.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    fn serve(&self, mut slot: Slot, config: &SqliteConfig) {
        loop {
            let task = {
                let mut queue = self.lock();
                loop {
                    if let Some(task) = queue.tasks.pop_front() {
                        queue.running += 1;
                        break task;
                    }
                    if queue.closed {
                        return;
                    }
                    queue = self
                        .ready
                        .wait(queue)
                        .unwrap_or_else(PoisonError::into_inner);
                }
            };
            // A task catches its work's panic and sends it to its caller; this one keeps the
            // thread alive should anything else in the task panic.
            let _ = catch_unwind(AssertUnwindSafe(|| task(&mut slot, config)));
            self.lock().running -= 1;
        }
    }
}
