//! The store budget of one request (C13): the time the engine may wait on the store for it,
//! counted across every store step (reservation, the store's share of the effect's
//! transaction, completion, retries, rollback). The handler's own time is not counted: the
//! lease bounds it.

use crate::deadline::Deadline;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The budget of the request that took a lease, carried by the lease so that the steps taken
/// with it later (the guard's transactional completion, under the HTTP layer too) draw from it.
/// Not part of a lease's identity: two leases are equal whatever budget they carry.
#[derive(Debug, Clone, Default)]
pub(crate) struct Shared(pub(crate) Option<Arc<Budget>>);

impl PartialEq for Shared {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Shared {}

/// What is left of one request's store budget, shared by its steps.
#[derive(Debug)]
pub(crate) struct Budget {
    pub(crate) total: Duration,
    spent_micros: AtomicU64,
}

impl Budget {
    /// A budget of `total`.
    pub(crate) fn new(total: Duration) -> Self {
        Self {
            total,
            spent_micros: AtomicU64::new(0),
        }
    }

    /// What is left (zero once spent).
    pub(crate) fn remaining(&self) -> Duration {
        let spent = Duration::from_micros(self.spent_micros.load(Ordering::Relaxed));
        self.total.saturating_sub(spent)
    }

    /// Whether nothing is left.
    pub(crate) fn is_spent(&self) -> bool {
        self.remaining().is_zero()
    }

    /// The deadline of the next store step: what is left, from now.
    pub(crate) fn deadline(&self) -> Deadline {
        Deadline::after(self.remaining())
    }

    /// Counts `elapsed` waited on the store.
    pub(crate) fn charge(&self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.spent_micros.fetch_add(micros, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// C13: every step draws from one budget; once spent, the next step's deadline has passed.
    #[test]
    fn c13_steps_share_one_budget() {
        let budget = Budget::new(Duration::from_secs(5));
        budget.charge(Duration::from_secs(2));
        assert_eq!(budget.remaining(), Duration::from_secs(3));
        assert!(budget.deadline().remaining() <= Duration::from_secs(3));
        budget.charge(Duration::from_secs(4));
        assert!(budget.is_spent());
        assert!(budget.deadline().remaining().is_zero());
    }
}
