//! The closure style: [`Idempotency::run`] and what its handler gets, [`Context`].

use super::detach::{Boxed, Detach};
use super::live::lock;
use super::wait::{is_in_flight, Attempt};
use super::{has_timers, needs_timers, shutting_down, Idempotency};
use crate::begin::Begin;
use crate::budget::Budget;
use crate::completion::Completion;
use crate::doubt::{Doubt, DoubtCause};
use crate::error::Error;
use crate::event::{Event, EventKind};
use crate::lease::Lease;
use crate::outcome::{Failure, Meaning, Outcome, Reply, RunError};
use crate::request::Request;
use crate::response::StoredResponse;
use crate::scope::RecordId;
use crate::store::Store;
use crate::unwind::CatchUnwind;
use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

impl<S: Store + 'static> Idempotency<S> {
    /// Begins; when acquired, runs `handler` and stores its response (402, 409, 5xx are stored
    /// and replayed, C8). A status among the policy's [`refusals`](crate::Policy::refusals) is
    /// [`Outcome::Refused`]: not stored, key released. **A handler that answers such a status
    /// after its effect ran must return [`Reply::Executed`]**, or a retry runs the effect again.
    /// Answered requests never call `handler`. Needs a Tokio runtime with its time driver.
    ///
    /// **Cancellation.** Dropping this future does not cancel a started execution: it runs on as
    /// its own task to completion or release ([`drain`](Self::drain) waits for it). The handler
    /// must not rely on the caller's task-locals; a future kept but never polled holds its key.
    ///
    /// **Waiting** ([`Policy::wait_in_flight`](crate::Policy::wait_in_flight)): a duplicate
    /// replays the original's end, or runs `handler` if the key was given back or the lease
    /// passed; in flight if the wait ends first. Dropped while parked, nothing runs (C8).
    ///
    /// **Lease.** A heartbeat renews it every third of the lease (C9); [`Context::renew`] tells a
    /// handler it still holds it.
    ///
    /// **Errors** (C8, [`Failure`]): [`Failure::nothing_happened`] releases the key
    /// ([`RunError::Released`]); any other error stores a 500 (or [`Failure::unknown_with`]'s
    /// response): [`RunError::Unknown`]. A panic stores a 500, then resumes in the caller. A
    /// completion not stored within the lease is [`RunError::Incomplete`]; the engine keeps
    /// trying on its own task.
    pub async fn run<F, Fut, R, E>(
        &self,
        request: &Request,
        handler: F,
    ) -> Result<Outcome, RunError<E>>
    where
        F: FnOnce(Context<S>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<R, Failure<E>>> + Send + 'static,
        R: Into<Reply> + Send + 'static,
        E: Send + 'static,
    {
        if !has_timers() {
            return Err(RunError::Idem(needs_timers()));
        }
        let budget = self.budget_for(request);
        self.with_wait(request.id(), handler, |handler, quiet| {
            self.run_once(request, handler, quiet, &budget)
        })
        .await
    }

    /// One attempt of [`run`](Self::run): `handler` comes back unused when in flight.
    async fn run_once<F, Fut, R, E>(
        &self,
        request: &Request,
        handler: F,
        quiet: bool,
        budget: &Arc<Budget>,
    ) -> Attempt<F, Result<Outcome, RunError<E>>>
    where
        F: FnOnce(Context<S>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<R, Failure<E>>> + Send + 'static,
        R: Into<Reply> + Send + 'static,
        E: Send + 'static,
    {
        let engine = self.clone();
        let owned = request.clone();
        let budget = Arc::clone(budget);
        // Boxed here, once: the execution moves on as a pointer (see `detach`).
        self.execution(
            request.id(),
            Box::pin(async move {
                let begun = match engine.begin_once(&owned, quiet, &budget).await {
                    Attempt::Done(begun) | Attempt::InFlight { output: begun, .. } => begun,
                };
                match begun {
                    Err(error) => Attempt::Done(Err(RunError::Idem(error))),
                    Ok(Begin::Answered(answer)) if is_in_flight(&answer) => Attempt::InFlight {
                        input: handler,
                        output: Ok(Outcome::Answered(answer)),
                    },
                    Ok(Begin::Answered(answer)) => Attempt::Done(Ok(Outcome::Answered(answer))),
                    Ok(Begin::Acquired(lease)) => {
                        // Boxed here only: an answer's future stays small.
                        Attempt::Done(Box::pin(engine.execute(lease, handler, budget)).await)
                    }
                }
            }),
            |error| Attempt::Done(Err(RunError::Idem(error))),
        )
        .await
    }

    /// Runs `execution` so it outlives its caller ([`Detach`], C8), counted by the shutdown gate
    /// (`refused` once it closed); a panic resumes in the caller.
    pub(crate) async fn execution<T>(
        &self,
        id: &RecordId,
        execution: Boxed<T>,
        refused: impl FnOnce(Error) -> T,
    ) -> T
    where
        T: Send + 'static,
    {
        let Some(running) = self.inner.gate.enter() else {
            let error = shutting_down();
            self.emit(Event::new(EventKind::Rejected).about(id).failed(&error));
            return refused(error);
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return refused(needs_timers());
        };
        // Polled here while the caller waits; handed to the runtime if the caller goes away.
        Detach::new(execution, running, runtime).await
    }

    async fn execute<F, Fut, R, E>(
        self,
        lease: Lease,
        handler: F,
        budget: Arc<Budget>,
    ) -> Result<Outcome, RunError<E>>
    where
        F: FnOnce(Context<S>) -> Fut,
        Fut: Future<Output = Result<R, Failure<E>>>,
        R: Into<Reply>,
    {
        // The live lease and heartbeat last until the answer is stored or given back: a live
        // process's record never looks orphaned.
        let live = self.inner.live.hold(&lease);
        let budget = &*budget;
        let lease = match self.still_held(lease, budget).await {
            Ok(lease) => lease,
            Err(answer) => return answer,
        };
        let keeper = self.keep_alive(lease);
        let shared = Arc::clone(&keeper.lease);
        let ctx = Context {
            idem: self.clone(),
            lease: Arc::clone(&shared),
        };
        // The handler itself may panic before it returns its future: caught as well.
        let result = match catch_unwind(AssertUnwindSafe(|| handler(ctx))) {
            Ok(future) => CatchUnwind::new(future).await,
            Err(panic) => Err(panic),
        };
        let lease = keeper.lease();
        let hold = (keeper, live);
        match result {
            Ok(result) => self.settle(lease, result, hold, budget).await,
            Err(panic) => {
                let completion =
                    self.doubtful_completion(&lease, None, Doubt::new(DoubtCause::Panicked, ""));
                // The panic is what the caller must see; a failed completion goes on trying.
                let _ = self
                    .stored_or_continued(lease, completion, EventKind::OutcomeUnknown, hold, budget)
                    .await;
                resume_unwind(panic)
            }
        }
    }

    /// Before the handler: renews a half-gone lease; a lost one runs nothing (in flight).
    async fn still_held<E>(
        &self,
        mut lease: Lease,
        budget: &Budget,
    ) -> Result<Lease, Result<Outcome, RunError<E>>> {
        let half = self.inner.policy.lease / 2;
        let left = |lease: &Lease| {
            lease.local_deadline().map_or(half, |d| {
                d.saturating_duration_since(std::time::Instant::now())
            })
        };
        if left(&lease) >= half {
            return Ok(lease);
        }
        match self.renew(&mut lease).await {
            Ok(()) => Ok(lease),
            Err(Error::LeaseLost) => Err(Ok(Outcome::Answered(crate::Answer::InFlight {
                retry_after: std::time::Duration::from_secs(1).min(self.inner.policy.lease),
            }))),
            Err(error) => {
                // Unknown: run only if the heartbeat can still renew in time.
                if left(&lease) >= self.inner.policy.lease / 3 {
                    return Ok(lease);
                }
                self.give_back_within(lease, budget).await;
                Err(Err(RunError::Idem(error)))
            }
        }
    }

    /// Completes, releases or checks the record after the handler, as its result says.
    async fn settle<R, E, H: Send + 'static>(
        &self,
        lease: Lease,
        result: Result<R, Failure<E>>,
        hold: H,
        budget: &Budget,
    ) -> Result<Outcome, RunError<E>>
    where
        R: Into<Reply>,
    {
        match result {
            Ok(reply) => match reply.into() {
                Reply::Respond(response) if self.inner.policy.is_refusal(response.status) => {
                    self.give_back(lease, hold, Ok(Outcome::Refused(response)), budget)
                        .await
                }
                Reply::Refused(response) => {
                    self.give_back(lease, hold, Ok(Outcome::Refused(response)), budget)
                        .await
                }
                Reply::Respond(response) | Reply::Executed(response) => {
                    let completion = self.completion(&lease, response);
                    let stored = self
                        .stored_or_continued(lease, completion, EventKind::Executed, hold, budget)
                        .await
                        .map_err(RunError::Incomplete)?;
                    Ok(Outcome::Executed(stored))
                }
                Reply::Completed(completion) => {
                    self.check_written(lease, completion, hold, budget).await
                }
            },
            Err(failure) => match failure.into_parts() {
                (error, Meaning::NothingHappened) => {
                    self.give_back(lease, hold, Err(RunError::Released(error)), budget)
                        .await
                }
                (error, Meaning::Unknown { response, note }) => {
                    let doubt = Doubt::new(DoubtCause::Failure, note);
                    let completion = self.doubtful_completion(&lease, response, doubt);
                    let stored = self
                        .stored_or_continued(
                            lease,
                            completion,
                            EventKind::OutcomeUnknown,
                            hold,
                            budget,
                        )
                        .await;
                    Err(RunError::Unknown {
                        error,
                        response: stored.map_err(RunError::Incomplete)?,
                    })
                }
            },
        }
    }

    /// Nothing happened (C8): the key goes back (fenced), then `answer`. A release fenced out
    /// because the handler's own transaction did commit its completion (a lost answer to its
    /// COMMIT, taken for a rollback) answers what it stored instead: the effect happened. One
    /// fenced out by a record that cannot be read then is in doubt: that commit may have landed.
    async fn give_back<E, H>(
        &self,
        lease: Lease,
        hold: H,
        answer: Result<Outcome, RunError<E>>,
        budget: &Budget,
    ) -> Result<Outcome, RunError<E>> {
        let fenced = self.give_back_unless_fenced(lease, budget).await;
        drop(hold);
        let Some(lease) = fenced else { return answer };
        let (id, token) = (lease.id(), lease.token());
        match self.stored_under(id, token, None, Some(budget)).await {
            Ok(Some(stored)) => {
                for kind in [EventKind::CompletionLanded, EventKind::Executed] {
                    self.emit(Event::new(kind).of_lease(&lease));
                }
                Ok(Outcome::Executed(stored))
            }
            Ok(None) => {
                self.report_release(&lease, &Err(Error::LeaseLost));
                answer
            }
            Err(unreadable) => {
                self.report_in_doubt(&lease, &unreadable);
                Err(RunError::InDoubt(unreadable))
            }
        }
    }

    /// Stores `completion` within the lease and the request's `budget`, and reports the end
    /// (`stored`); past either, or refused, returns the error (the caller answers "outcome
    /// unknown", C8) while a task keeps trying. `hold` lives until the end.
    pub(super) async fn stored_or_continued<H: Send + 'static>(
        &self,
        lease: Lease,
        completion: Completion,
        stored: EventKind,
        hold: H,
        budget: &Budget,
    ) -> Result<StoredResponse, Error> {
        let deadline = lease.local_deadline();
        let result = self
            .store_completion(&lease, completion.clone(), deadline, Some(budget))
            .await;
        match result {
            // Unwritten, refused for good included (its 500 refused too): the lease is held
            // and the write goes on, never left to a takeover.
            Err(error) if !matches!(error, Error::LeaseLost) => {
                let refused = !error.is_retryable();
                self.keep_completing(lease, completion, stored, refused, hold);
                Err(error)
            }
            result => {
                self.report_end(&lease, stored, &result);
                drop(hold);
                result
            }
        }
    }

    /// Checks a completion the handler wrote itself and sends the response **as stored**; if it
    /// is not stored under its token, the outcome is unknown and a 500 is stored.
    async fn check_written<E, H: Send + 'static>(
        &self,
        lease: Lease,
        completion: Completion,
        hold: H,
        budget: &Budget,
    ) -> Result<Outcome, RunError<E>> {
        let lease = &lease;
        let ours = completion.id() == lease.id() && completion.token() == lease.token();
        if ours {
            if let Ok(Some(stored)) = self
                .stored_under(
                    lease.id(),
                    completion.token(),
                    Some(completion.response()),
                    Some(budget),
                )
                .await
            {
                for kind in [EventKind::CompletionLanded, EventKind::Executed] {
                    self.emit(Event::new(kind).of_lease(lease));
                }
                return Ok(Outcome::Executed(stored));
            }
        }
        tracing::error!(
            target: "idem",
            consumer = lease.id().consumer(),
            route = lease.id().route(),
            "idem.run: the handler returned a completion that is not stored; storing a 500"
        );
        let fallback =
            self.doubtful_completion(lease, None, Doubt::new(DoubtCause::CompletionMissing, ""));
        // Like every completion: past the lease it goes on on its own task.
        let stored = self
            .stored_or_continued(
                lease.clone(),
                fallback,
                EventKind::OutcomeUnknown,
                hold,
                budget,
            )
            .await
            .map_err(RunError::Incomplete)?;
        Ok(Outcome::Executed(stored))
    }
}

