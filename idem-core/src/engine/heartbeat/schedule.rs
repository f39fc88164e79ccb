//! When each kept-alive lease is renewed: one schedule for the process, driven by one task on
//! the heartbeat thread. Adding or dropping a lease takes a lock and wakes nobody, so an
//! execution costs no thread hand-off; the thread wakes when a renewal is due (C9).

use super::super::live::lock;
use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

/// One renewal of one lease; `false` once the lease is lost (no more renewals).
pub(super) type Renewal = Pin<Box<dyn Future<Output = bool> + Send>>;

/// What renews one lease.
pub(super) trait Renew: Send + Sync {
    /// The time between two renewals.
    fn period(&self) -> Duration;
    /// One renewal.
    fn renew(&self) -> Renewal;
}

/// The leases kept alive on the heartbeat runtime, and the task that renews them.
pub(super) struct Schedule {
    runtime: Handle,
    state: Mutex<State>,
    /// Wakes the driver when a lease is due before it meant to wake.
    wake: Notify,
}

#[derive(Default)]
struct State {
    next_id: u64,
    leases: HashMap<u64, Entry>,
    /// The leases waiting for their next renewal, earliest first (a lease being renewed is
    /// not here).
    due: BTreeSet<(Instant, u64)>,
    /// When the driver wakes next; `None` while it sleeps until woken.
    wakes_at: Option<Instant>,
    /// The period of the lease added last, if one was added since the driver last woke.
    added: Option<Duration>,
    /// How many times the driver was woken early.
    #[cfg(test)]
    notified: usize,
}

struct Entry {
    renew: Arc<dyn Renew>,
    /// When its next renewal is due; `None` while one runs.
    due: Option<Instant>,
    /// The renewal under way, stopped if the lease is dropped meanwhile.
    renewing: Option<AbortHandle>,
}

/// A lease in the schedule, taken out when dropped.
pub(super) struct Scheduled {
    schedule: &'static Schedule,
    id: u64,
}

impl std::fmt::Debug for Scheduled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduled").field("id", &self.id).finish()
    }
}

impl Drop for Scheduled {
    fn drop(&mut self) {
        self.schedule.remove(self.id);
    }
}

impl Schedule {
    /// Starts the driver on `runtime` (the heartbeat's, started on its own thread).
    pub(super) fn start(runtime: Handle) -> &'static Schedule {
        let schedule: &'static Schedule = Box::leak(Box::new(Schedule {
            runtime: runtime.clone(),
            state: Mutex::default(),
            wake: Notify::new(),
        }));
        runtime.spawn(schedule.drive());
        schedule
    }

    /// The heartbeat's runtime.
    pub(super) fn runtime(&self) -> &Handle {
        &self.runtime
    }

    /// Adds a lease whose first renewal is due after `first`.
    pub(super) fn add(&'static self, renew: Arc<dyn Renew>, first: Duration) -> Scheduled {
        let mut state = lock(&self.state);
        // Read under the lock: an instant read before it could be earlier than the one the
        // driver planned its next wake-up from meanwhile, and wake it for nothing.
        let due = later(Instant::now(), first);
        let id = state.next_id;
        state.next_id += 1;
        state.added = Some(renew.period());
        state.leases.insert(
            id,
            Entry {
                renew,
                due: Some(due),
                renewing: None,
            },
        );
        state.due.insert((due, id));
        self.wake_by(&mut state, due);
        Scheduled { schedule: self, id }
    }

    /// Has the driver wake by `due`: a notification only if it meant to wake later.
    fn wake_by(&self, state: &mut State, due: Instant) {
        if state.wakes_at.is_none_or(|at| due < at) {
            state.wakes_at = Some(due);
            #[cfg(test)]
            {
                state.notified += 1;
            }
            self.wake.notify_one();
        }
    }

    fn remove(&self, id: u64) {
        let removed = {
            let mut state = lock(&self.state);
            let removed = state.leases.remove(&id);
            if let Some(due) = removed.as_ref().and_then(|entry| entry.due) {
                state.due.remove(&(due, id));
            }
            removed
        };
        // Dropped unlocked: it may hold the last reference to its engine.
        if let Some(renewing) = removed.and_then(|entry| entry.renewing) {
            renewing.abort();
        }
    }

    /// A renewal ended: the next is due a period later, or never if the lease is lost.
    fn renewed(&self, id: u64, again: bool) {
        let mut state = lock(&self.state);
        if !again {
            let lost = state.leases.remove(&id);
            drop(state);
            drop(lost); // unlocked, as in `remove`
            return;
        }
        let Some(entry) = state.leases.get_mut(&id) else {
            return;
        };
        entry.renewing = None;
        let due = later(Instant::now(), entry.renew.period());
        entry.due = Some(due);
        state.due.insert((due, id));
        self.wake_by(&mut state, due);
    }

    /// Starts the renewals that are due (or nearly: within an eighth of their period) and
    /// says when to wake next.
    fn start_due(&'static self) -> Option<Instant> {
        let now = Instant::now();
        let state = &mut *lock(&self.state);
        while let Some(&(due, id)) = state.due.first() {
            let Some(entry) = state.leases.get_mut(&id) else {
                state.due.pop_first();
                continue;
            };
            if due > later(now, entry.renew.period() / 8) {
                break;
            }
            state.due.pop_first();
            entry.due = None;
            let renew = Arc::clone(&entry.renew);
            // Spawned on this thread's runtime: it runs once the driver waits again.
            let task = self.runtime.spawn(async move {
                let again = renew_caught(renew).await;
                self.renewed(id, again);
            });
            entry.renewing = Some(task.abort_handle());
        }
        let added = state.added.take();
        // Nothing to renew: while leases come and go, wait a period more (a lease added
        // meanwhile is due later, so executions shorter than a period never wake this
        // thread); once none came for a period, sleep until one does. Woken before the
        // wake-up it planned (a notification left from before it last looked), it keeps it.
        let planned = state.wakes_at.filter(|&at| at > now);
        state.wakes_at = state
            .due
            .first()
            .map(|&(due, _)| due)
            .or(added.map(|p| later(now, p)))
            .or(planned);
        state.wakes_at
    }

    async fn drive(&'static self) {
        loop {
            match self.start_due() {
                Some(at) => {
                    let _ = tokio::time::timeout_at(at.into(), self.wake.notified()).await;
                }
                None => self.wake.notified().await,
            }
        }
    }
}

