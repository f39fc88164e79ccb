//! `Idempotency<S>`: what applications call. Guard ([`Idempotency::begin`]), closure
//! ([`Idempotency::run`]) and transactional closure ([`Idempotency::transact`]) share one
//! admission, reservation, completion and stream of [`Event`]s (C16).

mod detach;
mod gate;
mod give_back;
mod heartbeat;
mod live;
mod mix;
mod persist;
mod run;
mod transact;
mod wait;

pub use heartbeat::KeepAlive;
pub use run::Context;
pub use wait::waiting_now;

use crate::answer::Answer;
use crate::begin::Begin;
use crate::budget::Budget;
use crate::completion::Completion;
use crate::deadline::timer_at;
use crate::doubt::Doubt;
use crate::error::{Error, Field, StoreErrorKind};
use crate::event::{Event, EventKind, Observer, Observers, Operation, TracingObserver};
use crate::lease::{deadline_after, Lease};
use crate::policy::Policy;
use crate::replay_cache::ReplayCache;
use crate::request::{Request, RequestBuilder};
use crate::reservation::Keep;
use crate::response::StoredResponse;
use crate::scope::RecordId;
use crate::store::Deadline;
use crate::store::Reservation;
use crate::store::Store;
pub(crate) use crate::timeout::is_timed_out;
use gate::Gate;
use live::Live;
use mix::AnswerMix;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wait::{is_in_flight, Attempt};

/// The idempotency engine: a [`Store`], a [`Policy`] and the [`Observer`]s of its events.
/// Cloning is cheap (one `Arc`). Its styles (docs/architecture.md, "One type per question"):
///
/// - **closure**: [`run`](Self::run); a started execution outlives a dropped caller (C8).
/// - **transactional closure**: [`transact`](Self::transact) (SQL stores'
///   `run_in_transaction`): effect and completion in one transaction.
/// - **guard**: [`begin`](Self::begin) → effect → [`complete`](Self::complete) (SQL stores: a
///   [`completion`](Self::completion) in the effect's transaction), or
///   [`release`](Self::release) if nothing happened. The caller shields effect-to-`complete`
///   from cancellation (a transaction does).
///
/// ```
/// use idem_core::{Answer, Idempotency, MemoryStore, Outcome, StoredResponse};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let idem = Idempotency::new(MemoryStore::new());
/// let request = idem.request("acct_42", "POST", "/v1/charges")
///     .key(Some("9b2f6c1e"))
///     .body(br#"{"amount":1000}"#)
///     .build()?;
///
/// let first = idem.run(&request, |_ctx| async {
///     Ok::<_, idem_core::Failure<std::io::Error>>(StoredResponse::new(201, r#"{"id":"ch_1"}"#))
/// }).await?;
/// let retry = idem.run(&request, |_ctx| async {
///     Ok::<_, idem_core::Failure<std::io::Error>>(StoredResponse::new(201, "never sent"))
/// }).await?;
///
/// assert!(matches!(first, Outcome::Executed(_)));
/// assert!(matches!(retry, Outcome::Answered(Answer::Replay(ref r)) if r.body == br#"{"id":"ch_1"}"#));
/// # Ok(())
/// # }
/// ```
pub struct Idempotency<S> {
    inner: Arc<Shared<S>>,
}

struct Shared<S> {
    store: S,
    policy: Policy,
    observers: Observers,
    gate: Gate,
    live: Live,
    /// The store's [`process_gate`](crate::store::Capabilities::process_gate).
    process_gate: ProcessGate,
    cache: Option<ReplayCache>,
    /// Whether reservations read first, from how many recent ones were answers.
    mix: AnswerMix,
}

/// Whether an engine's reservations claim their record in the process first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProcessGate {
    /// The store has none.
    Off,
    /// Claims in the registry every engine over this store shares.
    On,
    /// The store has one but no [`identity`](Store::identity) (a wrapper that does not forward
    /// it): reservations are refused.
    Unshareable,
}

