//! The transactional closure of SQL stores, written once (C6, C16): the engine drives the
//! protocol around a store's [`Transactional::transact`] and decides from its [`TxEnd`] what
//! becomes of the key: kept with the answer that committed, given back when the transaction
//! provably rolled back, kept in progress when that cannot be told (C8).

use super::wait::{is_in_flight, Attempt};
use super::{answered, has_timers, needs_timers, Idempotency};
use crate::answer::Answer;
use crate::budget::Budget;
use crate::completion::Completion;
use crate::doubt::{Doubt, DoubtCause};
use crate::error::{Error, Field, StoreErrorKind};
use crate::event::{Event, EventKind, Operation};
use crate::lease::{deadline_after, Lease};
use crate::outcome::{Outcome, RunError};
use crate::record::{Record, RecordState};
use crate::request::Request;
use crate::reservation::{Keep, Reservation};
use crate::response::StoredResponse;
use crate::scope::RecordId;
use crate::store::{Execution, Hooks, Transactional, TxEnd};
use std::any::Any;
use std::future::Future;
use std::panic::resume_unwind;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How many times the record of a one-commit execution whose effect ended its transaction is
/// written again before the engine gives up (a store that does not answer), within the
/// request's budget.
const RESERVED_AGAIN_ATTEMPTS: usize = 3;

/// The pause between two of those tries.
const RESERVED_AGAIN_PAUSE: Duration = Duration::from_millis(50);

/// What the engine holds for an acquired transactional execution: the live lease (so that
/// duplicates in this process are answered from memory) and, where the store allows it, the
/// heartbeat.
struct Held {
    lease: Lease,
    _live: super::live::Held,
    _keeper: Option<super::KeepAlive>,
    /// Where a committed answer is kept (the replay cache, as of before the execution).
    keep: Option<Keep>,
}

/// The engine's hooks for one execution.
struct EngineHooks<S> {
    engine: Idempotency<S>,
    started: Instant,
    one_commit: bool,
    budget: Arc<Budget>,
    keep: Option<Keep>,
}

impl<S: Transactional + 'static> Hooks for EngineHooks<S> {
    fn one_commit(&self) -> bool {
        self.one_commit
    }

    fn lease_for(&self) -> Duration {
        self.engine.policy().lease
    }

    fn budget(&self) -> &Budget {
        &self.budget
    }

    fn acquired(&self, mut lease: Lease) -> (Lease, Box<dyn Any + Send>) {
        lease.set_local_deadline(deadline_after(self.started, self.lease_for()));
        let live = self.engine.inner.live.hold(&lease);
        // Renewing from another connection while the effect's transaction is open is only
        // safe where it neither waits for that transaction nor makes it fail (the store says).
        // A one-commit reservation is not there to renew until it commits: what holds it is
        // the transaction itself, and nobody else can take it over meanwhile.
        let keeper =
            (!self.one_commit && self.engine.store().renews_during_transaction() && has_timers())
                .then(|| self.engine.keep_alive(lease.clone()));
        let held = Held {
            lease: lease.clone(),
            _live: live,
            _keeper: keeper,
            keep: self.keep.clone(),
        };
        (lease, Box::new(held))
    }

    fn report_acquired(&self, lease: &Lease) {
        // Reported now, while the effect runs (an execution under way is visible).
        self.engine
            .emit(Event::new(lease.acquired().kind()).of_lease(lease));
    }

    fn completion(&self, lease: &Lease, response: StoredResponse) -> Completion {
        self.engine.completion(lease, response)
    }

    fn emit(&self, event: Event<'_>) {
        self.engine.emit(event)
    }

    fn keep(&self) -> Option<Keep> {
        self.keep.clone()
    }

    fn reads_first(&self) -> bool {
        self.engine.inner.mix.reads_first()
    }

    fn expects_fresh(&self) -> bool {
        self.engine.inner.mix.expects_fresh()
    }
}

