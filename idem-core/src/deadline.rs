//! The time a store call may take (C13): what is left of the store budget, as an instant.

use crate::event_kind::Operation;
use crate::timeout::timed_out;
use std::future::Future;
use std::time::{Duration, Instant};

/// The instant by which a store call answers, or is dropped with its connection (C13).
///
/// ```
/// use idem_core::store::Deadline;
/// use std::time::Duration;
/// let deadline = Deadline::after(Duration::from_secs(2));
/// assert!(deadline.remaining() <= Duration::from_secs(2));
/// assert!(Deadline::after(Duration::ZERO).remaining().is_zero());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline(Instant, Bounded);

/// Who drops a call at its deadline: the call itself ([`Deadline::bound`] starts a timer), or
/// the engine, which already races the whole store call against one timer of its own, so that
/// the store's `bound` inside it starts none (one timer per store call, not two).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Bounded {
    Here,
    ByCaller,
}

impl Deadline {
    /// Five seconds, [`Policy::store_timeout`](crate::Policy::store_timeout)'s default.
    pub const DEFAULT_BUDGET: Duration = Duration::from_secs(5);

    /// `budget` from now.
    pub fn after(budget: Duration) -> Self {
        let now = Instant::now();
        Self(
            now.checked_add(budget)
                .unwrap_or(now + Duration::from_secs(86_400)),
            Bounded::Here,
        )
    }

    /// The deadline at `instant`.
    pub fn at(instant: Instant) -> Self {
        Self(instant, Bounded::Here)
    }

    /// The same instant, for a call that the caller drops at it (the engine's own
    /// [`bound`](Self::bound) around the whole store call): a `bound` inside starts no timer
    /// of its own. It is never handed to a task that outlives the caller's bound.
    pub(crate) fn bounded_by_caller(self) -> Self {
        Self(self.0, Bounded::ByCaller)
    }

    /// The instant.
    pub fn instant(self) -> Instant {
        self.0
    }

    /// What is left of it (zero once it passed).
    pub fn remaining(self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }

    /// `call`, dropped at the deadline: the store is then unavailable for `operation` (C13).
    /// Without a Tokio time driver only the store's own timeouts bound it.
    ///
    /// ```
    /// use idem_core::store::Deadline;
    /// use idem_core::{Operation, StoreErrorKind};
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let never = std::future::pending::<Result<(), idem_core::Error>>();
    /// let error = Deadline::after(Duration::from_millis(10)).bound(Operation::Lookup, never).await.unwrap_err();
    /// assert_eq!(error.as_store().map(|e| e.kind()), Some(StoreErrorKind::Unavailable));
    /// # }
    /// ```
    pub async fn bound<T, F>(self, operation: Operation, call: F) -> Result<T, crate::Error>
    where
        F: Future<Output = Result<T, crate::Error>>,
    {
        let budget = self.remaining();
        // A spent budget starts nothing: a call polled once could still send its statement
        // (a write nobody waits for) and lose its connection to the drop that follows.
        if budget.is_zero() {
            return Err(timed_out(operation, budget));
        }
        if self.1 == Bounded::ByCaller {
            return call.await;
        }
        let Some(timer) = timer_at(self.0) else {
            return call.await;
        };
        tokio::select! {
            biased;
            result = call => result,
            () = timer => Err(timed_out(operation, budget)),
        }
    }
}

impl Default for Deadline {
    /// [`DEFAULT_BUDGET`](Self::DEFAULT_BUDGET) from now.
    fn default() -> Self {
        Self::after(Self::DEFAULT_BUDGET)
    }
}

/// A timer firing at `instant`, where there is a Tokio time driver.
pub(crate) fn timer_at(instant: Instant) -> Option<tokio::time::Sleep> {
    let instant = tokio::time::Instant::from_std(instant);
    std::panic::catch_unwind(|| tokio::time::sleep_until(instant)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::StoreErrorKind;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// C13: a call given a deadline that has passed is never polled, so it sends nothing (a
    /// reservation retried after its budget ran out must not write a record nobody holds).
    #[tokio::test]
    async fn c13_a_spent_deadline_never_starts_the_call() {
        let polled = AtomicBool::new(false);
        let spent = Deadline::after(Duration::ZERO);
        let result = spent
            .bound(Operation::Reserve, async {
                polled.store(true, Ordering::SeqCst);
                Ok(())
            })
            .await;
        assert!(!polled.load(Ordering::SeqCst), "the call was started");
        let kind = result.expect_err("timed out").as_store().map(|e| e.kind());
        assert_eq!(kind, Some(StoreErrorKind::Unavailable));
        let live = Deadline::after(Duration::from_secs(5));
        assert!(live
            .bound(Operation::Reserve, async { Ok(()) })
            .await
            .is_ok());
    }

    /// C13: inside the engine's bound, a store's own `bound` starts no timer, and the call is
    /// still dropped at the deadline (by the engine's one timer); a spent deadline still starts
    /// nothing, and a deadline handed out to a direct caller keeps its own timer.
    #[tokio::test]
    async fn c13_one_timer_bounds_a_store_call_inside_the_engine() {
        let deadline = Deadline::after(Duration::from_millis(20));
        let inner = deadline.bounded_by_caller();
        let never = std::future::pending::<Result<(), crate::Error>>();
        let store_call = inner.bound(Operation::Lookup, never);
        let error = deadline
            .bound(Operation::Lookup, store_call)
            .await
            .expect_err("dropped at the deadline");
        assert_eq!(
            error.as_store().map(|e| e.kind()),
            Some(StoreErrorKind::Unavailable)
        );
        assert!(inner.remaining().is_zero());

        let polled = AtomicBool::new(false);
        let started = inner
            .bound(Operation::Reserve, async {
                polled.store(true, Ordering::SeqCst);
                Ok(())
            })
            .await;
        assert!(started.is_err() && !polled.load(Ordering::SeqCst));

        let direct = Deadline::after(Duration::from_millis(20));
        let never = std::future::pending::<Result<(), crate::Error>>();
        assert!(direct.bound(Operation::Lookup, never).await.is_err());
    }
}