impl ProcessGate {
    fn of<S: Store>(store: &S) -> Self {
        match (store.capabilities().process_gate, store.identity()) {
            (false, _) => ProcessGate::Off,
            (true, Some(_)) => ProcessGate::On,
            (true, None) => ProcessGate::Unshareable,
        }
    }
}

impl<S> Clone for Idempotency<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("store", &self.inner.store)
            .field("policy", &self.inner.policy)
            .field("observers", &self.inner.observers)
            .finish()
    }
}

/// Builds an [`Idempotency`]: its policy and the observers of its events.
///
/// ```
/// use idem_core::{Idempotency, MemoryStore, Policy, TracingObserver};
/// use std::time::Duration;
/// let idem = Idempotency::builder(MemoryStore::new())
///     .policy(Policy::default().lease(Duration::from_secs(30)))
///     .build()?;
/// assert_eq!(idem.policy().lease, Duration::from_secs(30));
/// # Ok::<(), idem_core::Error>(())
/// ```
#[must_use]
pub struct IdempotencyBuilder<S> {
    store: S,
    policy: Policy,
    observers: Observers,
    cache: Option<ReplayCache>,
}

impl<S: fmt::Debug> fmt::Debug for IdempotencyBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyBuilder")
            .field("store", &self.store)
            .field("policy", &self.policy)
            .finish()
    }
}

impl<S: Store> IdempotencyBuilder<S> {
    /// The policy (default: [`Policy::default`]).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Adds an observer after those set ([`TracingObserver`] first, unless
    /// [`without_tracing`](Self::without_tracing)).
    pub fn observer(mut self, observer: impl Observer) -> Self {
        self.observers.push(Arc::new(observer));
        self
    }

    /// Answers replays from `cache`, in process memory, before the store ([`ReplayCache`]);
    /// a store without a [`generation`](Store::generation) caches nothing.
    pub fn replay_cache(mut self, cache: ReplayCache) -> Self {
        self.cache = Some(cache);
        self
    }

    /// Removes the default [`TracingObserver`] (and any observer added before).
    pub fn without_tracing(mut self) -> Self {
        self.observers = Observers::default();
        self
    }

    /// The engine, its policy checked by [`Policy::validate`].
    pub fn build(self) -> Result<Idempotency<S>, Error> {
        self.policy.validate()?;
        Ok(self.assemble())
    }

    fn assemble(self) -> Idempotency<S> {
        Idempotency {
            inner: Arc::new(Shared {
                live: Live::of_store(self.store.identity()),
                process_gate: ProcessGate::of(&self.store),
                store: self.store,
                policy: self.policy,
                observers: self.observers,
                gate: Gate::default(),
                cache: self.cache,
                mix: AnswerMix::default(),
            }),
        }
    }
}

/// The first wait between two attempts to store a completion; it doubles up to a second.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(5);
/// The longest wait between two attempts.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The error of a request refused because the engine is shutting down.
fn shutting_down() -> Error {
    Error::store(
        "idem",
        StoreErrorKind::Unavailable,
        "the server is shutting down; retry on another instance",
    )
}

impl<S: Store> Idempotency<S> {
    /// An engine with the default [`Policy`] and the [`TracingObserver`].
    pub fn new(store: S) -> Self {
        Self::builder(store).assemble()
    }

    /// An engine with `policy`, checked by [`Policy::validate`].
    pub fn with_policy(store: S, policy: Policy) -> Result<Self, Error> {
        Self::builder(store).policy(policy).build()
    }

    /// Starts an engine: its policy and observers.
    pub fn builder(store: S) -> IdempotencyBuilder<S> {
        let mut observers = Observers::default();
        observers.push(Arc::new(TracingObserver));
        IdempotencyBuilder {
            store,
            policy: Policy::default(),
            observers,
            cache: None,
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// Starts a [`Request`] from wire parts, with this policy's body limit.
    pub fn request<'a>(
        &self,
        consumer: &'a str,
        method: &'a str,
        route: &'a str,
    ) -> RequestBuilder<'a> {
        Request::builder(consumer, method, route).max_body_bytes(self.inner.policy.max_body_bytes)
    }