/// One renewal by `renew`, `false` once its lease is lost. A panic (a store's bug), in making
/// the renewal or in running it, costs this renewal only: the next is due a period later.
pub(super) async fn renew_caught(renew: Arc<dyn Renew>) -> bool {
    crate::unwind::CatchUnwind::new(async move { renew.renew().await })
        .await
        .unwrap_or(true)
}

/// `instant` plus `d`, never a panic: the driver renews every lease of the process, so nothing
/// in it may fail (a lease's period is bounded by `Policy::MAX_LEASE` anyway).
fn later(instant: Instant, d: Duration) -> Instant {
    instant
        .checked_add(d)
        .or_else(|| instant.checked_add(Duration::from_secs(86_400)))
        .unwrap_or(instant)
}

#[cfg(test)]
mod tests {
    use super::{lock, Renew, Renewal, Schedule};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// Counts its renewals; each takes `takes` and says `again`.
    struct Counting {
        period: Duration,
        takes: Duration,
        again: bool,
        started: AtomicUsize,
        ended: Arc<AtomicUsize>,
    }

    impl Counting {
        fn new(period_ms: u64) -> Arc<Counting> {
            Arc::new(Counting {
                period: Duration::from_millis(period_ms),
                takes: Duration::ZERO,
                again: true,
                started: AtomicUsize::new(0),
                ended: Arc::default(),
            })
        }
        fn started(&self) -> usize {
            self.started.load(Ordering::SeqCst)
        }
    }

    impl Renew for Counting {
        fn period(&self) -> Duration {
            self.period
        }
        fn renew(&self) -> Renewal {
            self.started.fetch_add(1, Ordering::SeqCst);
            let (takes, again, ended) = (self.takes, self.again, Arc::clone(&self.ended));
            Box::pin(async move {
                tokio::time::sleep(takes).await;
                ended.fetch_add(1, Ordering::SeqCst);
                again
            })
        }
    }

