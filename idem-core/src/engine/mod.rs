//! `Idempotency<S>`: what applications call.

use crate::answer::Answer;
use crate::begin::Begin;
use crate::completion::Completion;
use crate::error::{Error, Field, StoreErrorKind};
use crate::lease::{deadline_after, Lease};
use crate::outcome::{Failure, Meaning, Outcome, Reply, RunError};
use crate::policy::Policy;
use crate::problem::problem;
use crate::record::RecordState;
use crate::request::{Request, RequestBuilder};
use crate::response::StoredResponse;
use crate::store::Store;
use crate::unwind::CatchUnwind;
use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tracing::Instrument;

/// The idempotency engine: a [`Store`] and a [`Policy`]. Cloning is cheap (one `Arc`).
///
/// Two styles, both first-class:
///
/// - **closure**: [`run`](Self::run) reserves, runs the handler, completes or releases, on a
///   task of its own: dropping the future that awaits it (a client disconnecting from a hyper or
///   axum server) does not cancel an execution that has started (C8).
/// - **guard**: [`begin`](Self::begin) → [`Begin::Acquired`] → run the effect →
///   [`complete`](Self::complete) (or [`release`](Self::release) when nothing happened). SQL
///   stores write a [`completion`](Self::completion) inside the effect's own transaction. A
///   guard-style caller that can be cancelled between the effect and `complete` must protect
///   that stretch itself (a transaction does: the effect vanishes with it).
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
    /// Executions of `run` under way (detached from their callers), for `drain`.
    running: AtomicUsize,
    idle: Notify,
}

impl<S> Shared<S> {
    fn new(store: S, policy: Policy) -> Self {
        Self {
            store,
            policy,
            running: AtomicUsize::new(0),
            idle: Notify::new(),
        }
    }
}

/// Counts one execution of `run` from the moment it is spawned until it ends, so that `drain`
/// never misses one that has not started yet.
struct Running<S>(Arc<Shared<S>>);

impl<S> Running<S> {
    fn start(shared: Arc<Shared<S>>) -> Self {
        shared.running.fetch_add(1, Ordering::SeqCst);
        Self(shared)
    }
}

impl<S> Drop for Running<S> {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
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
            .finish()
    }
}

/// The first wait between two attempts to store a completion; it doubles up to a second.
const FIRST_BACKOFF: Duration = Duration::from_millis(5);

impl<S: Store> Idempotency<S> {
    /// An engine with the default [`Policy`].
    pub fn new(store: S) -> Self {
        Self {
            inner: Arc::new(Shared::new(store, Policy::default())),
        }
    }