/// What a [`run`](Idempotency::run) handler gets: its lease (renewable, C9) and a way to
/// complete in its own transaction. Clones share the lease the heartbeat renews.
pub struct Context<S> {
    idem: Idempotency<S>,
    lease: Arc<Mutex<Lease>>,
}

impl<S> Clone for Context<S> {
    fn clone(&self) -> Self {
        Self {
            idem: self.idem.clone(),
            lease: Arc::clone(&self.lease),
        }
    }
}

impl<S> fmt::Debug for Context<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("lease", &self.lease())
            .finish()
    }
}

impl<S> Context<S> {
    /// The lease the handler runs under (as of its last renewal).
    pub fn lease(&self) -> Lease {
        lock(&self.lease).clone()
    }

    /// The key for a downstream provider ([`Lease::downstream_key`]).
    pub fn downstream_key(&self) -> String {
        lock(&self.lease).downstream_key()
    }
}

impl<S: Store> Context<S> {
    /// The engine (to reach the store, for example for a transaction).
    pub fn idem(&self) -> &Idempotency<S> {
        &self.idem
    }

    /// Extends the lease. [`Error::LeaseLost`]: another attempt took over; do not commit.
    pub async fn renew(&mut self) -> Result<(), Error> {
        let mut lease = self.lease();
        self.idem.renew_lease(&mut lease).await?;
        *lock(&self.lease) = lease;
        Ok(())
    }

    /// The completion to write with `complete_in` and return as [`Reply::Completed`].
    pub fn completion(&self, response: StoredResponse) -> Completion {
        self.idem.completion(&self.lease(), response)
    }
}
