//! The opt-in bounded wait of a duplicate for its original (C5, [`Policy::wait_in_flight`]).
//! While answered "in flight", it parks on its record's wake-ups (no connection, no thread) and
//! reads the record again when woken or when its polling interval passes. It ends with the
//! first other answer, or "in flight" when the wait is over. At most [`Policy::max_waiters`]
//! wait at once in a process.
//!
//! Every path waits through [`Idempotency::with_wait`]. Its attempts report no in-flight answer
//! of their own: a request that waited is one `waited` event, then one answer.
//!
//! [`Policy::wait_in_flight`]: crate::Policy::wait_in_flight
//! [`Policy::max_waiters`]: crate::Policy::max_waiters

use super::Idempotency;
use crate::answer::Answer;
use crate::changes::{Changes, Subscription};
use crate::event::{Event, EventKind};
use crate::scope::RecordId;
use crate::store::Store;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The duplicates waiting in this process, over every engine.
static WAITERS: AtomicUsize = AtomicUsize::new(0);

/// The polling interval with a change feed: a fallback for an announcement the feed lost.
pub(crate) const FEED_POLL: Duration = Duration::from_secs(1);
/// The first polling interval without a feed; it doubles up to [`MAX_POLL`].
pub(crate) const FIRST_POLL: Duration = Duration::from_millis(20);
/// The longest polling interval without a feed.
pub(crate) const MAX_POLL: Duration = Duration::from_millis(500);

/// What one attempt of a request gave.
pub(crate) enum Attempt<A, T> {
    /// Answered otherwise than "in flight" (or not waiting): the caller's result.
    Done(T),
    /// Answered "in flight": the unused `input` (handler, effect) for the next attempt, and the
    /// `output` to give if the wait ends now.
    InFlight { input: A, output: T },
}

/// One waiter, counted in [`WAITERS`] while it lives.
struct Permit;

impl Permit {
    fn enter(cap: usize) -> Option<Permit> {
        WAITERS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            })
            .ok()
            .map(|_| Permit)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        WAITERS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A duplicate's wait under way.
struct Waiting {
    subscription: Subscription,
    deadline: tokio::time::Instant,
    poll: Duration,
    feed: bool,
    _permit: Permit,
}

impl Waiting {
    /// Waits for a reason to read the record again (a wake-up, the polling interval) and arms
    /// the next one; `false` once the wait is over.
    async fn next(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        if now >= self.deadline {
            return false;
        }
        let until = (now + self.poll).min(self.deadline);
        let woken = tokio::select! {
            () = self.subscription.woken() => true,
            () = tokio::time::sleep_until(until) => false,
        };
        if !woken && tokio::time::Instant::now() >= self.deadline {
            return false;
        }
        if !woken && !self.feed {
            self.poll = (self.poll * 2).min(MAX_POLL);
        }
        self.subscription.arm();
        true
    }
}

/// How many duplicates wait in this process now, over every engine (capped by
/// [`Policy::max_waiters`](crate::Policy::max_waiters)). A gauge for operators.
///
/// ```
/// assert_eq!(idem_core::waiting_now(), 0);
/// ```
pub fn waiting_now() -> usize {
    WAITERS.load(Ordering::Acquire)
}

impl<S: Store> Idempotency<S> {
    /// Runs `attempt(input, quiet)` until it answers otherwise than "in flight", or the wait of
    /// [`Policy::wait_in_flight`](crate::Policy::wait_in_flight) is over (`quiet`: keep an
    /// in-flight answer to itself).
    pub(crate) async fn with_wait<A, T, F, Fut>(&self, id: &RecordId, input: A, mut attempt: F) -> T
    where
        F: FnMut(A, bool) -> Fut,
        Fut: Future<Output = Attempt<A, T>>,
    {
        let Some(max) = self.inner.policy.wait_in_flight else {
            return match attempt(input, false).await {
                Attempt::Done(output) | Attempt::InFlight { output, .. } => output,
            };
        };
        // Listening before the first read: an end between the read and the wait is not missed.
        let mut subscription = self.inner.live.wakeups().subscribe(id.digest());
        subscription.arm();
        let started = Instant::now();
        let (mut input, output) = match attempt(input, true).await {
            Attempt::Done(output) => return output,
            Attempt::InFlight { input, output } => (input, output),
        };
        // Without a timer (the guard style may run on one) a wait cannot be bounded; beyond the
        // process's cap none starts. Either way: in flight at once.
        let cap = self.inner.policy.max_waiters;
        let Some(permit) = super::has_timers().then(|| Permit::enter(cap)).flatten() else {
            self.emit(Event::new(EventKind::InFlight).about(id));
            return output;
        };
        let feed = self.change_feed();
        let mut waiting = Waiting {
            subscription,
            deadline: tokio::time::Instant::now() + max,
            poll: if feed { FEED_POLL } else { FIRST_POLL },
            feed,
            _permit: permit,
        };
        // Reports the wait if the caller goes away while parked: in flight, nothing ran.
        let mut report = Unanswered {
            engine: self,
            id,
            started,
            parked: false,
        };
        let mut last = output;
        loop {
            report.parked = true;
            let again = waiting.next().await;
            report.parked = false;
            let waited = started.elapsed();
            if !again {
                report.ended(waited);
                return last;
            }
            match attempt(input, true).await {
                Attempt::Done(output) => {
                    // How long it waited, not what ran after (its own execution, if any).
                    self.emit(Event::new(EventKind::Waited).about(id).took(waited));
                    return output;
                }
                Attempt::InFlight {
                    input: unused,
                    output,
                } => {
                    input = unused;
                    last = output;
                }
            }
        }
    }

    /// Whether the store's change feed runs here; started on the first ask (in a runtime).
    fn change_feed(&self) -> bool {
        let store = &self.inner.store;
        let live = &self.inner.live;
        live.feed(|| store.capabilities().change_feed && store.watch(Changes::of(live.wakeups())))
    }

    /// After a record changed (completed, given back): wakes this process's duplicates waiting
    /// for it and, under a waiting policy, tells other processes ([`Store::announce`], which
    /// returns at once).
    pub(crate) fn record_changed(&self, id: &RecordId) {
        let wakeups = self.inner.live.wakeups();
        if wakeups.waiting() > 0 {
            wakeups.wake(&id.digest());
        }
        if self.inner.policy.wait_in_flight.is_some() && self.inner.store.capabilities().change_feed
        {
            self.inner.store.announce(id);
        }
    }
}

/// The end of a wait that no other event reports: the wait ran out, or its caller went away
/// while it was parked. Either way the request ends in flight.
struct Unanswered<'a, S> {
    engine: &'a Idempotency<S>,
    id: &'a RecordId,
    started: Instant,
    parked: bool,
}

impl<S> Unanswered<'_, S> {
    /// The wait ran out after `waited`: in flight.
    fn ended(&mut self, waited: Duration) {
        self.parked = false;
        self.report(waited);
    }

    /// Reports `waited`, then the in-flight answer.
    fn report(&self, waited: Duration) {
        let observers = &self.engine.inner.observers;
        observers.emit(Event::new(EventKind::Waited).about(self.id).took(waited));
        let answer = Event::new(EventKind::InFlight).about(self.id);
        observers.emit(answer.took(self.started.elapsed()));
    }
}

impl<S> Drop for Unanswered<'_, S> {
    fn drop(&mut self) {
        if self.parked {
            self.report(self.started.elapsed());
        }
    }
}

/// Whether `answer` says "in flight".
pub(crate) fn is_in_flight(answer: &Answer) -> bool {
    matches!(answer, Answer::InFlight { .. })
}