    /// Sends `event` to the observers; a landed completion or a release also wakes the
    /// duplicates waiting for the record. For code beside the engine that changes records
    /// (idem-ops' reconciliation).
    pub fn emit(&self, event: Event<'_>) {
        // Only a reservation's steps confirm the store's generation for the replay cache: they
        // are the calls that see the server they ran on (PostgreSQL reads its start time, so a
        // failover behind a pooler moves the generation there; `transact`, which reserves
        // inside, confirms on its own). A purge, a completion, a renewal, a release or a
        // transaction's COMMIT succeeding on a new server behind the same connections would
        // confirm the old generation, and the cache would answer records that server lacks.
        if event.kind() == EventKind::StoreCall
            && event.error().is_none()
            && event.operation() == Some(Operation::Reserve)
        {
            self.store_answered();
        }
        let changed = matches!(
            event.kind(),
            EventKind::CompletionLanded | EventKind::Released
        ) && event.error().is_none();
        if let Some(id) = event.id().filter(|_| changed) {
            self.record_changed(id);
        }
        self.inner.observers.emit(event);
    }

    /// Runs one store call within the policy's store budget (C13), reported as a
    /// [`StoreCall`](EventKind::StoreCall) event (C16). `call` gets the [`Deadline`] to pass on to
    /// the store calls it awaits: this call drops `call` at it, with one timer for all of them
    /// (a task spawned with it, outliving `call`, would have none).
    ///
    /// ```
    /// use idem_core::{Idempotency, MemoryStore, Operation, Store};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem_core::Error> {
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let request = idem.request("acct_1", "POST", "/charges").key(Some("k1")).build()?;
    /// let record = idem
    ///     .store_call(Operation::Lookup, Some(request.id()), |deadline| {
    ///         idem.store().lookup(request.id(), deadline)
    ///     })
    ///     .await?;
    /// assert!(record.is_none());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn store_call<T, F, C>(
        &self,
        operation: Operation,
        id: Option<&RecordId>,
        call: C,
    ) -> Result<T, Error>
    where
        C: FnOnce(Deadline) -> F,
        F: Future<Output = Result<T, Error>>,
    {
        let budget = Budget::new(self.inner.policy.store_timeout);
        self.spend(&budget, operation, id, call).await
    }

    /// The store budget of one request (C13): the request's own, else the policy's.
    pub(crate) fn budget_for(&self, request: &Request) -> Arc<Budget> {
        let total = request
            .store_budget()
            .unwrap_or(self.inner.policy.store_timeout);
        Arc::new(Budget::new(total))
    }

    /// Runs one store call within what is left of `budget`, charged and reported (C13, C16).
    pub(crate) async fn spend<T, F, C>(
        &self,
        budget: &Budget,
        operation: Operation,
        id: Option<&RecordId>,
        call: C,
    ) -> Result<T, Error>
    where
        C: FnOnce(Deadline) -> F,
        F: Future<Output = Result<T, Error>>,
    {
        crate::store_call::spend(budget, operation, id, call, |event| self.emit(event)).await
    }

    /// Waits `pause` between two store steps of a request, charged to its `budget` (C13).
    pub(crate) async fn pause_within(&self, budget: &Budget, pause: Duration) {
        let started = Instant::now();
        self::pause(pause).await;
        budget.charge(started.elapsed());
    }

    /// Answers before the store: body limit however the request was built (413, C12),
    /// shutdown (503), a completed request in the replay cache (C3, C7; from
    /// [`Operation::Cache`]), a duplicate of an execution running here (from memory, C5).
    fn answer_before_store(
        &self,
        request: &Request,
    ) -> Result<Option<(Answer, Option<Operation>)>, Error> {
        let (limit, actual) = (self.inner.policy.max_body_bytes, request.body_len());
        if actual > limit {
            return Err(Error::BodyTooLarge { limit, actual });
        }
        if self.inner.gate.is_closing() {
            return Err(shutting_down());
        }
        if let Some(answer) = self.cached(request) {
            return Ok(Some((answer, Some(Operation::Cache))));
        }
        let running = self.inner.live.answer(request, self.inner.policy.lease);
        Ok(running.map(|answer| (answer, None)))
    }

    /// A store call succeeded: the replay cache may answer at the store's generation.
    pub(crate) fn store_answered(&self) {
        if let Some(cache) = &self.inner.cache {
            if let Some(generation) = self.inner.store.generation() {
                cache.confirm(generation);
            }
        }
    }

    /// The replay cache's answer, screened; one that does not screen is left to the store.
    fn cached(&self, request: &Request) -> Option<Answer> {
        let cache = self.inner.cache.as_ref()?;
        let answer = cache.answer(request, self.inner.store.generation()?)?;
        self.screen(answer).ok()
    }

    /// Where the replay cache keeps what a reservation reads or a completion writes from now
    /// on: `None` without a cache, or a store without a generation.
    pub(crate) fn keep(&self) -> Option<Keep> {
        let cache = self.inner.cache.as_ref()?;
        Some(Keep {
            generation: self.inner.store.generation()?,
            cache: cache.share(),
            read_at: Instant::now(),
        })
    }

    /// Claims the record in this process if the store has a
    /// [`process_gate`](crate::store::Capabilities::process_gate) (else `Ok(None)`); `exclusive`
    /// for one commit (C15). `Err(answer)`: another claim is in the way; the committed record
    /// answers if it can, else that claim does. Never waits.
    async fn claim(
        &self,
        request: &Request,
        exclusive: bool,
        budget: &Budget,
    ) -> Result<Result<Option<live::Claim>, Answer>, Error> {
        match self.inner.process_gate {
            ProcessGate::Off => return Ok(Ok(None)),
            ProcessGate::Unshareable => {
                return Err(Error::store(
                    "idem",
                    StoreErrorKind::Misconfigured,
                    "the store's reservations must be claimed in the process \
                     (Capabilities::process_gate) but it has no identity (Store::identity) to \
                     share the claims by: a wrapper must forward identity()",
                ))
            }
            ProcessGate::On => {}
        }
        let met = match self.inner.live.claim(request, exclusive) {
            Ok(claim) => return Ok(Ok(Some(claim))),
            Err(met) => met,
        };
        // A record under the request's alternative fingerprint is its own (C3): the read
        // fetches its response under either.
        let committed = self.read_answer(request, budget).await?;
        Ok(Err(match committed {
            Some(answer) => self.screen(answer)?,
            None => met,
        }))
    }

    /// The committed record's answer to `request`, if it has one (a store call).
    async fn read_answer(
        &self,
        request: &Request,
        budget: &Budget,
    ) -> Result<Option<Answer>, Error> {
        self.spend(
            budget,
            Operation::Lookup,
            Some(request.id()),
            |deadline| async move {
                let found = self.inner.store.read(request, deadline).await?;
                found.answer(request)
            },
        )
        .await
    }

    /// Filters and checks a replay again before sending (C7, C12), whatever policy wrote it
    /// ([`Error::CorruptRecord`] if invalid). An in-flight `retry_after` is capped at the lease.
    fn screen(&self, answer: Answer) -> Result<Answer, Error> {
        let policy = &self.inner.policy;
        let mut stored = match answer {
            Answer::Replay(stored) => stored,
            Answer::InFlight { retry_after } => {
                return Ok(Answer::InFlight {
                    retry_after: retry_after.min(policy.lease),
                })
            }
            other => return Ok(other),
        };
        stored.retain_headers(|name| policy.allows_header(name));
        stored
            .validate()
            .map_err(|error| Error::CorruptRecord(format!("stored response: {error}")))?;
        Ok(Answer::Replay(stored))
    }

    /// Reports the answer to a request that ran nothing (from `source`), or its acquisition.
    fn report_begin(
        &self,
        id: &RecordId,
        started: Instant,
        result: &Result<Begin, Error>,
        source: Option<Operation>,
    ) {
        let event = match result {
            Ok(Begin::Acquired(lease)) => Event::new(lease.acquired().kind()).of_lease(lease),
            Ok(Begin::Answered(answer)) => answered(answer, id, source),
            Err(error) => Event::new(EventKind::Rejected).about(id).failed(error),
        };
        self.emit(event.took(started.elapsed()));
    }

    /// Reserves the request, or answers it (replay, in flight, mismatch). A body over the limit
    /// is [`Error::BodyTooLarge`], nothing written (C12); during a [`shutdown`](Self::shutdown)
    /// it is refused (503). Under [`Policy::wait_in_flight`](crate::Policy::wait_in_flight) a
    /// duplicate waits for the original's end (C5). Its store steps share one budget (C13).
    pub async fn begin(&self, request: &Request) -> Result<Begin, Error> {
        let budget = self.budget_for(request);
        self.with_wait(request.id(), (), |(), quiet| {
            self.begin_once(request, quiet, &budget)
        })
        .await
    }

    /// One attempt of [`begin`](Self::begin); `quiet`: in flight is left to the wait to report.
    async fn begin_once(
        &self,
        request: &Request,
        quiet: bool,
        budget: &Arc<Budget>,
    ) -> Attempt<(), Result<Begin, Error>> {
        let started = Instant::now();
        let (result, source) = match self.reserve(request, started, budget).await {
            // The steps taken with the lease later draw from the same budget (C13).
            Ok((Begin::Acquired(mut lease), source)) => {
                lease.share_budget(Arc::clone(budget));
                (Ok(Begin::Acquired(lease)), source)
            }
            Ok((begin, source)) => (Ok(begin), source),
            Err(error) => (Err(error), None),
        };
        let in_flight = matches!(&result, Ok(Begin::Answered(answer)) if is_in_flight(answer));
        if !(quiet && in_flight) {
            self.report_begin(request.id(), started, &result, source);
        }
        if in_flight {
            Attempt::InFlight {
                input: (),
                output: result,
            }
        } else {
            Attempt::Done(result)
        }
    }

    /// [`begin_once`](Self::begin_once)'s reservation, or its answer and where it came from.
    async fn reserve(
        &self,
        request: &Request,
        started: Instant,
        budget: &Budget,
    ) -> Result<(Begin, Option<Operation>), Error> {
        if request.one_commit() == Some(true) {
            // The reservation would commit before the effect: refused rather than made two.
            return Err(Error::invalid(
                Field::Config,
                "one commit (C15) needs a transactional closure: the guard and the plain \
                 closure commit the reservation before the effect",
            ));
        }
        if let Some((answer, source)) = self.answer_before_store(request)? {
            return Ok((Begin::Answered(answer), source));
        }
        let _claim = match self.claim(request, false, budget).await? {
            Ok(claim) => claim,
            Err(answer) => return Ok((Begin::Answered(answer), None)),
        };
        let lease_for = self.inner.policy.lease;
        let keep = self.keep();
        let reserved = self
            .spend(
                budget,
                Operation::Reserve,
                Some(request.id()),
                |deadline| async move {
                    let mut steps = (&self.inner.store, deadline);
                    let reservation = Reservation::new(request, lease_for)
                        .keeping(keep)
                        .reading_first(self.inner.mix.reads_first())
                        .inserting_first(self.inner.mix.expects_fresh());
                    reservation.run(&mut steps).await
                },
            )
            .await?;
        self.inner
            .mix
            .counted(matches!(reserved, Begin::Answered(_)));
        let begin = match reserved {
            Begin::Acquired(mut lease) => {
                lease.set_local_deadline(deadline_after(started, lease_for));
                Begin::Acquired(lease)
            }
            Begin::Answered(answer) => Begin::Answered(self.screen(answer)?),
        };
        Ok((begin, None))
    }

    /// The completion of `lease` with `response` as stored and sent: headers filtered (C7),
    /// validated, encoded. One that cannot be stored becomes a stored 500 problem, never a
    /// released key (C8). SQL stores write it with `complete_in`.
    pub fn completion(&self, lease: &Lease, response: StoredResponse) -> Completion {
        let policy = &self.inner.policy;
        let prepared = policy
            .prepare(response)
            .and_then(|r| r.encode().map(|encoded| (r, encoded)));
        let (response, encoded) = match prepared {
            Ok(ok) => ok,
            Err(error) => {
                tracing::error!(
                    target: "idem",
                    consumer = lease.id().consumer(),
                    route = lease.id().route(),
                    %error,
                    "idem.completion: the handler's response cannot be stored; storing a 500"
                );
                let fallback = crate::problem::invalid_response();
                // Filtered like any response, so that what is sent is what a replay sends.
                let fallback = policy.prepare(fallback.clone()).unwrap_or(fallback);
                let encoded = fallback.encode().unwrap_or_default();
                (fallback, encoded)
            }
        };
        Completion::new(lease, response, encoded, policy.retention)
    }

    /// The completion of an unknown outcome (C8): `response` (default: the 500 problem) marked
    /// with `doubt` for a reconciler (docs/state-machine.md, "Records in doubt").
    pub(crate) fn doubtful_completion(
        &self,
        lease: &Lease,
        response: Option<StoredResponse>,
        doubt: Doubt,
    ) -> Completion {
        self.completion(
            lease,
            response.unwrap_or_else(crate::problem::outcome_unknown),
        )
        .in_doubt(&doubt)
    }

    /// Completes the record if the lease holds (C6); returns the response as stored (see
    /// [`completion`](Self::completion)). Store failures are retried with backoff while the
    /// lease lasts, within what is left of the request's store budget (C13; a lease the engine
    /// did not take gets one budget of its own); a retry finding its own earlier write
    /// succeeds (C8). Not stored within them, or refused for good (its stored 500 too): returns
    /// the error, the outcome unknown to the caller, while a task of its own keeps the lease
    /// alive and keeps writing, fenced, until the write lands or another holder takes the
    /// lease, as the engine's other paths do (C8, C16); [`drain`](Self::drain) waits for it.
    pub async fn complete(
        &self,
        lease: Lease,
        response: StoredResponse,
    ) -> Result<StoredResponse, Error>
    where
        S: 'static,
    {
        let completion = self.completion(&lease, response);
        let deadline = lease.local_deadline();
        // Within what is left of the request's one store budget (C13): past it the answer is
        // the error and the write goes on below, never a wait for the lease. A lease the
        // engine did not take (a store's own reservation) has no request, nor maybe a local
        // deadline: one budget of the policy's for this call, never a wait without end.
        let budget = lease
            .budget()
            .unwrap_or_else(|| Arc::new(Budget::new(self.inner.policy.store_timeout)));
        let result = self
            .store_completion(&lease, completion.clone(), deadline, Some(&budget))
            .await;
        match result {
            // As the engine's paths' completions: the lease kept alive and the write going
            // on, never left to a takeover.
            Err(error) if !matches!(error, Error::LeaseLost) => {
                // Never over another execution of this process that took the key over.
                let held = self.inner.live.hold_unless_taken(&lease);
                let hold = (self.keep_alive(lease.clone()), held);
                self.keep_completing(
                    lease,
                    completion,
                    EventKind::Executed,
                    !error.is_retryable(),
                    hold,
                );
                Err(error)
            }
            result => {
                self.report_end(&lease, EventKind::Executed, &result);
                result
            }
        }
    }

    /// Reports an execution whose commit may have landed, its record `unreadable`: in doubt.
    pub(crate) fn report_in_doubt(&self, lease: &Lease, unreadable: &Error) {
        self.emit(
            Event::new(EventKind::InDoubt)
                .of_lease(lease)
                .failed(unreadable),
        );
    }

    /// Reports an execution's one end: `stored` if its answer was stored, else outcome unknown.
    fn report_end(&self, lease: &Lease, stored: EventKind, result: &Result<StoredResponse, Error>) {
        match result {
            Ok(_) => self.emit(Event::new(stored).of_lease(lease)),
            Err(Error::LeaseLost) => {}
            Err(error) => self.emit(
                Event::new(EventKind::OutcomeUnknown)
                    .of_lease(lease)
                    .failed(error),
            ),
        }
    }

    /// Reports the end of a guard-style execution whose `completion` the caller committed
    /// (`complete_in`), as the engine's paths do (C16). Call it after the commit.
    ///
    /// ```
    /// use idem_core::{Begin, Idempotency, MemoryStore, Store, StoredResponse};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem_core::Error> {
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let request = idem.request("acct_1", "POST", "/charges").key(Some("k")).body(b"{}").build()?;
    /// let Begin::Acquired(lease) = idem.begin(&request).await? else { unreachable!() };
    /// let completion = idem.completion(&lease, StoredResponse::new(201, "charged"));
    /// // ... in a SQL store: the effect and `complete_in(&mut tx, &completion)`, then commit ...
    /// # idem.store().complete(&completion, idem_core::store::Deadline::default()).await?;
    /// idem.committed(&completion);
    /// # Ok(())
    /// # }
    /// ```
    pub fn committed(&self, completion: &Completion) {
        let (id, token) = (completion.id(), completion.token());
        for kind in [EventKind::CompletionLanded, EventKind::Executed] {
            self.emit(Event::new(kind).about(id).held_by(token));
        }
    }

    /// Gives the reservation up for a retry (C8) if the lease holds. Only if no effect happened.
    pub async fn release(&self, lease: Lease) -> Result<(), Error> {
        let budget = Budget::new(self.inner.policy.store_timeout);
        self.release_within(lease, &budget).await
    }

    /// Extends the lease by the policy's lease from now (C9) if it holds; a loss is reported.
    pub async fn renew(&self, lease: &mut Lease) -> Result<(), Error> {
        let result = self.renew_lease(lease).await;
        if let Err(error @ Error::LeaseLost) = &result {
            self.emit(
                Event::new(EventKind::LeaseLost)
                    .of_lease(lease)
                    .failed(error),
            );
        }
        result
    }

    /// Renews `lease`; a lost lease is the caller's to report.
    pub(crate) async fn renew_lease(&self, lease: &mut Lease) -> Result<(), Error> {
        let started = Instant::now();
        let lease_for = self.inner.policy.lease;
        let until = self
            .store_call(Operation::Renew, Some(lease.id()), |deadline| {
                self.inner.store.renew(lease, lease_for, deadline)
            })
            .await
            .inspect_err(|error| {
                if matches!(error, Error::LeaseLost) {
                    self.inner.live.lost(lease);
                }
            })?;
        lease.renewed(until, deadline_after(started, lease_for));
        self.inner.live.renewed(lease);
        self.emit(
            Event::new(EventKind::LeaseRenewed)
                .of_lease(lease)
                .took(started.elapsed()),
        );
        Ok(())
    }

    /// Deletes one batch of expired records (at most [`Policy::purge_batch`]); returns how many.
    /// Call it periodically (docs/stores.md, "Purge").
    pub async fn purge_expired(&self) -> Result<usize, Error> {
        let result = self
            .store_call(Operation::Purge, None, |deadline| {
                self.inner
                    .store
                    .purge_expired(self.inner.policy.purge_batch, deadline)
            })
            .await;
        if let Ok(purged) = result {
            let count = u64::try_from(purged).unwrap_or(u64::MAX);
            self.emit(Event::new(EventKind::Purged).with_count(count));
        }
        result
    }

    /// Waits until every execution the engine drives has finished, detached ones included. Call
    /// it after the server stops accepting, before the runtime stops. Without
    /// [`shutdown`](Self::shutdown)'s refusal, an execution may still start after it returns.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let idem = idem_core::Idempotency::new(idem_core::MemoryStore::new());
    /// // ... serve until a shutdown signal ...
    /// idem.drain().await;
    /// # }
    /// ```
    pub async fn drain(&self) {
        self.inner.gate.drained().await;
    }

    /// Refuses every request from now on ("store unavailable", 503 with `Retry-After`), then
    /// [`drain`](Self::drain)s: admitted executions finish, none starts.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem_core::Error> {
    /// use idem_core::{Idempotency, MemoryStore};
    /// let idem = Idempotency::new(MemoryStore::new());
    /// idem.shutdown().await;
    /// let request = idem.request("acct_1", "POST", "/charges").key(Some("k")).body(b"{}").build()?;
    /// let refused = idem.begin(&request).await.unwrap_err();
    /// assert!(matches!(refused, idem_core::Error::Store(_)) && refused.is_retryable());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn shutdown(&self) {
        self.close();
        self.drain().await;
    }

    /// [`shutdown`](Self::shutdown) within `grace`; returns how many were left to their lease.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let idem = idem_core::Idempotency::new(idem_core::MemoryStore::new());
    /// assert_eq!(idem.shutdown_within(std::time::Duration::from_secs(30)).await, 0);
    /// # }
    /// ```
    pub async fn shutdown_within(&self, grace: Duration) -> usize {
        self.close();
        match tokio::time::timeout(grace, self.drain()).await {
            Ok(()) => 0,
            Err(_) => self.inner.gate.running(),
        }
    }

    /// [`shutdown`](Self::shutdown)'s refusal without the wait, for servers that drain their
    /// own connections: close on the signal, [`drain`](Self::drain) once the server stopped.
    ///
    /// ```
    /// let idem = idem_core::Idempotency::new(idem_core::MemoryStore::new());
    /// idem.close();
    /// assert!(idem.is_shutting_down());
    /// ```
    pub fn close(&self) {
        self.inner.gate.close();
    }

    /// Whether [`shutdown`](Self::shutdown) began.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.gate.is_closing()
    }
}