impl<S: Transactional + 'static> Idempotency<S> {
    /// The transactional closure of SQL stores (their `run_in_transaction` calls it): reserve;
    /// when acquired, run `effect` in a transaction of the store, write the completion in it
    /// and commit (C6). A dropped caller does not cancel the execution: it goes on as a task
    /// of its own, which [`drain`](Self::drain) waits for (C8).
    ///
    /// - committed: [`Outcome::Executed`] with the response as stored;
    /// - the effect's error: rolled back, the key given back, [`RunError::Released`];
    /// - a store failure before the commit (lost lease, conflict, store down): rolled back,
    ///   the key given back where still ours, [`RunError::Idem`];
    /// - a commit whose answer was lost: the record tells ([`Outcome::Executed`], or given
    ///   back and [`RunError::Idem`]); untold within the store timeout, [`RunError::InDoubt`]
    ///   and the key is kept;
    /// - a panic in the effect: rolled back, the key given back, the panic resumes here.
    ///
    /// Answers never run the effect; under [`Policy::wait_in_flight`](
    /// crate::Policy::wait_in_flight) a duplicate waits for its original's end (C5).
    ///
    /// One commit (C15) when the request says so ([`Request::with_one_commit`](
    /// crate::Request::with_one_commit)), else the policy ([`Policy::one_commit`](
    /// crate::Policy::one_commit)): reservation, effect and completion are one transaction, and
    /// until it commits nothing of the execution exists. A rollback, a panic, a crash or an
    /// effect abandoned at the transaction timeout leave the key free at once, so the retry
    /// runs as the first did: the effect must live entirely in the database. A lost commit
    /// answer is told by the record as above.
    pub async fn transact<E: Send + 'static>(
        &self,
        request: &Request,
        effect: S::Effect<E>,
    ) -> Result<Outcome, RunError<E>> {
        let one_commit = request.one_commit().unwrap_or(self.policy().one_commit);
        if !has_timers() {
            return Err(RunError::Idem(needs_timers()));
        }
        let budget = self.budget_for(request);
        self.with_wait(request.id(), effect, |effect, quiet| {
            self.transact_once(request, effect, one_commit, quiet, &budget)
        })
        .await
    }

    /// One attempt of [`transact`](Self::transact): `effect` comes back unused with an
    /// in-flight answer (not reported when `quiet`), for the next attempt of a wait.
    async fn transact_once<E: Send + 'static>(
        &self,
        request: &Request,
        effect: S::Effect<E>,
        one_commit: bool,
        quiet: bool,
        budget: &Arc<Budget>,
    ) -> Attempt<S::Effect<E>, Result<Outcome, RunError<E>>> {
        let started = Instant::now();
        match self.answer_before_store(request) {
            Err(error) => {
                return Attempt::Done(Err(self.rejected(request.id(), started, error)));
            }
            Ok(Some((answer, source))) => {
                return self.answered(request.id(), started, (answer, source), effect, quiet)
            }
            Ok(None) => {}
        }
        // Held for the whole execution: a one-commit reservation stays uncommitted until its
        // effect commits.
        let claim = match self.claim(request, one_commit, budget).await {
            Ok(Ok(claim)) => claim,
            Ok(Err(answer)) => {
                return self.answered(request.id(), started, (answer, None), effect, quiet);
            }
            Err(error) => {
                return Attempt::Done(Err(self.rejected(request.id(), started, error)));
            }
        };
        let engine = self.clone();
        let owned = request.clone();
        let budget = Arc::clone(budget);
        // Boxed here, once: the execution moves on as a pointer (see `detach`).
        self.execution(
            request.id(),
            Box::pin(async move {
                let _claim = claim;
                let hooks = EngineHooks {
                    keep: engine.keep(),
                    engine: engine.clone(),
                    started,
                    one_commit,
                    budget: Arc::clone(&budget),
                };
                let execution = Execution::new(hooks);
                let store = &engine.inner.store;
                // The store decides a record under the request's alternative fingerprint
                // itself (C3), a reader's answer included: never an execution under the
                // alternative, which would write its record under it.
                let result = store.transact(&owned, effect, execution.clone()).await;
                if let Ok(end) = &result {
                    // The store answered (its steps may not be reported one by one).
                    engine.store_answered();
                    let answered = matches!(end, TxEnd::Answered(..));
                    engine.inner.mix.counted(answered);
                }
                let held = execution
                    .take_acquired()
                    .and_then(|held| held.downcast::<Held>().ok());
                let acquired = match result.map(TxEnd::acquired) {
                    Ok(Err((answer, effect))) => {
                        return match engine.screen(answer) {
                            Ok(answer) => {
                                let answer = (answer, None);
                                engine.answered(owned.id(), started, answer, effect, quiet)
                            }
                            Err(error) => {
                                Attempt::Done(Err(engine.rejected(owned.id(), started, error)))
                            }
                        };
                    }
                    Ok(Ok(end)) => Ok(end),
                    Err(error) => Err(error),
                };
                // Boxed on this path only: an answer (a replay) does not carry the size of
                // what follows an acquisition in its future.
                Attempt::Done(
                    Box::pin(engine.conclude(&owned, started, acquired, held, one_commit, &budget))
                        .await,
                )
            }),
            |error| Attempt::Done(Err(RunError::Idem(error))),
        )
        .await
    }

    /// An answer that ran nothing (screened) and where it came from (`None`: the store),
    /// reported unless it is "in flight" and `quiet`; in flight, the effect comes back for the
    /// next attempt of a wait.
    fn answered<F, E>(
        &self,
        id: &RecordId,
        started: Instant,
        (answer, source): (Answer, Option<Operation>),
        effect: F,
        quiet: bool,
    ) -> Attempt<F, Result<Outcome, RunError<E>>> {
        let in_flight = is_in_flight(&answer);
        if !(quiet && in_flight) {
            self.emit(answered(&answer, id, source).took(started.elapsed()));
        }
        let output = Ok(Outcome::Answered(answer));
        if in_flight {
            Attempt::InFlight {
                input: effect,
                output,
            }
        } else {
            Attempt::Done(output)
        }
    }

    /// What the transaction's end means for the key, and the caller's answer.
    async fn conclude<E>(
        &self,
        request: &Request,
        started: Instant,
        acquired: Result<TxEnd<E>, Error>,
        held: Option<Box<Held>>,
        one_commit: bool,
        budget: &Budget,
    ) -> Result<Outcome, RunError<E>> {
        let id = request.id();
        let (lease, end) = match (acquired, held.as_ref()) {
            (Ok(end), Some(held)) => (held.lease.clone(), end),
            // Failed after acquiring, without saying how the transaction ended: it did not
            // commit (no commit was attempted), so it rolled back.
            (Err(error), Some(held)) => (held.lease.clone(), TxEnd::RolledBack(error)),
            (Ok(_), None) => {
                // The store ran an execution without saying it acquired: the engine knows no
                // lease to conclude with. Whatever committed is in the record, which a retry
                // reads; nothing is given back.
                let error = Error::store(
                    "idem",
                    StoreErrorKind::Misconfigured,
                    "the store ended a transactional execution without calling \
                     Execution::acquired",
                );
                return Err(self.rejected(id, started, error));
            }
            (Err(error), None) => return Err(self.rejected(id, started, error)),
        };
        if one_commit {
            return self
                .concluded_once(request, lease, end, started, held, budget)
                .await;
        }
        match end {
            TxEnd::Committed(completion) => {
                Ok(self.executed(&lease, completion, started, held.as_deref()))
            }
            TxEnd::InDoubt { completion, error } => {
                self.resolve_commit(lease, completion, error, budget).await
            }
            end => Err(self.not_committed(lease, end, held, budget).await),
        }
    }

    /// The guard style's transactional completion: `effect` and the completion of `lease`
    /// (from [`begin`](Self::begin); under the HTTP layer, its `Reservation`) in one
    /// transaction, committed together (C6). The ends mean what they mean for
    /// [`transact`](Self::transact): committed, the [`Completion`] as stored (report it with
    /// [`committed`](Self::committed) once answered); an effect that may have acted outside
    /// the transaction (abandoned at the store's deadline, or committed by itself) keeps the
    /// key with the 500 of an unknown outcome (C8, [`RunError::InDoubt`]). Only
    /// [`RunError::Released`] and [`RunError::Idem`] mean nothing happened.
    ///
    /// While the transaction is open, the lease's heartbeat waits where a renewal from another
    /// connection would fail it ([`Transactional::renews_during_transaction`]): keep such a
    /// transaction shorter than the lease. The effect must not end the transaction itself.
    pub fn complete_transaction<E: Send + 'static>(
        &self,
        lease: &Lease,
        effect: S::Effect<E>,
    ) -> impl Future<Output = Result<Completion, RunError<E>>> + Send + 'static {
        let (engine, lease) = (self.clone(), lease.clone());
        // What the request's reservation left (C13); a budget of its own for a lease the
        // engine did not take.
        let budget = lease
            .budget()
            .unwrap_or_else(|| Arc::new(Budget::new(self.policy().store_timeout)));
        async move {
            let keep = engine.keep();
            let hooks = EngineHooks {
                engine: engine.clone(),
                started: Instant::now(),
                one_commit: false,
                budget: Arc::clone(&budget),
                keep: None,
            };
            // The caller's heartbeat (the HTTP layer's) waits while the transaction is open
            // where a renewal from another connection would fail it (as `transact` does).
            let paused = (!engine.store().renews_during_transaction())
                .then(|| engine.inner.live.pause_renewals(&lease));
            let ended = engine
                .inner
                .store
                .complete_in_transaction(&lease, effect, Execution::new(hooks))
                .await;
            drop(paused);
            match ended {
                Ok(TxEnd::Committed(completion)) => {
                    if let Some(keep) = keep {
                        keep.completed(&completion);
                    }
                    Ok(completion)
                }
                Ok(TxEnd::InDoubt { completion, error }) => engine
                    .resolve_commit(lease, completion.clone(), error, &budget)
                    .await
                    .map(|_| completion),
                Ok(end) => Err(engine.not_committed(lease, end, None, &budget).await),
                // No transaction began: nothing ran.
                Err(error) => Err(engine
                    .not_committed(lease, TxEnd::RolledBack(error), None, &budget)
                    .await),
            }
        }
    }

    /// What an end that did not commit means for the key (two commits): given back when
    /// nothing happened, kept with the 500 of an unknown outcome when the effect may have acted
    /// outside its transaction (C8).
    async fn not_committed<E>(
        &self,
        lease: Lease,
        end: TxEnd<E>,
        held: Option<Box<Held>>,
        budget: &Budget,
    ) -> RunError<E> {
        match end {
            TxEnd::EffectFailed(error) => {
                self.give_back_within(lease, budget).await;
                RunError::Released(error)
            }
            TxEnd::RolledBack(Error::LeaseLost) => {
                self.emit(
                    Event::new(EventKind::LeaseLost)
                        .of_lease(&lease)
                        .failed(&Error::LeaseLost),
                );
                RunError::Idem(Error::LeaseLost)
            }
            TxEnd::RolledBack(error) => {
                // Fenced: after a lost lease this changes nothing.
                self.give_back_within(lease, budget).await;
                RunError::Idem(error)
            }
            TxEnd::Panicked(panic) => {
                self.give_back_within(lease, budget).await;
                resume_unwind(panic)
            }
            // What the effect did outside its transaction is unknown: never given back (C8).
            TxEnd::Abandoned(error) | TxEnd::CommittedByTheEffect(error) => {
                self.kept_unknown(lease, error, held, budget).await
            }
            // The callers answer a commit, told or in doubt, before they get here; one that
            // did arrive is never given back either (the fenced write then changes nothing).
            TxEnd::InDoubt { error, .. } => self.kept_unknown(lease, error, held, budget).await,
            TxEnd::Committed(_) => {
                let error = Error::invalid(Field::Config, "a committed end taken for a failed one");
                self.kept_unknown(lease, error, held, budget).await
            }
        }
    }

    /// The key kept with the 500 of an unknown outcome, which goes on being stored past this
    /// answer if it must (the live lease and the heartbeat last until it lands).
    async fn kept_unknown<E>(
        &self,
        lease: Lease,
        error: Error,
        held: Option<Box<Held>>,
        budget: &Budget,
    ) -> RunError<E> {
        let completion =
            self.doubtful_completion(&lease, None, Doubt::new(DoubtCause::Abandoned, ""));
        let _ = self
            .stored_or_continued(lease, completion, EventKind::OutcomeUnknown, held, budget)
            .await;
        RunError::InDoubt(error)
    }

    /// One reservation step under `lease`'s token, within what is left of the request's
    /// budget: the lease's record, written again if it is gone. Whatever it finds (the record,
    /// or another execution's that took the freed key: nothing to keep then), the fenced write
    /// that follows decides.
    async fn reserved_again(&self, request: &Request, lease: &Lease, budget: &Budget) {
        let reservation = Reservation::new(request, self.inner.policy.lease).under(lease.token());
        let claim = reservation.claim();
        for attempt in 1..=RESERVED_AGAIN_ATTEMPTS {
            let step = self
                .spend(budget, Operation::Reserve, Some(request.id()), |deadline| {
                    self.inner.store.reserve(claim, deadline)
                })
                .await;
            match step {
                Ok(_) => return,
                Err(error) if error.is_retryable() && attempt < RESERVED_AGAIN_ATTEMPTS => {
                    self.pause_within(budget, RESERVED_AGAIN_PAUSE).await;
                }
                Err(error) => {
                    tracing::error!(
                        target: "idem",
                        consumer = request.id().consumer(),
                        route = request.id().route(),
                        %error,
                        "idem.transact: an effect ended its one-commit transaction itself and \
                         its record could not be written again: the key may be free, and what \
                         the effect committed may run again"
                    );
                    return;
                }
            }
        }
    }

    /// The record of `lease` once no transaction holds it, within what is left of the
    /// request's store budget.
    async fn settled(&self, lease: &Lease, budget: &Budget) -> Result<Option<Record>, Error> {
        let id = lease.id();
        self.spend(budget, Operation::Lookup, Some(id), |deadline| {
            self.inner
                .store
                .settled(id, deadline.remaining().mul_f32(0.8))
        })
        .await
    }

    /// Reports a request refused before anything ran.
    fn rejected<E>(&self, id: &RecordId, started: Instant, error: Error) -> RunError<E> {
        self.emit(
            Event::new(EventKind::Rejected)
                .about(id)
                .took(started.elapsed())
                .failed(&error),
        );
        RunError::Idem(error)
    }

    /// A committed execution: reported, kept in the replay cache, and its response as stored.
    fn executed(
        &self,
        lease: &Lease,
        completion: Completion,
        started: Instant,
        held: Option<&Held>,
    ) -> Outcome {
        if let Some(keep) = held.and_then(|held| held.keep.as_ref()) {
            keep.completed(&completion);
        }
        self.emit(Event::new(EventKind::CompletionLanded).of_lease(lease));
        self.emit(
            Event::new(EventKind::Executed)
                .of_lease(lease)
                .took(started.elapsed()),
        );
        Outcome::Executed(completion.into_response())
    }

    /// The end of a one-commit execution (C15): nothing of it exists unless it committed, so
    /// nothing is ever given back; the record tells a commit whose answer was lost.
    async fn concluded_once<E>(
        &self,
        request: &Request,
        lease: Lease,
        end: TxEnd<E>,
        started: Instant,
        held: Option<Box<Held>>,
        budget: &Budget,
    ) -> Result<Outcome, RunError<E>> {
        let rolled_back = |error: Option<&Error>| {
            let event = Event::new(EventKind::Released).of_lease(&lease);
            self.emit(match error {
                Some(error) => event.failed(error),
                None => event,
            });
        };
        match end {
            TxEnd::Committed(completion) => {
                Ok(self.executed(&lease, completion, started, held.as_deref()))
            }
            TxEnd::EffectFailed(error) => {
                rolled_back(None);
                Err(RunError::Released(error))
            }
            TxEnd::RolledBack(error) | TxEnd::Abandoned(error) => {
                rolled_back(Some(&error));
                Err(RunError::Idem(error))
            }
            // The effect's own COMMIT made the reservation a record: it is answered as one.
            // Its own ROLLBACK took the reservation with it, and what it wrote after may be
            // committed: the record is written again under this lease first, so that the
            // answer of an unknown outcome keeps the key (C8).
            TxEnd::CommittedByTheEffect(error) => {
                self.reserved_again(request, &lease, budget).await;
                Err(self.kept_unknown(lease, error, held, budget).await)
            }
            TxEnd::Panicked(panic) => {
                rolled_back(None);
                resume_unwind(panic)
            }
            TxEnd::InDoubt { completion, error } => {
                match self.settled(&lease, budget).await {
                    Ok(Some(record)) if record.is_completed_by(&lease.token()) => {
                        Ok(self.executed(&lease, completion, started, held.as_deref()))
                    }
                    // Not committed: nothing of the execution exists, the key is free.
                    Ok(_) => {
                        rolled_back(Some(&error));
                        Err(RunError::Idem(error))
                    }
                    // Committed or not, a retry is safe: it replays, or runs once.
                    Err(unreadable) => {
                        self.report_in_doubt(&lease, &unreadable);
                        Err(RunError::InDoubt(error))
                    }
                }
            }
        }
    }

    /// A commit whose answer was lost: read the record once no transaction holds it. Completed
    /// under this lease's token, it committed; anything else, it rolled back (a committed
    /// completion carries the token for the whole retention). Unreadable within the store
    /// timeout: in doubt, and the key stays in progress until its lease passes.
    async fn resolve_commit<E>(
        &self,
        lease: Lease,
        completion: Completion,
        error: Error,
        budget: &Budget,
    ) -> Result<Outcome, RunError<E>> {
        match self.settled(&lease, budget).await {
            Ok(Some(record)) if record.token == lease.token() => match record.state {
                RecordState::Completed { response, .. } => {
                    match self.screen(Answer::Replay(response)) {
                        Ok(Answer::Replay(stored)) => {
                            self.emit(Event::new(EventKind::CompletionLanded).of_lease(&lease));
                            self.emit(Event::new(EventKind::Executed).of_lease(&lease));
                            Ok(Outcome::Executed(stored))
                        }
                        _ => {
                            // Committed, with a record that does not screen: what it committed
                            // is the answer the engine made.
                            self.emit(Event::new(EventKind::Executed).of_lease(&lease));
                            Ok(Outcome::Executed(completion.into_response()))
                        }
                    }
                }
                RecordState::InProgress { .. } => {
                    self.give_back_within(lease, budget).await;
                    Err(RunError::Idem(error))
                }
            },
            Ok(_) => {
                // Taken over (or gone): this execution was fenced out, its transaction with it.
                self.emit(
                    Event::new(EventKind::LeaseLost)
                        .of_lease(&lease)
                        .failed(&error),
                );
                Err(RunError::Idem(error))
            }
            Err(unreadable) => {
                self.report_in_doubt(&lease, &unreadable);
                Err(RunError::InDoubt(error))
            }
        }
    }
}