    /// An engine with `policy`, checked by [`Policy::validate`].
    pub fn with_policy(store: S, policy: Policy) -> Result<Self, Error> {
        policy.validate()?;
        Ok(Self {
            inner: Arc::new(Shared::new(store, policy)),
        })
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

    /// Checks what the policy says of a request before anything is written: its body must be
    /// within [`Policy::max_body_bytes`] ([`Error::BodyTooLarge`], 413), however the request was
    /// built (C12). [`begin`](Self::begin) calls it; a store's own closure form must too.
    pub fn admit(&self, request: &Request) -> Result<(), Error> {
        let limit = self.inner.policy.max_body_bytes;
        if request.body_len() > limit {
            return Err(Error::BodyTooLarge {
                limit,
                actual: request.body_len(),
            });
        }
        Ok(())
    }

    /// Filters and checks a replayed response again before it is sent (C7, C12): a record
    /// written under another policy, or by hand, can neither leak a cookie nor inject a header;
    /// one that fails the check is [`Error::CorruptRecord`]. [`begin`](Self::begin) calls it; a
    /// store's own closure form must too. An in-flight answer's `retry_after` is at most the
    /// lease: a store that read its clock a moment before another caller (another process)
    /// reserved can compute a little more. Mismatches pass unchanged.
    pub fn screen(&self, answer: Answer) -> Result<Answer, Error> {
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
        stored.retain_headers(|name| policy.stores_header(name));
        stored
            .validate()
            .map_err(|error| Error::CorruptRecord(format!("stored response: {error}")))?;
        Ok(Answer::Replay(stored))
    }

    /// Reserves the request, or answers it without running anything (replay, in flight,
    /// mismatch). A body over the policy's limit is [`Error::BodyTooLarge`] however the
    /// request was built, and nothing is written (C12).
    pub async fn begin(&self, request: &Request) -> Result<Begin, Error> {
        self.admit(request)?;
        let policy = &self.inner.policy;
        let started = Instant::now();
        let result = self.inner.store.reserve(request, policy.lease).await;
        let result = match result {
            Ok(Begin::Acquired(mut lease)) => {
                lease.set_local_deadline(deadline_after(started, policy.lease));
                Ok(Begin::Acquired(lease))
            }
            Ok(Begin::Answered(answer)) => self.screen(answer).map(Begin::Answered),
            Err(error) => Err(error),
        };
        let outcome = match &result {
            Ok(Begin::Acquired(lease)) => match lease.acquired() {
                crate::Acquire::Fresh => "acquired",
                crate::Acquire::TakeOver { .. } => "took_over",
                crate::Acquire::StartOver { .. } => "started_over",
            },
            Ok(Begin::Answered(Answer::Replay(_))) => "replay",
            Ok(Begin::Answered(Answer::InFlight { .. })) => "in_flight",
            Ok(Begin::Answered(Answer::Mismatch)) => "mismatch",
            Err(_) => "error",
        };
        tracing::debug!(
            target: "idem",
            consumer = request.id().consumer(),
            route = request.id().route(),
            outcome,
            latency_us = micros(started),
            error = result.as_ref().err().map(tracing::field::display),
            "idem.begin"
        );
        result
    }

    /// The completion of `lease` with `response`, as it will be stored and sent: headers
    /// filtered by the policy (C7), validated, encoded. A response that cannot be stored (a
    /// status outside 100..=599, a header value with CR or LF, a header name that is not a
    /// token) becomes a stored 500 problem: the effect may have run, so the key is never given
    /// back for it and the client never sees a 4xx for a server's fault (C8).
    ///
    /// A SQL store writes it inside the effect's transaction (`complete_in`); [`complete`](
    /// Self::complete) writes it on its own.
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
                let fallback = problem(
                    500,
                    "invalid-response",
                    "The server produced a response that could not be stored.",
                    false,
                );
                // Filtered like any response, so that what is sent is what a replay sends.
                let fallback = policy.prepare(fallback.clone()).unwrap_or(fallback);
                let encoded = fallback.encode().unwrap_or_default();
                (fallback, encoded)
            }
        };
        Completion::new(lease, response, encoded, policy.retention)
    }

    /// Stores the response and completes the record, if the lease still holds (C6); returns the
    /// response as stored (see [`completion`](Self::completion)).
    ///
    /// A store failure is retried with backoff while the lease lasts, and a retry that finds its
    /// own earlier attempt landed succeeds: the effect has run, so the key must not pass to a
    /// takeover while the completion can still be stored (C8).
    pub async fn complete(
        &self,
        lease: Lease,
        response: StoredResponse,
    ) -> Result<StoredResponse, Error> {
        let completion = self.completion(&lease, response);
        let stored = self.store_completion(&lease, completion).await?;
        Ok(stored.into_response())
    }

    /// Gives the reservation up so a retry can run (C8), if the lease still holds. Call it only
    /// when the effect did not happen.
    pub async fn release(&self, lease: Lease) -> Result<(), Error> {
        let started = Instant::now();
        let result = self.inner.store.release(&lease).await;
        trace_fenced("idem.release", &lease, started, &result);
        result
    }

    /// Extends a long handler's lease by the policy's lease from now (C9), if it still holds.
    pub async fn renew(&self, lease: &mut Lease) -> Result<(), Error> {
        let started = Instant::now();
        let lease_for = self.inner.policy.lease;
        let result = self.inner.store.renew(lease, lease_for).await;
        trace_fenced("idem.renew", lease, started, &result);
        lease.renewed(result?, deadline_after(started, lease_for));
        Ok(())
    }

    /// Deletes one batch of expired records (at most [`Policy::purge_batch`]); returns how many.
    /// Call it periodically (docs/stores.md, "Purge").
    pub async fn purge_expired(&self) -> Result<usize, Error> {
        self.inner
            .store
            .purge_expired(self.inner.policy.purge_batch)
            .await
    }

    /// Stores `completion` within the lease; returns what was stored. A completion the store
    /// refuses for good (a response too large for it, an unexpected failure) is replaced by a
    /// stored 500: the effect has run, so the key must not pass to a takeover (C8).
    async fn store_completion(
        &self,
        lease: &Lease,
        completion: Completion,
    ) -> Result<Completion, Error> {
        let started = Instant::now();
        let deadline = lease.local_deadline();
        let mut result = self
            .complete_within_lease(&completion, deadline)
            .await
            .map(|()| completion);
        if let Err(error) = &result {
            if !matches!(error, Error::LeaseLost) && !error.is_retryable() {
                tracing::error!(
                    target: "idem",
                    consumer = lease.id().consumer(),
                    route = lease.id().route(),
                    %error,
                    "idem.complete: the store refused the completion; storing a 500"
                );
                let fallback = self.completion(lease, outcome_unknown());
                result = self
                    .complete_within_lease(&fallback, deadline)
                    .await
                    .map(|()| fallback);
            }
        }
        trace_fenced("idem.complete", lease, started, &result);
        result
    }

    /// Stores `completion`, retrying store failures that a retry may fix until `deadline`.
    async fn complete_within_lease(
        &self,
        completion: &Completion,
        deadline: Option<Instant>,
    ) -> Result<(), Error> {
        let store = &self.inner.store;
        let mut backoff = FIRST_BACKOFF;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            match store.complete(completion).await {
                Ok(()) => return Ok(()),
                Err(Error::LeaseLost) => {
                    // An earlier attempt (ours, or the store's own retry on a new connection) may
                    // have landed and only its answer been lost: the record then carries this
                    // token and exactly this response.
                    return match store.lookup(completion.id()).await {
                        Ok(Some(record))
                            if record.token == completion.token()
                                && matches!(&record.state, RecordState::Completed { response, .. } if response == completion.response()) =>
                        {
                            Ok(())
                        }
                        _ => Err(Error::LeaseLost),
                    };
                }
                Err(error @ Error::Store(_)) if error.is_retryable() => {
                    let Some(deadline) = deadline else {
                        return Err(error);
                    };
                    if Instant::now() + backoff >= deadline {
                        return Err(error);
                    }
                    tracing::warn!(
                        target: "idem",
                        consumer = completion.id().consumer(),
                        route = completion.id().route(),
                        attempts,
                        %error,
                        "idem.complete: retrying within the lease"
                    );
                    pause(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(error) => return Err(error),
            }
        }
    }
}

