//! Storing a completion once the effect may have run (C6, C8): retried, recognised when an
//! earlier attempt landed, replaced by a stored 500 when refused for good, continued on its own
//! task past the caller's answer. A slow store never causes a second execution.

use super::{is_timed_out, pause, Idempotency, FIRST_BACKOFF, MAX_BACKOFF};
use crate::answer::Answer;
use crate::budget::Budget;
use crate::completion::Completion;
use crate::doubt::{Doubt, DoubtCause};
use crate::error::Error;
use crate::event::{Event, EventKind, Operation};
use crate::lease::Lease;
use crate::record::RecordState;
use crate::response::StoredResponse;
use crate::store::Store;
use crate::token::FencingToken;
use std::time::{Duration, Instant};

impl<S: Store> Idempotency<S> {
    /// Stores `completion`, trying until `deadline` (`None`: for ever) or until a request's
    /// `budget` is spent (`None`: each call has the policy's); returns the response as stored.
    /// One refused for good is replaced by a stored 500 (C8).
    pub(crate) async fn store_completion(
        &self,
        lease: &Lease,
        completion: Completion,
        deadline: Option<Instant>,
        budget: Option<&Budget>,
    ) -> Result<StoredResponse, Error> {
        match self.persist(&completion, deadline, None, budget).await {
            Err(error) if !matches!(error, Error::LeaseLost) && !error.is_retryable() => {
                self.emit(
                    Event::new(EventKind::CompletionRefused)
                        .of_lease(lease)
                        .failed(&error),
                );
                self.persist(&self.refused_fallback(lease), deadline, None, budget)
                    .await
            }
            result => result,
        }
    }