/// The event of an answer that ran nothing, given by `source` (`None`: the store).
pub(crate) fn answered<'a>(
    answer: &Answer,
    id: &'a RecordId,
    source: Option<Operation>,
) -> Event<'a> {
    let event = Event::new(answer_kind(answer)).about(id);
    match source {
        Some(operation) => event.of(operation),
        None => event,
    }
}

/// The event kind of an answer that ran nothing.
pub(crate) fn answer_kind(answer: &Answer) -> EventKind {
    match answer {
        Answer::Replay(_) => EventKind::Replayed,
        Answer::InFlight { .. } => EventKind::InFlight,
        Answer::Mismatch => EventKind::Mismatch,
    }
}

/// Whether the current Tokio runtime has a time driver (without one, making a timer panics).
pub(crate) fn has_timers() -> bool {
    timer_at(Instant::now()).is_some()
}

/// Waits `d`: on Tokio's timer, else its blocking pool, else (no Tokio) this thread.
pub(crate) async fn pause(d: Duration) {
    if tokio::runtime::Handle::try_current().is_err() {
        std::thread::sleep(d);
    } else if has_timers() {
        tokio::time::sleep(d).await;
    } else {
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(d)).await;
    }
}

/// The configuration error of a closure form called without a timer.
pub(crate) fn needs_timers() -> Error {
    Error::invalid(
        Field::Config,
        "the engine's closure forms need a Tokio runtime with its time driver enabled",
    )
}