impl<S: Store + 'static> Idempotency<S> {
    /// The closure style: begin; when acquired, run `handler`, then complete with its response
    /// (any status: a 402 is stored and replayed, C8). Replays, in-flight duplicates and
    /// mismatches never call `handler`. Needs a Tokio runtime with its time driver (what
    /// `#[tokio::main]` builds); without one nothing runs and the error says so.
    ///
    /// **Cancellation.** Everything runs on a task of its own: if the future returned here is
    /// dropped (the client disconnected and the server dropped the request's future), the
    /// execution goes on to its completion or release, and a retry gets its answer. Before the
    /// runtime shuts down, [`drain`](Self::drain) waits for such executions.
    ///
    /// **Lease.** While the handler runs, the engine renews its lease on a heartbeat (every third
    /// of the policy's lease), so a slow handler is never taken over while its process lives;
    /// [`Context::renew`] is there for handlers that want to know they still hold it.
    ///
    /// **Errors** (C8), see [`Failure`]: [`Failure::nothing_happened`] releases the key and
    /// returns [`RunError::Released`]; any other error (what `?` gives) means the outcome is
    /// unknown: a 500 problem (or the response given with [`Failure::unknown_with`]) is stored
    /// for the key and returned in [`RunError::Unknown`]. A handler that panics is treated the
    /// same (a 500 is stored), then the panic resumes in the caller. If a completion cannot be
    /// stored within the lease, [`RunError::Incomplete`] (answer 500).
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
            return Err(RunError::Idem(Error::invalid(
                Field::Config,
                "Idempotency::run needs a Tokio runtime with its time driver enabled",
            )));
        }
        self.run_detached(request, move |engine, lease| engine.execute(lease, handler))
            .await
    }

    /// The frame of every closure form, for a store's own too: begin; when acquired, run
    /// `execute` with the engine and the lease; replays, in-flight duplicates and mismatches are
    /// returned without calling it. All of it runs on a task of its own, which
    /// [`drain`](Self::drain) waits for and a dropped caller does not cancel (C8). A panic in
    /// `execute` resumes in the caller.
    pub async fn run_detached<F, Fut, E>(
        &self,
        request: &Request,
        execute: F,
    ) -> Result<Outcome, RunError<E>>
    where
        F: FnOnce(Self, Lease) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Outcome, RunError<E>>> + Send + 'static,
        E: Send + 'static,
    {
        let engine = self.clone();
        let request = request.clone();
        let task = self.detach(async move {
            let lease = match engine.begin(&request).await.map_err(RunError::Idem)? {
                Begin::Acquired(lease) => lease,
                Begin::Answered(answer) => return Ok(Outcome::Answered(answer)),
            };
            execute(engine, lease).await
        });
        match task.await {
            Ok(result) => result,
            Err(join) => match join.try_into_panic() {
                Ok(panic) => resume_unwind(panic),
                Err(join) => Err(RunError::Incomplete(Error::store(
                    "runtime",
                    StoreErrorKind::Unavailable,
                    format!(
                        "the execution task did not finish (the runtime is shutting down): {join}"
                    ),
                ))),
            },
        }
    }

    /// Runs `execution` on a task of its own, which [`drain`](Self::drain) waits for: for a
    /// store's own closure form, so that a dropped caller does not cancel an execution and a
    /// shutdown can wait for it. Needs a Tokio runtime.
    pub fn detach<T, F>(&self, execution: F) -> tokio::task::JoinHandle<T>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let running = Running::start(Arc::clone(&self.inner));
        // In the caller's span: the execution's events carry the request's trace (a client
        // that went away does not take its trace with it).
        tokio::spawn(
            async move {
                let _running = running;
                execution.await
            }
            .instrument(tracing::Span::current()),
        )
    }

    /// Waits until every execution started by [`run`](Self::run) (or a store's closure form,
    /// through [`detach`](Self::detach)) has finished, including those whose callers went away. Call it on shutdown, after the server stopped accepting requests
    /// and before the runtime stops: a runtime that shuts down cancels the tasks still running,
    /// and their effects would then be left to a takeover.
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
        let inner = &self.inner;
        loop {
            let idle = inner.idle.notified();
            if inner.running.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }

    async fn execute<F, Fut, R, E>(self, lease: Lease, handler: F) -> Result<Outcome, RunError<E>>
    where
        F: FnOnce(Context<S>) -> Fut,
        Fut: Future<Output = Result<R, Failure<E>>>,
        R: Into<Reply>,
    {
        // The heartbeat lives until the completion, the release or the check has finished: the
        // record of a live process must never look orphaned while its answer is being stored.
        let keeper = self.keep_alive(lease);
        // Let the heartbeat start before the handler: a handler that blocks its worker thread
        // would otherwise keep it in that worker's slot, never renewed.
        tokio::task::yield_now().await;
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
        let settled = match result {
            Ok(result) => self.settle(lease, result).await,
            Err(panic) => {
                let completion = self.completion(&lease, outcome_unknown());
                // The panic is what the caller must see; a failed completion is logged.
                let _ = self.store_completion(&lease, completion).await;
                drop(keeper);
                resume_unwind(panic)
            }
        };
        drop(keeper);
        settled
    }

    /// Completes, releases or checks the record after the handler, as its result says.
    async fn settle<R, E>(
        &self,
        lease: Lease,
        result: Result<R, Failure<E>>,
    ) -> Result<Outcome, RunError<E>>
    where
        R: Into<Reply>,
    {
        match result {
            Ok(reply) => match reply.into() {
                Reply::Respond(response) => {
                    let completion = self.completion(&lease, response);
                    let stored = self
                        .store_completion(&lease, completion)
                        .await
                        .map_err(RunError::Incomplete)?;
                    Ok(Outcome::Executed(stored.into_response()))
                }
                Reply::Completed(completion) => self.check_written(&lease, completion).await,
            },
            Err(failure) => match failure.into_parts() {
                (error, Meaning::NothingHappened) => {
                    // A failed release only means the reservation passes with its lease
                    // (logged by `release`); the handler said nothing happened.
                    let _ = self.release(lease).await;
                    Err(RunError::Released(error))
                }
                (error, Meaning::Unknown(response)) => {
                    let response = response.unwrap_or_else(outcome_unknown);
                    let completion = self.completion(&lease, response);
                    let stored = self
                        .store_completion(&lease, completion)
                        .await
                        .map_err(RunError::Incomplete)?;
                    Err(RunError::Unknown {
                        error,
                        response: stored.into_response(),
                    })
                }
            },
        }
    }

    /// Reads `lease`'s record, retrying store failures that a retry may fix while the lease
    /// lasts: a completion committed in the handler's transaction must not be taken for a
    /// missing one because one read failed (a 500 would be sent while the 2xx is stored).
    async fn lookup_within_lease(
        &self,
        lease: &Lease,
    ) -> Result<Option<crate::store::Record>, Error> {
        let deadline = lease.local_deadline();
        let mut backoff = FIRST_BACKOFF;
        loop {
            match self.inner.store.lookup(lease.id()).await {
                Err(error) if error.is_retryable() => match deadline {
                    Some(deadline) if Instant::now() + backoff < deadline => {
                        pause(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(1));
                    }
                    _ => return Err(error),
                },
                result => return result,
            }
        }
    }

    /// A handler returned a completion it says it wrote in its own transaction: check that the
    /// record carries its token, completed, and send the response **as stored** (what every
    /// retry gets, even if the handler returned another). If not (its transaction rolled back,
    /// or it never wrote it), the outcome is unknown: a 500 is stored, never a success for an
    /// unrecorded effect.
    async fn check_written<E>(
        &self,
        lease: &Lease,
        completion: Completion,
    ) -> Result<Outcome, RunError<E>> {
        let ours = completion.id() == lease.id() && completion.token() == lease.token();
        if ours {
            if let Ok(Some(record)) = self.lookup_within_lease(lease).await {
                if let (true, RecordState::Completed { response, .. }) =
                    (record.token == lease.token(), record.state)
                {
                    // What every retry will get is what is stored: send exactly that.
                    if response != *completion.response() {
                        tracing::warn!(
                            target: "idem",
                            consumer = lease.id().consumer(),
                            route = lease.id().route(),
                            "idem.run: the handler's completion differs from the one it stored; sending the stored one"
                        );
                    }
                    return match self.screen(Answer::Replay(response)) {
                        Ok(Answer::Replay(stored)) => Ok(Outcome::Executed(stored)),
                        Ok(_) => Err(RunError::Incomplete(Error::CorruptRecord(
                            "a completed record screened to another answer".to_owned(),
                        ))),
                        Err(error) => Err(RunError::Incomplete(error)),
                    };
                }
            }
        }
        tracing::error!(
            target: "idem",
            consumer = lease.id().consumer(),
            route = lease.id().route(),
            "idem.run: the handler returned a completion that is not stored; storing a 500"
        );
        let fallback = self.completion(lease, outcome_unknown());
        let stored = self
            .store_completion(lease, fallback)
            .await
            .map_err(RunError::Incomplete)?;
        Ok(Outcome::Executed(stored.into_response()))
    }

    /// Keeps `lease` alive while the returned guard lives: renews it on a heartbeat, every third
    /// of the policy's lease, until the guard is dropped or the lease is lost (C9). For a store's
    /// own closure form, around an effect that may outlast the lease; [`run`](Self::run) does it
    /// for its handler. Needs a Tokio runtime with timers.
    pub fn keep_alive(&self, lease: Lease) -> KeepAlive {
        let lease = Arc::new(Mutex::new(lease));
        let beat = tokio::spawn(
            self.clone()
                .heartbeat(Arc::clone(&lease))
                .instrument(tracing::Span::current()),
        );
        KeepAlive { lease, beat }
    }

    /// Renews the shared lease every third of the policy's lease until aborted or lost.
    async fn heartbeat(self, shared: Arc<Mutex<Lease>>) {
        let period = (self.inner.policy.lease / 3).max(Duration::from_millis(1));
        loop {
            tokio::time::sleep(period).await;
            let mut lease = shared
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            match self.renew(&mut lease).await {
                Ok(()) => *shared.lock().unwrap_or_else(PoisonError::into_inner) = lease,
                Err(Error::LeaseLost) => return,
                Err(_) => {} // the store is down: try again next beat
            }
        }
    }
}