    /// Writes `completion`, retrying until `deadline`, `timeouts` timeouts in a row, or the
    /// request's `budget` is spent.
    async fn persist(
        &self,
        completion: &Completion,
        deadline: Option<Instant>,
        timeouts: Option<u32>,
        budget: Option<&Budget>,
    ) -> Result<StoredResponse, Error> {
        let store = &self.inner.store;
        let (id, token) = (completion.id(), completion.token());
        let event = |kind| Event::new(kind).about(id).held_by(token);
        let mut backoff = FIRST_BACKOFF;
        let mut timed_out = 0u32;
        loop {
            let started = Instant::now();
            let keep = self.keep();
            // Without a request's budget, each attempt has one of its own.
            let own = Budget::new(self.inner.policy.store_timeout);
            let attempt = self
                .spend(
                    budget.unwrap_or(&own),
                    Operation::Complete,
                    Some(id),
                    |deadline| store.complete(completion, deadline),
                )
                .await;
            let error = match attempt {
                Ok(()) => {
                    if let Some(keep) = keep {
                        keep.completed(completion);
                    }
                    self.emit(event(EventKind::CompletionLanded).took(started.elapsed()));
                    return Ok(completion.response().clone());
                }
                Err(Error::LeaseLost) => return self.landed(completion, budget).await,
                Err(error) if error.is_retryable() => error,
                Err(error) => return Err(error),
            };
            timed_out = if is_timed_out(&error) {
                timed_out + 1
            } else {
                0
            };
            if deadline.is_some_and(|d| Instant::now() + backoff >= d)
                || timeouts.is_some_and(|most| timed_out >= most)
                || budget.is_some_and(|b| b.remaining() <= backoff)
            {
                return Err(error);
            }
            self.emit(event(EventKind::CompletionRetried).failed(&error));
            match budget {
                Some(budget) => self.pause_within(budget, backoff).await,
                None => pause(backoff).await,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// After a fenced-out write: if an earlier attempt landed under this token, the stored
    /// response is the answer (what retries replay); otherwise the lease was lost.
    async fn landed(
        &self,
        completion: &Completion,
        budget: Option<&Budget>,
    ) -> Result<StoredResponse, Error> {
        let (id, token) = (completion.id(), completion.token());
        let event = |kind| Event::new(kind).about(id).held_by(token);
        let expected = Some(completion.response());
        match self.stored_under(id, token, expected, budget).await {
            Ok(Some(stored)) => {
                self.emit(event(EventKind::CompletionLanded));
                Ok(stored)
            }
            // Unread, the budget spent: it may have landed; a later attempt reads it.
            Err(error) if is_timed_out(&error) => Err(error),
            Ok(None) | Err(_) => {
                self.emit(event(EventKind::LeaseLost).failed(&Error::LeaseLost));
                Err(Error::LeaseLost)
            }
        }
    }

    /// The response completed under `token`, screened as a replay; a warning when it is not
    /// the `expected` one. Read failures are retried within `budget` (`None`: one of its own),
    /// then returned, never taken for "lost".
    pub(crate) async fn stored_under(
        &self,
        id: &crate::scope::RecordId,
        token: FencingToken,
        expected: Option<&StoredResponse>,
        budget: Option<&Budget>,
    ) -> Result<Option<StoredResponse>, Error> {
        let own = Budget::new(self.inner.policy.store_timeout);
        let budget = budget.unwrap_or(&own);
        let mut backoff = FIRST_BACKOFF;
        let record = loop {
            match self
                .spend(budget, Operation::Lookup, Some(id), |deadline| {
                    self.inner.store.lookup(id, deadline)
                })
                .await
            {
                Ok(Some(record)) => break record,
                Ok(None) => return Ok(None),
                Err(error) if error.is_retryable() && backoff < budget.remaining() => {
                    self.pause_within(budget, backoff).await;
                    // A pause that overslept the budget leaves the last failure the answer.
                    if budget.is_spent() {
                        return Err(error);
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Err(error) => return Err(error),
            }
        };
        match record.state {
            RecordState::Completed { response, .. } if record.token == token => {
                if expected.is_some_and(|expected| *expected != response) {
                    tracing::warn!(
                        target: "idem",
                        consumer = id.consumer(),
                        route = id.route(),
                        "idem: the completion stored under this execution differs from the one at hand; answering the stored one"
                    );
                }
                match self.screen(Answer::Replay(response)) {
                    Ok(Answer::Replay(stored)) => Ok(Some(stored)),
                    _ => Ok(None),
                }
            }
            _ => Ok(None),
        }
    }

    /// The stored 500 in place of a completion the store refused (C8).
    fn refused_fallback(&self, lease: &Lease) -> Completion {
        self.doubtful_completion(lease, None, Doubt::new(DoubtCause::CompletionRefused, ""))
    }
}

impl<S: Store + 'static> Idempotency<S> {
    /// Keeps storing `completion` on its own task (C8), with `hold`; [`drain`](Self::drain) waits.
    /// One `refused` for good, its 500 too, goes on as the 500.
    pub(crate) fn keep_completing<H: Send + 'static>(
        &self,
        lease: Lease,
        completion: Completion,
        stored: EventKind,
        refused: bool,
        hold: H,
    ) {
        let running = self.inner.gate.enter_always();
        tracing::warn!(
            target: "idem",
            consumer = lease.id().consumer(),
            route = lease.id().route(),
            "idem: the completion could not be stored; still trying"
        );
        // A caller polling on no Tokio runtime (the guard style allows one) has its
        // continuation on the heartbeat's: never a panic, never the key left to a takeover.
        let runtime = tokio::runtime::Handle::try_current()
            .ok()
            .or_else(super::heartbeat::heartbeat_runtime);
        let Some(runtime) = runtime else {
            tracing::error!(
                target: "idem",
                consumer = lease.id().consumer(),
                route = lease.id().route(),
                "idem: no runtime to keep storing the completion on; the key is left to its lease"
            );
            return;
        };
        let continuation = Continuation {
            engine: self.clone(),
            lease,
            completion,
            stored,
            refused,
            _hold: hold,
            _running: running,
        };
        // Wrapped before the task: one dropped unpolled (a runtime stopping) goes on too.
        runtime.spawn(Unfinished(Some(continuation)).run());
    }

    /// Past the lease, until the completion lands or the lease is taken. One that keeps timing
    /// out while the store answers other calls is replaced by the small 500 of C8; a store slow
    /// for everything gets the real one again. One refused for good is replaced by the 500,
    /// tried again after each refusal (a disk freed, a constraint dropped), at most
    /// [`MAX_BACKOFF`] apart, until the record is found no longer this execution's.
    async fn complete_past_lease(
        &self,
        lease: &Lease,
        mut completion: Completion,
        mut stored: EventKind,
        // Set once the 500 is what is written; then each refusal waits before the next try.
        mut refusal_pause: Option<Duration>,
    ) -> (EventKind, Result<StoredResponse, Error>) {
        let refused = |error: &Error| !matches!(error, Error::LeaseLost) && !error.is_retryable();
        loop {
            let result = match self
                .persist(&completion, None, Some(TIMEOUTS_BEFORE_FALLBACK), None)
                .await
            {
                Err(error) if is_timed_out(&error) && refusal_pause.is_none() => {
                    // The 500 only if a read succeeds and the completion times out again.
                    let id = lease.id();
                    let probe = self
                        .store_call(Operation::Lookup, Some(id), |deadline| {
                            self.inner.store.lookup(id, deadline)
                        })
                        .await;
                    if probe.is_err() {
                        if let Some(end) = self.lost_unread(&completion) {
                            return (stored, end);
                        }
                        continue;
                    }
                    match self.persist(&completion, None, Some(1), None).await {
                        Err(error) if is_timed_out(&error) => {
                            let fallback = self.refused_fallback(lease);
                            let result = self
                                .persist(&fallback, None, Some(TIMEOUTS_BEFORE_FALLBACK), None)
                                .await;
                            if matches!(&result, Err(again) if is_timed_out(again)) {
                                continue;
                            }
                            if result.is_ok() {
                                self.emit(
                                    Event::new(EventKind::CompletionRefused)
                                        .of_lease(lease)
                                        .failed(&error),
                                );
                            }
                            (completion, stored) = (fallback, EventKind::OutcomeUnknown);
                            refusal_pause = Some(FIRST_BACKOFF);
                            result
                        }
                        result => result,
                    }
                }
                result => result,
            };
            match result {
                Err(error) if refused(&error) => {
                    // The completion refused: its 500 next; the 500 refused: tried again.
                    let kind = match refusal_pause {
                        None => EventKind::CompletionRefused,
                        Some(_) => EventKind::CompletionRetried,
                    };
                    self.emit(Event::new(kind).of_lease(lease).failed(&error));
                    if let Some(wait) = refusal_pause {
                        pause(wait).await;
                        // A store may refuse before it looks at the token: ask whose it is.
                        if let Some(end) = self.no_longer_held(&completion).await {
                            return (stored, end);
                        }
                    }
                    let next = refusal_pause.map_or(FIRST_BACKOFF, |wait| wait * 2);
                    refusal_pause = Some(next.min(MAX_BACKOFF));
                    (completion, stored) =
                        (self.refused_fallback(lease), EventKind::OutcomeUnknown);
                }
                // Timed out again while writing the 500: it goes on.
                Err(error) if error.is_retryable() && !matches!(error, Error::LeaseLost) => {}
                result => return (stored, result),
            }
        }
    }

    /// After a refusal: `None` while the record is still in progress under `completion`'s
    /// token, or cannot be read and the heartbeat has not found the lease taken; else how the
    /// continuation ends, landed under it or lost.
    async fn no_longer_held(
        &self,
        completion: &Completion,
    ) -> Option<Result<StoredResponse, Error>> {
        let id = completion.id();
        let found = self
            .store_call(Operation::Lookup, Some(id), |deadline| {
                self.inner.store.lookup(id, deadline)
            })
            .await;
        match found {
            Err(_) => self.lost_unread(completion),
            Ok(Some(record)) if record.token == completion.token() => match record.state {
                RecordState::InProgress { .. } => None,
                RecordState::Completed { .. } => Some(self.landed(completion, None).await),
            },
            Ok(_) => Some(self.lease_lost(completion)),
        }
    }

    /// With the record unread: the end (lost) if the heartbeat found the lease taken.
    fn lost_unread(&self, completion: &Completion) -> Option<Result<StoredResponse, Error>> {
        let lost = self
            .inner
            .live
            .was_lost(completion.id(), completion.token());
        lost.then(|| self.lease_lost(completion))
    }

    /// Reports `completion`'s lease lost: the continuation's end.
    fn lease_lost(&self, completion: &Completion) -> Result<StoredResponse, Error> {
        let event = Event::new(EventKind::LeaseLost)
            .about(completion.id())
            .held_by(completion.token());
        self.emit(event.failed(&Error::LeaseLost));
        Err(Error::LeaseLost)
    }
}

/// Timeouts in a row, past the lease, before the small stored 500 is tried instead.
const TIMEOUTS_BEFORE_FALLBACK: u32 = 3;

/// A completion going on on its own task (C8), with what it holds: the lease kept alive, the
/// registration of its execution, its place in [`drain`](Idempotency::drain)'s count.
struct Continuation<S: Store + 'static, H: Send + 'static> {
    engine: Idempotency<S>,
    lease: Lease,
    completion: Completion,
    stored: EventKind,
    refused: bool,
    _hold: H,
    _running: super::gate::Running,
}

/// A continuation whose task is dropped before it ended (its runtime stopped: one made for a
/// single call, a test's) goes on on the heartbeat's runtime, from its start, with what it
/// holds: the key is never left to a takeover while the process lives (C8), and the
/// execution still reports its one end (C16).
struct Unfinished<S: Store + 'static, H: Send + 'static>(Option<Continuation<S, H>>);

impl<S: Store + 'static, H: Send + 'static> Unfinished<S, H> {
    /// Stores the completion past the lease, then reports the execution's one end (C16).
    async fn run(mut self) {
        // Owned copies: what it holds (`Send` only) is never borrowed across a wait.
        let parts = self.0.as_ref().map(|this| {
            let (engine, lease) = (this.engine.clone(), this.lease.clone());
            let (completion, stored, refusal_pause) = if this.refused {
                let fallback = engine.refused_fallback(&lease);
                (fallback, EventKind::OutcomeUnknown, Some(FIRST_BACKOFF))
            } else {
                (this.completion.clone(), this.stored, None)
            };
            (engine, lease, completion, stored, refusal_pause)
        });
        if let Some((engine, lease, completion, stored, refusal_pause)) = parts {
            let (kind, result) = engine
                .complete_past_lease(&lease, completion, stored, refusal_pause)
                .await;
            engine.report_end(&lease, kind, &result);
        }
        // Ended: what it holds is let go.
        self.0 = None;
    }
}

impl<S: Store + 'static, H: Send + 'static> Drop for Unfinished<S, H> {
    fn drop(&mut self) {
        let Some(continuation) = self.0.take() else {
            return;
        };
        // The heartbeat's runtime never stops while the process runs; a panic (a store's bug)
        // is not run again and again.
        if crate::heartbeat_thread::on_heartbeat_thread() || std::thread::panicking() {
            return;
        }
        if let Some(runtime) = super::heartbeat::heartbeat_runtime() {
            runtime.spawn(Unfinished(Some(continuation)).run());
        }
    }
}
