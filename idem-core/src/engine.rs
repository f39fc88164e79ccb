//! `Idempotency<S>`: what applications call.

use crate::begin::{Begin, Lease};
use crate::error::Error;
use crate::outcome::{Outcome, RunError};
use crate::policy::Policy;
use crate::request::{Request, RequestBuilder};
use crate::response::StoredResponse;
use crate::store::Store;
use std::future::Future;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;

/// The idempotency engine: a [`Store`] and a [`Policy`].
///
/// Two styles, both first-class:
///
/// - **guard**: [`begin`](Self::begin) → [`Begin::Acquired`] → run the effect →
///   [`complete`](Self::complete) (or [`release`](Self::release) on error). SQL stores add a
///   `complete_in` that writes the completion inside the effect's own transaction.
/// - **closure**: [`run`](Self::run) does all of it around an async handler.
///
/// ```
/// use idem_core::{Idempotency, MemoryStore, Outcome, StoredResponse};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let idem = Idempotency::new(MemoryStore::new());
/// let request = idem.request("acct_42", "POST", "/v1/charges")
///     .key(Some("9b2f6c1e"))
///     .body(br#"{"amount":1000}"#)
///     .build()?;
///
/// let first = idem.run(&request, |_ctx| async {
///     Ok::<_, std::io::Error>(StoredResponse::new(201, r#"{"id":"ch_1"}"#))
/// }).await?;
/// let retry = idem.run(&request, |_ctx| async {
///     Ok::<_, std::io::Error>(StoredResponse::new(201, "never sent: a completed request does not run again"))
/// }).await?;
///
/// assert!(matches!(first, Outcome::Executed(_)));
/// assert!(matches!(retry, Outcome::Replayed(ref r) if r.body == br#"{"id":"ch_1"}"#));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Idempotency<S> {
    store: S,
    policy: Arc<Policy>,
}

impl<S: Store> Idempotency<S> {
    /// An engine with the default [`Policy`].
    pub fn new(store: S) -> Self {
        Self {
            store,
            policy: Arc::new(Policy::default()),
        }
    }

