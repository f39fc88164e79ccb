//! The shutdown gate: counts executions, refuses new ones once closing, lets `drain` wait.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

#[derive(Debug, Default)]
pub(crate) struct Gate(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    running: AtomicUsize,
    closing: AtomicBool,
    /// How many `drained` calls wait (the last execution wakes them only if any).
    drainers: AtomicUsize,
    idle: Notify,
}

/// One execution under way, from before its reservation to its end, whatever its caller does.
#[derive(Debug)]
pub(crate) struct Running(Arc<Inner>);

impl Gate {
    /// Counts a new execution, unless shutdown began.
    pub(crate) fn enter(&self) -> Option<Running> {
        let running = self.enter_always();
        // SeqCst on both sides: a shutdown that set `closing` before this count either sees the
        // count (and waits for it) or this sees `closing` (and backs out, dropping the count).
        (!self.0.closing.load(Ordering::SeqCst)).then_some(running)
    }

    /// Counts the continuation of an admitted execution, even during a shutdown.
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
        // SeqCst on both sides: an execution that ends after this counter went up sees it (and
        // wakes this), or this sees the execution's end.
        let _drainer = Drainer::enter(&self.0);
        loop {
            let idle = self.0.idle.notified();
            if self.0.running.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// One `drained` call, counted in `drainers` while it lives (cancelled or not).
struct Drainer<'a>(&'a Inner);

impl<'a> Drainer<'a> {
    fn enter(inner: &'a Inner) -> Self {
        inner.drainers.fetch_add(1, Ordering::SeqCst);
        Drainer(inner)
    }
}

impl Drop for Drainer<'_> {
    fn drop(&mut self) {
        self.0.drainers.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::SeqCst) == 1
            && self.0.drainers.load(Ordering::SeqCst) > 0
        {
            self.0.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn c08_a_drain_ends_when_the_last_execution_ends_and_not_before() {
        let gate = Gate::default();
        let first = gate.enter().expect("open");
        let second = gate.enter_always();
        let waiting = Gate(Arc::clone(&gate.0));
        let drain = tokio::spawn(async move { waiting.drained().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(first);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!drain.is_finished(), "one execution is still under way");
        drop(second);
        tokio::time::timeout(Duration::from_secs(5), drain)
            .await
            .expect("the drain ended with the last execution")
            .expect("the drain task");
        assert_eq!(gate.0.drainers.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn c08_executions_that_end_while_nobody_drains_leave_a_later_drain_immediate() {
        let gate = Gate::default();
        for _ in 0..3 {
            drop(gate.enter().expect("open"));
        }
        tokio::time::timeout(Duration::from_secs(1), gate.drained())
            .await
            .expect("nothing under way: the drain is immediate");
    }
}