/// A lease kept alive by a heartbeat; see [`Idempotency::keep_alive`]. Dropping it stops the
/// heartbeat.
#[derive(Debug)]
pub struct KeepAlive {
    lease: Arc<Mutex<Lease>>,
    beat: tokio::task::JoinHandle<()>,
}

impl KeepAlive {
    /// The lease as of its last renewal.
    pub fn lease(&self) -> Lease {
        self.lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.beat.abort();
    }
}

/// Whether the current Tokio runtime has a time driver (a timer can be made). Tokio has no
/// question for it: making a timer without one panics (the panic hook prints it once).
fn has_timers() -> bool {
    catch_unwind(|| drop(tokio::time::sleep(Duration::ZERO))).is_ok()
}

/// Waits `d` between two completion attempts: on Tokio's timer where there is one, else on
/// the blocking pool, else (no Tokio at all, guard style on another executor) on this thread.
async fn pause(d: Duration) {
    if tokio::runtime::Handle::try_current().is_err() {
        std::thread::sleep(d);
    } else if has_timers() {
        tokio::time::sleep(d).await;
    } else {
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(d)).await;
    }
}

/// The answer stored when a handler's outcome is unknown.
fn outcome_unknown() -> StoredResponse {
    problem(
        500,
        "outcome-unknown",
        "The request failed and may have taken effect; it will not be run again with this key.",
        false,
    )
}

fn micros(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX)
}

fn trace_fenced<T>(op: &'static str, lease: &Lease, started: Instant, result: &Result<T, Error>) {
    match result {
        Ok(_) => tracing::debug!(
            target: "idem",
            consumer = lease.id().consumer(),
            route = lease.id().route(),
            latency_us = micros(started),
            "{op}"
        ),
        Err(error) => tracing::warn!(
            target: "idem",
            consumer = lease.id().consumer(),
            route = lease.id().route(),
            latency_us = micros(started),
            %error,
            "{op} failed"
        ),
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
        self.idem.renew(&mut lease).await?;
        *self.lease.lock().unwrap_or_else(PoisonError::into_inner) = lease;
        Ok(())
    }

    /// The completion of this lease with `response`, to write inside the effect's transaction
    /// with a SQL store's `complete_in`; then return it from the handler ([`Reply::Completed`]).
    pub fn completion(&self, response: StoredResponse) -> Completion {
        self.idem.completion(&self.lease(), response)
    }
}
