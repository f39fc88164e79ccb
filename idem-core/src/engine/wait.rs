//! The opt-in bounded wait of a duplicate for its original (C5, [`Policy::wait_in_flight`]):
//! while the answer is "in flight", the duplicate parks on its record's wake-ups (no store
//! connection, no thread), reads the record again when woken (the original ended in this
//! process, or another process announced it through the store's change feed) or when its
//! polling interval passes, and ends with the first answer that is not "in flight", or with
//! "in flight" when its wait is over. At most [`Policy::max_waiters`] wait at once in a process.
//!
//! Every path of the engine waits the same way ([`Idempotency::with_wait`]); the attempts of a
//! wait report no in-flight answer of their own, so a request that waited is one answer in the
//! events, after one `waited` event.
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

/// The polling interval of a waiter whose store has a change feed: a fallback for an
/// announcement the feed lost.
pub(crate) const FEED_POLL: Duration = Duration::from_secs(1);
/// The first polling interval of a waiter whose store has no feed (another process's end is
/// seen only by reading again); it doubles up to [`MAX_POLL`].
pub(crate) const FIRST_POLL: Duration = Duration::from_millis(20);
/// The longest polling interval of a waiter whose store has no feed.
pub(crate) const MAX_POLL: Duration = Duration::from_millis(500);

/// What one attempt of a request gave: its final result, or "in flight" with what it did not
/// use (the handler, the effect) for the next attempt.
pub(crate) enum Attempt<A, T> {
    /// Answered otherwise than "in flight" (or not waiting): the caller's result.
    Done(T),
    /// Answered "in flight"; `output` is the result to give if the wait ends now.
    InFlight {
        /// What the attempt did not use.
        input: A,
        /// The in-flight result.
        output: T,
    },
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

/// How many duplicates wait for their original now in this process, over every engine: what
/// [`Policy::max_waiters`](crate::Policy::max_waiters) caps. A gauge for operators.
///
/// ```
/// assert_eq!(idem_core::waiting_now(), 0);
/// ```
pub fn waiting_now() -> usize {
    WAITERS.load(Ordering::Acquire)
}

impl<S: Store> Idempotency<S> {
    /// Runs `attempt` (given what it needs, and whether it must keep an in-flight answer to
    /// itself) until it answers otherwise than "in flight" or, under a policy that waits
    /// ([`Policy::wait_in_flight`](crate::Policy::wait_in_flight)), until the wait is over.
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
        // A runtime without a timer (the guard style may run on one) cannot bound a wait:
        // answered at once, as beyond the cap.
        if !super::has_timers() {
            self.emit(Event::new(EventKind::InFlight).about(id));
            return output;
        }
        let Some(permit) = Permit::enter(self.inner.policy.max_waiters) else {
            // Beyond the process's cap: in flight at once.
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
        // Reports the wait if the caller goes away while it is parked (a client that
        // disconnected): it ended in flight, nothing ran.
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

    /// Whether this store's change feed runs in this process: started the first time it is
    /// asked (inside a runtime), if the store has one.
    fn change_feed(&self) -> bool {
        let store = &self.inner.store;
        let live = &self.inner.live;
        live.feed(|| store.capabilities().change_feed && store.watch(Changes::of(live.wakeups())))
    }

    /// After a record changed (a completion landed, a reservation given back): wakes the
    /// duplicates of this process waiting for it and, under a policy that waits, tells those
    /// of other processes through the store ([`Store::announce`], which returns at once).
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

impl<S: Store> Unanswered<'_, S> {
    /// The wait ran out after `waited`: in flight.
    fn ended(&mut self, waited: Duration) {
        self.parked = false;
        self.engine
            .emit(Event::new(EventKind::Waited).about(self.id).took(waited));
        self.engine.emit(
            Event::new(EventKind::InFlight)
                .about(self.id)
                .took(self.started.elapsed()),
        );
    }
}

impl<S> Drop for Unanswered<'_, S> {
    fn drop(&mut self) {
        if self.parked {
            let waited = self.started.elapsed();
            self.engine
                .inner
                .observers
                .emit(Event::new(EventKind::Waited).about(self.id).took(waited));
            self.engine
                .inner
                .observers
                .emit(Event::new(EventKind::InFlight).about(self.id).took(waited));
        }
    }
}

/// Whether `answer` says "in flight".
pub(crate) fn is_in_flight(answer: &Answer) -> bool {
    matches!(answer, Answer::InFlight { .. })
}
