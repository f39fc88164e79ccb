//! How long a queued task may wait before it starts, and who decides its fate when that time
//! is up: the task when it starts, or its caller when the wait passes first; exactly one wins.
//! A task that started runs to its end and its caller waits for it, so a caller is never told
//! "not run" about work that ran (the effect of a transaction, say).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const QUEUED: u8 = 0;
const STARTED: u8 = 1;
const ABANDONED: u8 = 2;

/// A task's deadline to start, shared by the task and its caller.
#[derive(Debug, Clone)]
pub(crate) struct Wait {
    until: Instant,
    state: Arc<AtomicU8>,
}

impl Wait {
    /// A wait of `wait` from now (`None` if that is beyond what the clock can tell).
    pub(crate) fn new(wait: Duration) -> Option<Self> {
        Some(Self {
            until: Instant::now().checked_add(wait)?,
            state: Arc::new(AtomicU8::new(QUEUED)),
        })
    }

    /// When the wait ends.
    pub(crate) fn until(&self) -> Instant {
        self.until
    }

    /// Whether the wait has passed.
    pub(crate) fn passed(&self) -> bool {
        Instant::now() > self.until
    }

    /// The task starts, unless its caller gave up on it first.
    pub(crate) fn start(&self) -> bool {
        self.leave_queued_for(STARTED)
    }

    /// The caller gives up, unless the task started first.
    pub(crate) fn abandon(&self) -> bool {
        self.leave_queued_for(ABANDONED)
    }

    fn leave_queued_for(&self, to: u8) -> bool {
        self.state
            .compare_exchange(QUEUED, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_started_the_caller_cannot_abandon_and_the_reverse() {
        let wait = Wait::new(Duration::from_secs(1)).expect("a wait");
        let caller = wait.clone();
        assert!(wait.start());
        assert!(!caller.abandon(), "abandoned a started task");
        assert!(!wait.start(), "started twice");

        let wait = Wait::new(Duration::from_secs(1)).expect("a wait");
        assert!(wait.clone().abandon());
        assert!(!wait.start(), "started an abandoned task");
    }

    #[test]
    fn exactly_one_side_wins_a_race() {
        for _ in 0..1000 {
            let wait = Wait::new(Duration::from_secs(1)).expect("a wait");
            let task = wait.clone();
            let started = std::thread::spawn(move || task.start());
            let abandoned = wait.abandon();
            let started = started.join().expect("thread");
            assert!(
                started != abandoned,
                "started {started}, abandoned {abandoned}"
            );
        }
    }
}
