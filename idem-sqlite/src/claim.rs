//! Who decides the fate of a queued task: the task when it starts, or its caller when it gives
//! up first (its future dropped, or the task's wait to start passed); exactly one wins. A task
//! that started runs to its end and its caller is told how it ended, so a caller is never told
//! "not run" about work that ran (the effect of a transaction, say); a task its caller gave up
//! on never starts, and the queue lets go of it (and of what it carries) without waiting for
//! its turn.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const QUEUED: u8 = 0;
const STARTED: u8 = 1;
const ABANDONED: u8 = 2;

/// The claim on one task, shared by the task and its caller.
#[derive(Debug, Clone)]
pub(crate) struct Claim {
    /// The latest moment the task may start, if it has a wait.
    until: Option<Instant>,
    state: Arc<AtomicU8>,
}

impl Claim {
    /// A claim on a task that may wait `wait` to start (for ever with `None`, or when that is
    /// beyond what the clock can tell).
    pub(crate) fn new(wait: Option<Duration>) -> Self {
        Self {
            until: wait.and_then(|wait| Instant::now().checked_add(wait)),
            state: Arc::new(AtomicU8::new(QUEUED)),
        }
    }

    /// The latest moment the task may start, if it has one.
    pub(crate) fn until(&self) -> Option<Instant> {
        self.until
    }

    /// Whether the task's wait to start has passed.
    pub(crate) fn passed(&self) -> bool {
        self.until.is_some_and(|until| Instant::now() > until)
    }

    /// The task starts, unless its caller gave up on it first.
    pub(crate) fn start(&self) -> bool {
        self.leave_queued_for(STARTED)
    }

    /// The caller gives up, unless the task started first.
    pub(crate) fn abandon(&self) -> bool {
        self.leave_queued_for(ABANDONED)
    }

    /// Whether the caller gave up on the task (it will never start).
    pub(crate) fn abandoned(&self) -> bool {
        self.state.load(Ordering::Acquire) == ABANDONED
    }

    fn leave_queued_for(&self, to: u8) -> bool {
        self.state
            .compare_exchange(QUEUED, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// Gives up on the task when dropped: held by the caller's future while it waits, so that a
/// dropped future lets go of a task that has not started (nothing once it started).
#[derive(Debug)]
pub(crate) struct AbandonOnDrop<'a>(pub(crate) &'a Claim);

impl Drop for AbandonOnDrop<'_> {
    fn drop(&mut self) {
        self.0.abandon();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_started_the_caller_cannot_abandon_and_the_reverse() {
        let claim = Claim::new(Some(Duration::from_secs(1)));
        let caller = claim.clone();
        assert!(claim.start());
        assert!(!caller.abandon(), "abandoned a started task");
        assert!(!claim.start(), "started twice");
        assert!(!claim.abandoned());

        let claim = Claim::new(None);
        assert!(claim.clone().abandon());
        assert!(claim.abandoned());
        assert!(!claim.start(), "started an abandoned task");
    }

    #[test]
    fn exactly_one_side_wins_a_race() {
        for _ in 0..1000 {
            let claim = Claim::new(Some(Duration::from_secs(1)));
            let task = claim.clone();
            let started = std::thread::spawn(move || task.start());
            let abandoned = claim.abandon();
            let started = started.join().expect("thread");
            assert!(
                started != abandoned,
                "started {started}, abandoned {abandoned}"
            );
        }
    }

    #[test]
    fn a_dropped_caller_gives_up_only_on_a_task_not_started() {
        let claim = Claim::new(None);
        drop(AbandonOnDrop(&claim));
        assert!(claim.abandoned());
        let claim = Claim::new(None);
        assert!(claim.start());
        drop(AbandonOnDrop(&claim));
        assert!(!claim.abandoned());
    }

    #[test]
    fn only_a_claim_with_a_wait_passes() {
        assert!(!Claim::new(None).passed());
        assert!(Claim::new(Some(Duration::ZERO)).until().is_some());
        let claim = Claim::new(Some(Duration::ZERO));
        std::thread::sleep(Duration::from_millis(2));
        assert!(claim.passed());
    }
}