    /// An engine with `policy`, checked by [`Policy::validate`].
    pub fn with_policy(store: S, policy: Policy) -> Result<Self, Error> {
        policy.validate()?;
        Ok(Self {
            store,
            policy: Arc::new(policy),
        })
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The policy, shared (cheap to clone into a blocking closure).
    pub fn shared_policy(&self) -> Arc<Policy> {
        Arc::clone(&self.policy)
    }

    /// Starts a [`Request`] from wire parts, with this policy's body limit.
    pub fn request<'a>(
        &self,
        consumer: &'a str,
        method: &'a str,
        route: &'a str,
    ) -> RequestBuilder<'a> {
        Request::builder(consumer, method, route).max_body_bytes(self.policy.max_body_bytes)
    }

    /// Reserves the request, or says why it must not run (replay, in flight, mismatch).
    pub async fn begin(&self, request: &Request) -> Result<Begin, Error> {
        let started = Instant::now();
        let result = self.store.reserve(request, self.policy.lease).await;
        let outcome = match &result {
            Ok(Begin::Acquired(lease)) => match lease.acquired {
                crate::Acquire::Fresh => "acquired",
                crate::Acquire::TakeOver { .. } => "took_over",
                crate::Acquire::StartOver { .. } => "started_over",
            },
            Ok(Begin::Replay(_)) => "replay",
            Ok(Begin::InFlight { .. }) => "in_flight",
            Ok(Begin::Mismatch) => "mismatch",
            Err(_) => "error",
        };
        tracing::debug!(
            target: "idem",
            consumer = request.id.consumer(),
            route = request.id.route(),
            outcome,
            latency_us = started.elapsed().as_micros() as u64,
            error = result.as_ref().err().map(tracing::field::display),
            "idem.begin"
        );
        result
    }

    /// Filters the response's headers by the policy (C7) and validates it: the exact response
    /// that is stored, and that the first caller should send, so that the live answer and every
    /// replay are the same bytes. SQL stores' `complete_in` stores this.
    pub fn prepare(&self, response: StoredResponse) -> Result<StoredResponse, Error> {
        self.policy.prepare(response)
    }

    /// Stores the response and completes the record, if the lease still holds (C6); returns
    /// the response as stored (see [`prepare`](Self::prepare)).
    pub async fn complete(
        &self,
        lease: Lease,
        response: StoredResponse,
    ) -> Result<StoredResponse, Error> {
        let started = Instant::now();
        let response = self.prepare(response)?;
        let result = self
            .store
            .complete(&lease, &response, self.policy.retention)
            .await;
        self.trace_fenced("idem.complete", &lease, started, &result);
        result.map(|()| response)
    }

    /// Gives the reservation up so a retry can run (C8), if the lease still holds.
    pub async fn release(&self, lease: Lease) -> Result<(), Error> {
        let started = Instant::now();
        let result = self.store.release(&lease).await;
        self.trace_fenced("idem.release", &lease, started, &result);
        result
    }

    /// Extends a long handler's lease by the policy's lease from now (C9), if it still holds.
    pub async fn renew(&self, lease: &mut Lease) -> Result<(), Error> {
        let started = Instant::now();
        let result = self.store.renew(lease, self.policy.lease).await;
        self.trace_fenced("idem.renew", lease, started, &result);
        lease.lease_until = result?;
        Ok(())
    }

    /// Deletes one batch of expired records (at most [`Policy::purge_batch`]); returns how many.
    /// Call it periodically; see docs/operations.
    pub async fn purge_expired(&self) -> Result<usize, Error> {
        self.store.purge_expired(self.policy.purge_batch).await
    }

    /// The closure style: begin; when acquired, run `handler`, then complete with its response
    /// (any status: a 402 is stored and replayed, C8) or, when it returns `Err`, release so that a
    /// retry can run. Replays, in-flight duplicates and mismatches never call `handler`.
    ///
    /// A handler that panics, or a `run` future that is dropped, leaves the reservation to
    /// expire with its lease (C9).
    pub async fn run<'a, F, Fut, E>(
        &'a self,
        request: &Request,
        handler: F,
    ) -> Result<Outcome, RunError<E>>
    where
        F: FnOnce(Context<'a, S>) -> Fut,
        Fut: Future<Output = Result<StoredResponse, E>>,
    {
        let lease = match self
            .begin(request)
            .await
            .map_err(RunError::Idem)?
            .next_step()
        {
            ControlFlow::Continue(lease) => lease,
            ControlFlow::Break(outcome) => return Ok(outcome),
        };
        let ctx = Context {
            idem: self,
            lease: lease.clone(),
        };
        match handler(ctx).await {
            Ok(response) => {
                let stored = self
                    .complete(lease, response)
                    .await
                    .map_err(RunError::Idem)?;
                Ok(Outcome::Executed(stored))
            }
            Err(error) => {
                // The handler's error is what the caller needs; a failed release only means
                // the reservation expires with its lease instead (logged by `release`).
                let _ = self.release(lease).await;
                Err(RunError::Handler(error))
            }
        }
    }

    fn trace_fenced<T>(
        &self,
        op: &'static str,
        lease: &Lease,
        started: Instant,
        result: &Result<T, Error>,
    ) {
        match result {
            Ok(_) => tracing::debug!(
                target: "idem",
                consumer = lease.id.consumer(),
                route = lease.id.route(),
                latency_us = started.elapsed().as_micros() as u64,
                "{op}"
            ),
            Err(error) => tracing::warn!(
                target: "idem",
                consumer = lease.id.consumer(),
                route = lease.id.route(),
                latency_us = started.elapsed().as_micros() as u64,
                %error,
                "{op} failed"
            ),
        }
    }
}

/// What a [`run`](Idempotency::run) handler gets: the lease it runs under, and a way to renew
/// it when the work may outlast it (C9).
#[derive(Debug)]
pub struct Context<'a, S> {
    idem: &'a Idempotency<S>,
    lease: Lease,
}

impl<S: Store> Context<'_, S> {
    /// The lease the handler runs under.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Extends the lease (heartbeat). [`Error::LeaseLost`] means another attempt took the
    /// record over: stop, and do not commit the effect.
    pub async fn renew(&mut self) -> Result<(), Error> {
        self.idem.renew(&mut self.lease).await
    }
}
