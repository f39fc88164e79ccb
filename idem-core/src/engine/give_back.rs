//! Giving the key back when nothing happened (C8): fenced, within what is left of the
//! request's store budget (C13), then, when the store failed in a way that may pass, again on
//! a task of its own until it lands or the lease ends. A key is never left to wait out its
//! lease because the store was down for a moment.

use super::{pause, Idempotency, FIRST_BACKOFF, MAX_BACKOFF};
use crate::budget::Budget;
use crate::error::Error;
use crate::event::{Event, EventKind, Operation};
use crate::lease::{deadline_after, Lease};
use crate::store::Store;
use crate::timeout::is_timed_out;
use std::time::Instant;

impl<S: Store> Idempotency<S> {
    /// [`release`](Self::release) within what is left of a request's `budget` (C13): once it
    /// is spent nothing is sent, and the key is left to its lease.
    pub(crate) async fn release_within(&self, lease: Lease, budget: &Budget) -> Result<(), Error> {
        let result = self.release_once(&lease, budget).await;
        self.report_release(&lease, &result);
        result
    }

    /// One fenced release within what is left of `budget`.
    async fn release_once(&self, lease: &Lease, budget: &Budget) -> Result<(), Error> {
        self.spend(budget, Operation::Release, Some(lease.id()), |deadline| {
            self.inner.store.release(lease, deadline)
        })
        .await
    }

    /// The end of a release: a failed one leaves the key to its lease, still the end of this
    /// execution.
    pub(crate) fn report_release(&self, lease: &Lease, result: &Result<(), Error>) {
        let kind = match result {
            Err(Error::LeaseLost) => EventKind::LeaseLost,
            _ => EventKind::Released,
        };
        let event = Event::new(kind).of_lease(lease);
        match result {
            Ok(()) => self.emit(event),
            Err(error) => self.emit(event.failed(error)),
        }
    }
}

impl<S: Store + 'static> Idempotency<S> {
    /// Gives the key back (nothing happened, C8) within what is left of the request's
    /// `budget`. When the budget is spent, or the store failed in a way that may pass (down,
    /// timed out), the release goes on on a task of its own, each attempt with a budget of its
    /// own, until it lands, the lease is lost or it ends: the corrected retry is not kept
    /// waiting for the lease. Without a runtime it is tried once.
    pub(crate) async fn give_back_within(&self, lease: Lease, budget: &Budget) {
        if let Some(lease) = self.give_back_unless_fenced(lease, budget).await {
            self.report_release(&lease, &Err(Error::LeaseLost));
        }
    }

    /// [`give_back_within`](Self::give_back_within), but a release fenced out (the lease lost,
    /// or the record completed under it) is not reported: its lease comes back, for the caller
    /// to find out which.
    pub(crate) async fn give_back_unless_fenced(
        &self,
        lease: Lease,
        budget: &Budget,
    ) -> Option<Lease> {
        let runtime = tokio::runtime::Handle::try_current();
        // Whether a release is sent here: one that times out spends the budget, yet may land.
        let sent = !budget.is_spent();
        if runtime.is_err() || sent {
            let result = self.release_once(&lease, budget).await;
            if matches!(result, Err(Error::LeaseLost)) {
                return Some(lease);
            }
            if runtime.is_err() || !may_pass(&result) {
                self.report_release(&lease, &result);
                return None;
            }
        }
        let Ok(runtime) = runtime else { return None };
        tracing::warn!(
            target: "idem",
            consumer = lease.id().consumer(),
            route = lease.id().route(),
            "idem: the key could not be given back within the request's store budget; still trying until its lease ends"
        );
        let (engine, running) = (self.clone(), self.inner.gate.enter_always());
        runtime.spawn(async move {
            let _running = running;
            engine.keep_releasing(lease, sent).await;
        });
        None
    }

    /// Releases `lease` until it lands, is refused for good, or the lease ends (by this
    /// process's clock: past it the key is the store's to hand out, and a release is fenced).
    /// After an attempt that may have landed unanswered (`unanswered`), one fenced out by an
    /// absent record is that attempt's: released, not a lost lease.
    async fn keep_releasing(&self, lease: Lease, mut unanswered: bool) {
        let ends = lease
            .local_deadline()
            .unwrap_or_else(|| deadline_after(Instant::now(), self.inner.policy.lease));
        let mut backoff = FIRST_BACKOFF;
        loop {
            let budget = Budget::new(self.inner.policy.store_timeout);
            let mut result = self.release_once(&lease, &budget).await;
            if unanswered && matches!(result, Err(Error::LeaseLost)) {
                let id = lease.id();
                let found = self
                    .spend(&budget, Operation::Lookup, Some(id), |deadline| {
                        self.inner.store.lookup(id, deadline)
                    })
                    .await;
                if matches!(found, Ok(None)) {
                    result = Ok(());
                }
            }
            unanswered |= may_pass(&result);
            let now = Instant::now();
            if !may_pass(&result) || now + backoff >= ends {
                return self.report_release(&lease, &result);
            }
            pause(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

/// Whether a release failed in a way that may pass: the store down or slow, never a lost lease
/// or a refusal.
fn may_pass(result: &Result<(), Error>) -> bool {
    match result {
        Ok(()) | Err(Error::LeaseLost) => false,
        Err(error) => is_timed_out(error) || error.is_retryable(),
    }
}
