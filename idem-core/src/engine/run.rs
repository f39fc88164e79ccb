//! The closure style: [`Idempotency::run`] and what its handler gets, [`Context`].

use super::detach::{Boxed, Detach};
use super::wait::{is_in_flight, Attempt};
use super::{has_timers, needs_timers, shutting_down, Idempotency};
use crate::begin::Begin;
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
use std::sync::{Arc, Mutex, PoisonError};

impl<S: Store + 'static> Idempotency<S> {
    /// The closure style: begin; when acquired, run `handler`, then complete with its response
    /// (a 402 decline, a 409 conflict, a 5xx are stored and replayed, C8), unless its status is
    /// one of the policy's [`refusals`](crate::Policy::refusals) (400, 404, 422...: the request
    /// was refused before it executed), which is answered as [`Outcome::Refused`], not stored,
    /// the key released. **A handler that answers such a status after its effect ran must
    /// return [`Reply::Executed`]**, else the retry runs the effect again. Replays, in-flight
    /// duplicates and mismatches never call `handler`. Needs a Tokio runtime with its time driver (what
    /// `#[tokio::main]` builds); without one nothing runs and the error says so.
    ///
    /// **Cancellation.** The execution outlives the future returned here: it is polled in the
    /// caller's task while the caller waits, and if that future is dropped (the client
    /// disconnected and the server dropped the request's future), the execution goes on as a
    /// task of its own to its completion or release, and a retry gets its answer. So the
    /// handler must not rely on the caller's task-locals, and a caller that keeps this future
    /// must poll it to its end (or drop it): one kept but never polled again holds its key. Before the
    /// runtime shuts down, [`shutdown`](Self::shutdown) or [`drain`](Self::drain) waits for
    /// such executions.
    ///
    /// **Waiting** (opt-in, [`Policy::wait_in_flight`](crate::Policy::wait_in_flight)): a duplicate
    /// of a running execution waits for its end and gets its replay; if the original gave the
    /// key back (or its lease passed), this `handler` runs instead; if the wait ends first, the
    /// in-flight answer. Waiting holds no store connection and no thread; dropping this future
    /// while it is parked cancels the wait, and nothing runs; a read of the record already
    /// under way when it is dropped goes on like any request whose reservation was sent (C8):
    /// if it acquires the key, the handler runs to its end.
    ///
    /// **Lease.** While the handler runs, the engine renews its lease on a heartbeat (every third
    /// of the policy's lease, from a thread of its own), so a slow handler is never taken over
    /// while its process lives; [`Context::renew`] is there for handlers that want to know they
    /// still hold it. A duplicate arriving in this process meanwhile is answered in flight
    /// without asking the store.
    ///
    /// **Errors** (C8), see [`Failure`]: [`Failure::nothing_happened`] releases the key and
    /// returns [`RunError::Released`]; any other error (what `?` gives) means the outcome is
    /// unknown: a 500 problem (or the response given with [`Failure::unknown_with`]) is stored
    /// for the key and returned in [`RunError::Unknown`]. A handler that panics is treated the
    /// same (a 500 is stored), then the panic resumes in the caller. If a completion cannot be
    /// stored within the lease, [`RunError::Incomplete`] (answer 500) while the engine goes on
    /// trying on its own task until it lands or another attempt takes the lease.
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
        self.with_wait(request.id(), handler, |handler, quiet| {
            self.run_once(request, handler, quiet)
        })
        .await
    }

    /// One attempt of [`run`](Self::run): `handler` comes back unused with an in-flight answer
    /// (not reported when `quiet`), for the next attempt of a wait.
    async fn run_once<F, Fut, R, E>(
        &self,
        request: &Request,
        handler: F,
        quiet: bool,
    ) -> Attempt<F, Result<Outcome, RunError<E>>>
    where
        F: FnOnce(Context<S>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<R, Failure<E>>> + Send + 'static,
        R: Into<Reply> + Send + 'static,
        E: Send + 'static,
    {
        let engine = self.clone();
        let owned = request.clone();
        // Boxed here, once: the execution moves on as a pointer (see `detach`).
        self.execution(
            request.id(),
            Box::pin(async move {
                let begun = match engine.begin_once(&owned, quiet).await {
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
                        // Boxed on this path only: an answer does not carry the size of an
                        // execution in its future.
                        Attempt::Done(Box::pin(engine.execute(lease, handler)).await)
                    }
                }
            }),
            |error| Attempt::Done(Err(RunError::Idem(error))),
        )
        .await
    }

    /// Runs `execution` so that it outlives its caller ([`Detach`]), counted by the shutdown gate
    /// (refused once shutdown began, with `refused` of the error): a dropped caller does not
    /// cancel it (C8), and a panic in it resumes in the caller.
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

    async fn execute<F, Fut, R, E>(self, lease: Lease, handler: F) -> Result<Outcome, RunError<E>>
    where
        F: FnOnce(Context<S>) -> Fut,
        Fut: Future<Output = Result<R, Failure<E>>>,
        R: Into<Reply>,
    {
        // The live lease and the heartbeat last until the completion, the release or the check
        // has finished (or, past the lease, until the completion landed): the record of a live
        // process must never look orphaned while its answer is being stored.
        let live = self.inner.live.hold(&lease);
        let lease = match self.still_held(lease).await {
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
            Ok(result) => self.settle(lease, result, hold).await,
            Err(panic) => {
                let completion =
                    self.doubtful_completion(&lease, None, Doubt::new(DoubtCause::Panicked, ""));
                // The panic is what the caller must see; a failed completion goes on trying.
                let _ = self
                    .stored_or_continued(lease, completion, EventKind::OutcomeUnknown, hold)
                    .await;
                resume_unwind(panic)
            }
        }
    }

    /// Before the handler runs: a lease that is half gone (the execution's task waited behind a
    /// busy or blocked worker after its reservation) is renewed first, and one that passed and
    /// was taken never runs the handler: another attempt holds the key (answered in flight).
    /// Nothing has run yet, so nothing is lost by not running.
    async fn still_held<E>(&self, mut lease: Lease) -> Result<Lease, Result<Outcome, RunError<E>>> {
        let half = self.inner.policy.lease / 2;
        let left = lease.local_deadline().map_or(half, |d| {
            d.saturating_duration_since(std::time::Instant::now())
        });
        if left >= half {
            return Ok(lease);
        }
        match self.renew_lease(&mut lease).await {
            Ok(()) => Ok(lease),
            Err(Error::LeaseLost) => {
                self.emit(
                    Event::new(EventKind::LeaseLost)
                        .of_lease(&lease)
                        .failed(&Error::LeaseLost),
                );
                Err(Ok(Outcome::Answered(crate::Answer::InFlight {
                    retry_after: std::time::Duration::from_secs(1).min(self.inner.policy.lease),
                })))
            }
            Err(error) => {
                // The store did not say: run only if the heartbeat can renew before the lease
                // ends (it tries at a third of the lease, sooner when less is left).
                let left = lease.local_deadline().map_or(half, |d| {
                    d.saturating_duration_since(std::time::Instant::now())
                });
                if left >= self.inner.policy.lease / 3 {
                    return Ok(lease);
                }
                // Too little left to run anything safely: nothing ran, the key goes back.
                let _ = self.release(lease).await;
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
    ) -> Result<Outcome, RunError<E>>
    where
        R: Into<Reply>,
    {
        match result {
            Ok(reply) => match reply.into() {
                Reply::Respond(response) if self.inner.policy.is_refusal(response.status) => {
                    self.refuse(lease, response, hold).await
                }
                Reply::Refused(response) => self.refuse(lease, response, hold).await,
                Reply::Respond(response) | Reply::Executed(response) => {
                    let completion = self.completion(&lease, response);
                    let stored = self
                        .stored_or_continued(lease, completion, EventKind::Executed, hold)
                        .await
                        .map_err(RunError::Incomplete)?;
                    Ok(Outcome::Executed(stored))
                }
                Reply::Completed(completion) => self.check_written(lease, completion, hold).await,
            },
            Err(failure) => match failure.into_parts() {
                (error, Meaning::NothingHappened) => {
                    // A failed release only means the reservation passes with its lease
                    // (reported by `release`); the handler said nothing happened.
                    let _ = self.release(lease).await;
                    drop(hold);
                    Err(RunError::Released(error))
                }
                (error, Meaning::Unknown { response, note }) => {
                    let doubt = Doubt::new(DoubtCause::Failure, note);
                    let completion = self.doubtful_completion(&lease, response, doubt);
                    let stored = self
                        .stored_or_continued(lease, completion, EventKind::OutcomeUnknown, hold)
                        .await;
                    Err(RunError::Unknown {
                        error,
                        response: stored.map_err(RunError::Incomplete)?,
                    })
                }
            },
        }
    }

    /// A request the handler refused before it executed (C8): nothing is stored, the key goes
    /// back (fenced: a lost lease changes nothing), and the caller sends `response`.
    async fn refuse<E, H>(
        &self,
        lease: Lease,
        response: StoredResponse,
        hold: H,
    ) -> Result<Outcome, RunError<E>> {
        // A failed release only means the reservation passes with its lease (reported by
        // `release`); the answer is the handler's all the same.
        let _ = self.release(lease).await;
        drop(hold);
        Ok(Outcome::Refused(response))
    }

    /// Stores `completion` within the lease and reports the execution's end (`stored`: what
    /// kind of end a stored answer is); past the lease, the caller gets the error
    /// ([`RunError::Incomplete`]) and the engine goes on trying on a task of its own, which
    /// reports the end when it comes. `hold` (heartbeat, live lease) lives until then.
    pub(super) async fn stored_or_continued<H: Send + 'static>(
        &self,
        lease: Lease,
        completion: Completion,
        stored: EventKind,
        hold: H,
    ) -> Result<StoredResponse, Error> {
        let deadline = lease.local_deadline();
        let result = self
            .store_completion(&lease, completion.clone(), deadline)
            .await;
        match result {
            Err(error) if error.is_retryable() && !matches!(error, Error::LeaseLost) => {
                self.keep_completing(lease, completion, stored, hold);
                Err(error)
            }
            result => {
                self.report_end(&lease, stored, &result);
                drop(hold);
                result
            }
        }
    }

    /// A handler returned a completion it says it wrote in its own transaction: check that the
    /// record carries its token, completed, and send the response **as stored** (what every
    /// retry gets, even if the handler returned another). If not (its transaction rolled back,
    /// or it never wrote it), the outcome is unknown: a 500 is stored, never a success for an
    /// unrecorded effect.
    async fn check_written<E, H: Send + 'static>(
        &self,
        lease: Lease,
        completion: Completion,
        hold: H,
    ) -> Result<Outcome, RunError<E>> {
        let lease = &lease;
        let ours = completion.id() == lease.id() && completion.token() == lease.token();
        if ours {
            if let Some(stored) = self.stored_under(lease.id(), &completion).await {
                self.emit(Event::new(EventKind::CompletionLanded).of_lease(lease));
                self.emit(Event::new(EventKind::Executed).of_lease(lease));
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
            .stored_or_continued(lease.clone(), fallback, EventKind::OutcomeUnknown, hold)
            .await
            .map_err(RunError::Incomplete)?;
        Ok(Outcome::Executed(stored))
    }
}

/// What a [`run`](Idempotency::run) handler gets: the lease it runs under, a way to renew it
/// when the work may outlast it (C9), and a way to complete inside its own transaction. Clones
/// share the lease as the engine's heartbeat renews it.
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
        self.lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The idempotency key to send a downstream provider for this request's effect: the
    /// same on every retry and takeover of the record (see [`Lease::downstream_key`]).
    pub fn downstream_key(&self) -> String {
        self.lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .downstream_key()
    }
}

impl<S: Store> Context<S> {
    /// The engine (to reach the store, for example for a transaction).
    pub fn idem(&self) -> &Idempotency<S> {
        &self.idem
    }

    /// Extends the lease (heartbeat). [`Error::LeaseLost`] means another attempt took the
    /// record over: stop, and do not commit the effect.
    pub async fn renew(&mut self) -> Result<(), Error> {
        let mut lease = self.lease();
        self.idem.renew_lease(&mut lease).await?;
        *self.lease.lock().unwrap_or_else(PoisonError::into_inner) = lease;
        Ok(())
    }

    /// The completion of this lease with `response`, to write inside the effect's transaction
    /// with a SQL store's `complete_in`; then return it from the handler ([`Reply::Completed`]).
    pub fn completion(&self, response: StoredResponse) -> Completion {
        self.idem.completion(&self.lease(), response)
    }
}