    /// A schedule of its own, driven on a runtime on a thread of its own.
    fn schedule() -> &'static Schedule {
        let (sent, received) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            sent.send(Schedule::start(runtime.handle().clone()))
                .expect("sent");
            runtime.block_on(std::future::pending::<()>());
        });
        received.recv().expect("a schedule")
    }

    fn wait(ms: u64) {
        std::thread::sleep(Duration::from_millis(ms));
    }

    #[test]
    fn c09_a_lease_is_renewed_every_period_until_dropped() {
        let schedule = schedule();
        let beat = Counting::new(30);
        let kept = schedule.add(beat.clone(), Duration::from_millis(30));
        wait(200);
        let renewed = beat.started();
        assert!((4..=8).contains(&renewed), "{renewed} renewals in 200 ms");
        drop(kept);
        wait(100);
        assert_eq!(beat.started(), renewed, "renewed after it was dropped");
        assert!(lock(&schedule.state).leases.is_empty());
    }

    #[test]
    fn c09_a_renewal_that_panics_is_tried_again_a_period_later() {
        struct Panicking(AtomicUsize);
        impl Renew for Panicking {
            fn period(&self) -> Duration {
                Duration::from_millis(20)
            }
            fn renew(&self) -> Renewal {
                self.0.fetch_add(1, Ordering::SeqCst);
                Box::pin(async { panic!("a store's bug") })
            }
        }
        let schedule = schedule();
        let beat = Arc::new(Panicking(AtomicUsize::new(0)));
        let _kept = schedule.add(beat.clone(), Duration::from_millis(20));
        wait(200);
        let tried = beat.0.load(Ordering::SeqCst);
        assert!(tried >= 4, "{tried} renewals in 200 ms");
    }

    #[test]
    fn c09_a_renewal_that_panics_as_it_is_made_stops_no_other_lease() {
        struct PanicsAtOnce;
        impl Renew for PanicsAtOnce {
            fn period(&self) -> Duration {
                Duration::from_millis(10)
            }
            fn renew(&self) -> Renewal {
                panic!("a store's bug, before any future")
            }
        }
        let schedule = schedule();
        let other = Counting::new(20);
        let _other = schedule.add(other.clone(), Duration::from_millis(20));
        let _bad = schedule.add(Arc::new(PanicsAtOnce), Duration::from_millis(10));
        wait(50);
        let before = other.started();
        wait(200);
        assert!(
            other.started() >= before + 5,
            "the other lease was renewed {before} then {} times",
            other.started()
        );
    }

    #[test]
    fn c09_a_lost_lease_is_not_renewed_again() {
        let schedule = schedule();
        let beat = Arc::new(Counting {
            again: false,
            ..Arc::into_inner(Counting::new(10)).expect("one")
        });
        let _kept = schedule.add(beat.clone(), Duration::from_millis(10));
        wait(150);
        assert_eq!(beat.started(), 1);
        assert!(lock(&schedule.state).leases.is_empty());
    }

    #[test]
    fn c09_a_renewal_under_way_stops_when_its_lease_is_dropped() {
        let schedule = schedule();
        let beat = Arc::new(Counting {
            takes: Duration::from_millis(300),
            ..Arc::into_inner(Counting::new(10)).expect("one")
        });
        let kept = schedule.add(beat.clone(), Duration::from_millis(10));
        wait(100);
        assert_eq!(beat.started(), 1, "one renewal under way");
        drop(kept);
        wait(400);
        assert_eq!(beat.ended.load(Ordering::SeqCst), 0, "the renewal went on");
    }

    /// A schedule whose driver never runs: the test calls `start_due` itself.
    fn undriven() -> &'static Schedule {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let schedule: &'static Schedule = Box::leak(Box::new(Schedule {
            runtime: runtime.handle().clone(),
            state: std::sync::Mutex::default(),
            wake: tokio::sync::Notify::new(),
        }));
        Box::leak(Box::new(runtime));
        schedule
    }

    /// The driver woken before the wake-up it planned, with nothing due and no lease added
    /// since it last looked (a notification left from an addition it had already seen, as
    /// when its first look comes after the first lease): it keeps that wake-up, so the next
    /// lease, due later, does not wake it again.
    #[test]
    fn a_driver_woken_early_keeps_the_wake_up_it_planned() {
        let schedule = undriven();
        drop(schedule.add(Counting::new(60_000), Duration::from_secs(60)));
        assert!(
            schedule.start_due().is_some(),
            "a lease came: a period more"
        );
        assert!(
            schedule.start_due().is_some(),
            "woken early: the same wake-up"
        );
        drop(schedule.add(Counting::new(60_000), Duration::from_secs(60)));
        assert_eq!(lock(&schedule.state).notified, 1, "only the first woke it");
    }

    #[test]
    fn executions_shorter_than_a_period_never_wake_the_driver() {
        let schedule = schedule();
        for _ in 0..200 {
            drop(schedule.add(Counting::new(60_000), Duration::from_secs(60)));
        }
        assert_eq!(lock(&schedule.state).notified, 1, "only the first woke it");
    }

    #[test]
    fn leases_coming_and_going_for_many_periods_wake_the_driver_once_a_period_at_most() {
        let schedule = schedule();
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_millis(400) {
            drop(schedule.add(Counting::new(50), Duration::from_millis(50)));
            wait(1);
        }
        let notified = lock(&schedule.state).notified;
        assert!(notified <= 2, "woken early {notified} times in 8 periods");
    }

    #[test]
    fn c09_a_shorter_lease_added_while_the_driver_sleeps_long_is_renewed_on_time() {
        let schedule = schedule();
        let _long = schedule.add(Counting::new(60_000), Duration::from_secs(60));
        wait(50);
        let short = Counting::new(20);
        let _kept = schedule.add(short.clone(), Duration::from_millis(20));
        wait(150);
        assert!(short.started() >= 3, "{} renewals", short.started());
    }
}
