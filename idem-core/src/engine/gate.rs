//! The shutdown gate: counts the executions under way, refuses new ones once shutdown began, and
//! lets `drain` wait for the rest.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

#[derive(Debug, Default)]
pub(crate) struct Gate(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    running: AtomicUsize,
    closing: AtomicBool,
    idle: Notify,
}

/// One execution under way, counted from before its reservation until it ended (its completion
/// landed, was released, or was given up), whatever became of its caller.
#[derive(Debug)]
pub(crate) struct Running(Arc<Inner>);

impl Gate {
    /// Counts a new execution, unless shutdown began.
    pub(crate) fn enter(&self) -> Option<Running> {
        let running = self.enter_always();
        // SeqCst on both sides: a shutdown that set `closing` before this count either sees the
        // count (and waits for it) or this sees `closing` (and backs out).
        if self.0.closing.load(Ordering::SeqCst) {
            return None;
        }
        Some(running)
    }

    /// Counts the continuation of an execution already admitted (it must finish even during a
    /// shutdown).
    pub(crate) fn enter_always(&self) -> Running {
        self.0.running.fetch_add(1, Ordering::SeqCst);
        Running(Arc::clone(&self.0))
    }

    /// How many executions are under way.
    pub(crate) fn running(&self) -> usize {
        self.0.running.load(Ordering::SeqCst)
    }

    pub(crate) fn is_closing(&self) -> bool {
        self.0.closing.load(Ordering::SeqCst)
    }

    pub(crate) fn close(&self) {
        self.0.closing.store(true, Ordering::SeqCst);
    }

    /// Waits until no execution is under way.
    pub(crate) async fn drained(&self) {
        loop {
            let idle = self.0.idle.notified();
            if self.0.running.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}
