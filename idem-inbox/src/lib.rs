//! The inbox: inbound events (webhooks) processed once when the **sender** chooses the key
//! (docs/inbox.md).
//!
//! Payment providers deliver events at least once and deliver them again when they do not get
//! a clear acknowledgement. The inbox applies the engine's discipline to consumption:
//!
//! 1. **Origin first.** A [`Delivery`] exists only once its origin is verified
//!    ([`Delivery::verify_with`] and a [`WebhookScheme`]: [`StripeScheme`],
//!    [`StandardWebhooks`], [`GitHubScheme`], [`ShopifyScheme`]; or [`Delivery::verified`] with
//!    Stripe's [`SignatureScheme`]), so nothing is recorded for a forged or stale delivery
//!    (answer 400). The scheme also gives the event's key, taken only from what the signature
//!    covers (GitHub and Shopify sign the body only: their key is the event name and the
//!    body's digest, never an unsigned delivery id).
//! 2. **Once.** An event is identified by (source, event id); ids are the sender's, of any
//!    length and any bytes, and are hashed into the record's key (no collisions, C2) while the
//!    original is kept in the audit trail. The first delivery runs the handler; a duplicate of a
//!    processed event is acknowledged at once without running anything; a duplicate while the
//!    first is running is told to come back later; a failed handler leaves the event retryable.
//! 3. **Same id, another payload** (a sender bug or an attack) is never processed and never
//!    acknowledged as a duplicate: a 422, a warning in the log and a count in the audit trail.
//! 4. **One transaction** on SQL stores: the handler writes its effect and the inbox's
//!    acknowledgement ([`EventContext::completion`], with the store's `complete_in`) in one
//!    transaction.
//!
//! ```
//! use idem_inbox::{Ack, Delivery, Inbox, MemoryAudit, SignatureScheme};
//! use idem_core::{Idempotency, MemoryStore};
//! use std::sync::Arc;
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let scheme = SignatureScheme::new(["whsec_test"])?;
//! let inbox = Inbox::new(Idempotency::new(MemoryStore::new())).with_audit(Arc::new(MemoryAudit::default()));
//!
//! let body = br#"{"id":"evt_1","type":"payment_intent.succeeded"}"#;
//! let now = idem_inbox::now_unix();
//! let header = scheme.sign(body, now); // what the provider sends in its signature header
//! let delivery = Delivery::verified(&scheme, "stripe", Some(&header), body, now)?;
//! let event = inbox.event(&delivery, b"evt_1")?;
//! let receipt = inbox.receive(&event, |_ctx| async {
//!     // ... ship the order, issue the invoice ...
//!     Ok::<_, std::io::Error>(Ack::Done)
//! }).await?;
//! assert_eq!(receipt.to_http().status, 200);
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

mod audit;
#[cfg(feature = "axum")]
mod axum;
mod body_signed;
mod recording;
pub mod schemes;
// The signing and verifying shared with idem-outbox: idem-signature's, re-exported where the
// inbox always had them.
pub use idem_signature::signature;
use idem_signature::{headers, mac, scheme};
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use audit::PgAudit;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use audit::SqliteAudit;
pub use audit::{event_key, Audit, AuditEntry, AuditOutcome, MemoryAudit};
pub use idem_signature::{Headers, VerifiedEvent, WebhookScheme};
pub use schemes::github::GitHubScheme;
pub use schemes::shopify::ShopifyScheme;
pub use schemes::standard_webhooks::StandardWebhooks;
pub use schemes::stripe::StripeScheme;
/// Stripe's scheme ([`StripeScheme`]) under the name it had when it was the inbox's only one.
pub use schemes::stripe::StripeScheme as SignatureScheme;
pub use signature::{now_unix, SignatureError};

use idem_core::store::CatchUnwind;
use idem_core::store::Completion;
use idem_core::store::Deadline;
use idem_core::store::Lease;
use idem_core::{
    Answer, Clock, Error, Operation, Request, Store, StoredResponse, SystemClock, Timestamp,
};
use idem_core::{Context, Idempotency};
use idem_core::{Failure, Outcome, Reply, RunError};
use idem_tower::render::Problem;
use recording::{Background, Recording};
use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A delivery whose origin was verified: the only way into the inbox.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    source: &'a str,
    payload: &'a [u8],
}

impl<'a> Delivery<'a> {
    /// Verifies `header` (the sender's signature header) over the raw `payload` at `now_unix`,
    /// and only then gives the delivery of `source`.
    pub fn verified(
        scheme: &SignatureScheme,
        source: &'a str,
        header: Option<&str>,
        payload: &'a [u8],
        now_unix: i64,
    ) -> Result<Self, SignatureError> {
        scheme.verify(header, payload, now_unix)?;
        Ok(Self { source, payload })
    }

    /// Verifies the delivery (`headers` and the raw `payload`) with `scheme` at `now_unix`, and
    /// only then gives the delivery of `source` with what the scheme read of its event (its key,
    /// to pass to [`Inbox::event`], unless the sender puts its id in the body; the sender's
    /// delivery id, for the logs).
    ///
    /// ```
    /// use idem_inbox::{Delivery, SignatureError, StandardWebhooks};
    /// let scheme = StandardWebhooks::new(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])?;
    /// let body = br#"{"type":"invoice.paid"}"#;
    /// let signature = scheme.sign("msg_1", 1_700_000_000, body);
    /// let headers = [
    ///     ("webhook-id", "msg_1"),
    ///     ("webhook-timestamp", "1700000000"),
    ///     ("webhook-signature", signature.as_str()),
    /// ];
    /// let (delivery, event) = Delivery::verify_with(&scheme, "billing", &headers, body, 1_700_000_001)?;
    /// assert_eq!((delivery.source(), event.event_id()), ("billing", Some("msg_1")));
    /// assert_eq!(
    ///     Delivery::verify_with(&scheme, "billing", &headers, b"{}", 1_700_000_001).err(),
    ///     Some(SignatureError::Mismatch)
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn verify_with<W: WebhookScheme + ?Sized>(
        scheme: &W,
        source: &'a str,
        headers: &dyn Headers,
        payload: &'a [u8],
        now_unix: i64,
    ) -> Result<(Self, VerifiedEvent), SignatureError> {
        let event = scheme.verify(headers, payload, now_unix)?;
        Ok((Self { source, payload }, event))
    }

    /// A delivery whose origin the caller verified by other means (mutual TLS, a sender's own
    /// scheme). Never for unverified input: the inbox records what it is given.
    pub fn trusted(source: &'a str, payload: &'a [u8]) -> Self {
        Self { source, payload }
    }

    /// The sender.
    pub fn source(&self) -> &str {
        self.source
    }

    /// The raw payload.
    pub fn payload(&self) -> &[u8] {
        self.payload
    }
}

/// An event as the inbox records it: its record (the source, the hashed id, the payload's
/// fingerprint) and its original id.
#[derive(Debug, Clone)]
pub struct Event {
    request: Request,
    source: String,
    id: Vec<u8>,
}

impl Event {
    /// The sender.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The event id as the sender sent it.
    pub fn id(&self) -> &[u8] {
        &self.id
    }

    /// The engine's request for it.
    pub fn request(&self) -> &Request {
        &self.request
    }
}

/// What an inbox handler returns.
#[derive(Debug, Clone)]
pub enum Ack {
    /// Processed: the inbox records the acknowledgement.
    Done,
    /// Processed, and the acknowledgement ([`EventContext::completion`]) was written in the
    /// handler's own transaction with its store's `complete_in`, committed with the effect.
    Written(Completion),
}

/// What a handler gets: the lease it runs under and the acknowledgement to write in its own
/// transaction.
pub struct EventContext<S> {
    ctx: Context<S>,
}

impl<S> fmt::Debug for EventContext<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventContext")
            .field("lease", &self.ctx.lease())
            .finish()
    }
}

impl<S: Store> EventContext<S> {
    /// The acknowledgement, to write in the handler's transaction with the store's
    /// `complete_in`, then return as [`Ack::Written`].
    pub fn completion(&self) -> Completion {
        self.ctx.completion(acknowledgement())
    }

    /// The lease the handler runs under (renewed by the engine while it runs).
    pub fn lease(&self) -> Lease {
        self.ctx.lease()
    }

    /// The idempotency key to send a downstream provider for this event's effect (a refund, an
    /// email through a provider's API): the same on every redelivery and takeover of the event,
    /// another for another source or event id (see [`Lease::downstream_key`]).
    ///
    /// ```
    /// use idem_inbox::{Ack, Delivery, Inbox};
    /// use idem_core::{Idempotency, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem_core::Error> {
    /// let inbox = Inbox::new(Idempotency::new(MemoryStore::new()));
    /// let event = inbox.event(&Delivery::trusted("stripe", b"{}"), b"evt_1")?;
    /// inbox.receive(&event, |ctx| async move {
    ///     let key = ctx.downstream_key(); // send it with the provider call
    ///     assert!(key.starts_with("idem_"));
    ///     Ok::<_, std::io::Error>(Ack::Done)
    /// }).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn downstream_key(&self) -> String {
        self.ctx.downstream_key()
    }

    /// The engine (its store, for the transaction).
    pub fn idem(&self) -> &Idempotency<S> {
        self.ctx.idem()
    }
}

/// What became of a delivery, and what to answer the sender.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Receipt {
    /// The handler ran now and the event is processed: 200.
    Processed(StoredResponse),
    /// The event was processed before: acknowledged at once, nothing ran: 200.
    Duplicate(StoredResponse),
    /// The first delivery is still being processed: 409 with `Retry-After`, so the sender
    /// delivers it again later.
    InProgress {
        /// Time left on the running lease.
        retry_after: Duration,
    },
    /// The same id with another payload: not processed, not acknowledged: 422.
    Conflict,
    /// The handler failed and nothing was recorded: 500, and the sender's next delivery runs
    /// it again.
    Failed(String),
}

fn is_success(response: &StoredResponse) -> bool {
    (200..300).contains(&response.status)
}

/// Whether `completion` is this lease's and the store holds it completed.
async fn written<S: Store>(ctx: &Context<S>, completion: &Completion) -> bool {
    let lease = ctx.lease();
    if completion.id() != lease.id() || completion.token() != lease.token() {
        return false;
    }
    // Within the engine's store deadline, reported as the engine's own calls are.
    let idem = ctx.idem();
    let read = idem
        .store_call(Operation::Lookup, Some(lease.id()), |deadline| {
            idem.store().lookup(lease.id(), deadline)
        })
        .await;
    matches!(read, Ok(Some(record)) if record.is_completed_by(&lease.token()))
}

/// The response stored for a processed event: what every duplicate gets.
fn acknowledgement() -> StoredResponse {
    StoredResponse::new(200, r#"{"received":true}"#).with_header("content-type", "application/json")
}

impl Receipt {
    /// The HTTP answer for the sender (docs/inbox.md): 200 processed or duplicate (the
    /// duplicate marked `Idempotent-Replayed: true`), 409 + `Retry-After` in progress, 422 for
    /// another payload under the same id, 500 for a failure to retry.
    pub fn to_http(&self) -> StoredResponse {
        match self {
            Receipt::Processed(response) => response.clone(),
            Receipt::Duplicate(response) => response.clone().with_header("idempotent-replayed", "true"),
            Receipt::InProgress { retry_after } => Problem::new(
                409,
                "event-in-progress",
                "This event is being processed; deliver it again later.",
                true,
            )
            .with_retry_after((*retry_after).min(Duration::from_secs(30)))
            .to_response(),
            Receipt::Conflict => Problem::new(
                422,
                "event-id-reused",
                "An event with this id and another payload was received before; it is not processed.",
                false,
            )
            .to_response(),
            Receipt::Failed(_) => Problem::new(
                500,
                "event-failed",
                "The event could not be processed; deliver it again.",
                true,
            )
            .to_response(),
        }
    }

    /// Whether the sender is told the event is handled (a 2xx).
    pub fn is_acknowledged(&self) -> bool {
        matches!(self, Receipt::Processed(r) | Receipt::Duplicate(r) if is_success(r))
    }
}

/// Processes each event once over any store, with an optional audit trail.
pub struct Inbox<S> {
    idem: Idempotency<S>,
    audit: Option<Arc<dyn Audit>>,
    clock: Arc<dyn Clock>,
    /// The audit writes that went on past their deliveries' answers.
    background: Arc<Background>,
}

impl<S> Clone for Inbox<S> {
    fn clone(&self) -> Self {
        Self {
            idem: self.idem.clone(),
            audit: self.audit.clone(),
            clock: Arc::clone(&self.clock),
            background: Arc::clone(&self.background),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Inbox<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inbox")
            .field("idem", &self.idem)
            .field("audit", &self.audit.is_some())
            .finish()
    }
}

/// The route every inbox record is scoped under: not a path, so no HTTP request through the
/// HTTP layer (whose routes are paths) can ever share an event's scope.
const ROUTE: &str = "inbox";

impl<S: Store + 'static> Inbox<S> {
    /// An inbox over the engine `idem` (its policy's lease bounds a handler's run without a
    /// heartbeat, its retention how long a processed event is remembered: longer than the
    /// sender redelivers, Stripe's three days for example).
    pub fn new(idem: Idempotency<S>) -> Self {
        Self {
            idem,
            audit: None,
            clock: Arc::new(SystemClock),
            background: Arc::default(),
        }
    }

    /// Writes the audit trail to `audit`.
    pub fn with_audit(mut self, audit: Arc<dyn Audit>) -> Self {
        self.audit = Some(audit);
        self
    }

    /// Timestamps the audit trail with `clock` (tests).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The engine.
    pub fn idem(&self) -> &Idempotency<S> {
        &self.idem
    }

    /// The event `event_id` of a verified delivery, fingerprinted by its raw payload. The id may
    /// be any bytes of any length (it is the sender's): the record's key is the hex of its
    /// blake3 digest. A payload over the policy's body limit is [`Error::BodyTooLarge`].
    pub fn event(&self, delivery: &Delivery<'_>, event_id: &[u8]) -> Result<Event, Error> {
        self.build(delivery, event_id, None)
    }

    /// [`event`](Self::event) for a JSON payload whose sender changes some fields from one
    /// delivery of the same event to the next (Stripe's `pending_webhooks`, a delivery
    /// attempt counter): the fingerprint is the canonical JSON without the `volatile` fields
    /// (paths as in [`canonical_json`](idem_tower::canonical::canonical_json)), so a redelivery is a duplicate
    /// and only a change of meaning is a conflict. A payload that is not valid JSON is
    /// fingerprinted raw.
    ///
    /// ```
    /// use idem_inbox::{Delivery, Inbox};
    /// use idem_core::{Idempotency, MemoryStore};
    /// let inbox = Inbox::new(Idempotency::new(MemoryStore::new()));
    /// let first = br#"{"id":"evt_1","amount":5,"pending_webhooks":2}"#;
    /// let again = br#"{"pending_webhooks":1, "amount":5, "id":"evt_1"}"#;
    /// let a = inbox.event_json(&Delivery::trusted("stripe", first), b"evt_1", &["pending_webhooks"])?;
    /// let b = inbox.event_json(&Delivery::trusted("stripe", again), b"evt_1", &["pending_webhooks"])?;
    /// assert_eq!(a.request().fingerprint(), b.request().fingerprint());
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn event_json(
        &self,
        delivery: &Delivery<'_>,
        event_id: &[u8],
        volatile: &[&str],
    ) -> Result<Event, Error> {
        // Over the limit: refused by the builder before anything is parsed.
        let canonical = (delivery.payload.len() <= self.idem.policy().max_body_bytes)
            .then(|| idem_tower::canonical::canonical_json(delivery.payload, volatile).ok())
            .flatten();
        self.build(delivery, event_id, canonical.as_deref())
    }

    /// The event's request; `canonical` is the payload's canonical JSON, when it has one.
    fn build(
        &self,
        delivery: &Delivery<'_>,
        event_id: &[u8],
        canonical: Option<&[u8]>,
    ) -> Result<Event, Error> {
        let key = blake3::hash(event_id).to_hex();
        let mut builder = self
            .idem
            .request(delivery.source, "EVENT", ROUTE)
            .key(Some(key.as_str()))
            .body(delivery.payload);
        if let Some(canonical) = canonical {
            builder = builder.canonical_json(canonical);
        }
        Ok(Event {
            request: builder.build()?,
            source: delivery.source.to_owned(),
            id: event_id.to_vec(),
        })
    }

    /// Processes `event` once: the first delivery runs `handler`; see [`Receipt`] for the
    /// others. A handler's error (or panic) means its effect did not happen (its transaction
    /// rolled back): the event stays retryable. A handler with an effect outside the database
    /// must make that effect safe to repeat (derive the downstream idempotency key from the
    /// event id). Store failures are errors (answer 503: the sender retries).
    ///
    /// The audit trail's writes share the event's one store budget with the engine's steps
    /// (C13: the request's own, else the policy's `store_timeout`; the handler's time is not
    /// counted), and hold the answer 20 ms at most each (C5): a slower one goes on in the
    /// background, and one that does not land within the budget is given up and logged.
    pub async fn receive<F, Fut, E>(&self, event: &Event, handler: F) -> Result<Receipt, Error>
    where
        F: FnOnce(EventContext<S>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Ack, E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let budget = event
            .request()
            .store_budget()
            .unwrap_or(self.idem.policy().store_timeout);
        let started = Instant::now();
        let mut recording = Recording::new(&self.background);
        self.audit_delivered(event, Deadline::after(budget), &mut recording)
            .await;
        let request = if self.audit.is_some() {
            let left = budget.saturating_sub(started.elapsed());
            event.request().clone().with_store_budget(left)
        } else {
            event.request().clone()
        };
        let handling = Arc::new(Mutex::new(Duration::ZERO));
        let handled = Arc::clone(&handling);
        let result = self
            .idem
            .run(&request, move |ctx| async move {
                let check = ctx.clone();
                let ctx = EventContext { ctx };
                let handler_started = Instant::now();
                let outcome = match catch_unwind(AssertUnwindSafe(|| handler(ctx))) {
                    Ok(future) => CatchUnwind::new(future).await,
                    Err(panic) => Err(panic),
                };
                *handled.lock().unwrap_or_else(PoisonError::into_inner) = handler_started.elapsed();
                match outcome {
                    Ok(Ok(Ack::Done)) => Ok(Reply::Executed(acknowledgement())),
                    // An acknowledgement said to be written in the handler's transaction must
                    // be in the store, completed under this lease: else that transaction rolled
                    // back (or the completion was another event's), nothing happened, and the
                    // event stays retryable; never an acknowledged event that was not processed.
                    Ok(Ok(Ack::Written(completion))) => {
                        if written(&check, &completion).await {
                            Ok(Reply::Completed(completion))
                        } else {
                            Err(Failure::nothing_happened(
                                "the handler's acknowledgement was not committed".to_owned(),
                            ))
                        }
                    }
                    Ok(Err(error)) => Err(Failure::nothing_happened(error.to_string())),
                    Err(_) => Err(Failure::nothing_happened("the handler panicked".to_owned())),
                }
            })
            .await;
        let receipt = match result {
            // Only a stored acknowledgement (2xx) means processed; anything else the engine
            // stored (a 500 when a completion could not be trusted) is a failure.
            Ok(Outcome::Executed(response)) if is_success(&response) => {
                Receipt::Processed(response)
            }
            Ok(Outcome::Answered(Answer::Replay(response))) if is_success(&response) => {
                Receipt::Duplicate(response)
            }
            Ok(Outcome::Executed(response) | Outcome::Answered(Answer::Replay(response))) => {
                Receipt::Failed(format!("the stored answer is a {}", response.status))
            }
            Ok(Outcome::Refused(response)) => {
                Receipt::Failed(format!("the answer is a refusal ({})", response.status))
            }
            Ok(Outcome::Answered(Answer::InFlight { retry_after })) => {
                Receipt::InProgress { retry_after }
            }
            Ok(Outcome::Answered(Answer::Mismatch)) => Receipt::Conflict,
            Err(RunError::Released(error)) => Receipt::Failed(error),
            Err(RunError::Unknown { error, .. }) => Receipt::Failed(error),
            Err(RunError::Idem(error)) => return Err(error),
            Err(RunError::Incomplete(error) | RunError::InDoubt(error)) => {
                Receipt::Failed(error.to_string())
            }
            Err(other) => Receipt::Failed(other.to_string()),
        };
        // What the store steps left of the budget: all the time since the start but the
        // handler's.
        let handler = *handling.lock().unwrap_or_else(PoisonError::into_inner);
        let store_time = started.elapsed().saturating_sub(handler);
        let left = Deadline::after(budget.saturating_sub(store_time));
        self.audit_settled(event, &receipt, left, &mut recording)
            .await;
        Ok(receipt)
    }

    /// Waits until the audit writes that went on past their deliveries' answers (each holds
    /// its answer 20 ms at most) have landed or were given up at their store budget: before
    /// reading the trail for what was just answered, or before the process exits.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use idem_core::{Idempotency, MemoryStore};
    /// use idem_inbox::{Inbox, MemoryAudit};
    /// use std::sync::Arc;
    /// let inbox = Inbox::new(Idempotency::new(MemoryStore::new()))
    ///     .with_audit(Arc::new(MemoryAudit::default()));
    /// inbox.drain_audit().await;
    /// # }
    /// ```
    pub async fn drain_audit(&self) {
        self.background.drained().await;
    }

    /// Deletes at most `limit` audit entries first received more than `retention` ago.
    pub async fn purge_audit(&self, retention: Duration, limit: usize) -> Result<usize, Error> {
        let Some(audit) = &self.audit else {
            return Ok(0);
        };
        let now = self.clock.now().as_millis();
        let cutoff = Timestamp::from_millis(
            now.saturating_sub(u64::try_from(retention.as_millis()).unwrap_or(u64::MAX)),
        );
        audit.purge(cutoff, limit).await
    }

    /// Records a delivery in the audit trail, given up at `deadline` (best effort).
    async fn audit_delivered(&self, event: &Event, deadline: Deadline, recording: &mut Recording) {
        if let Some(audit) = &self.audit {
            let (audit, now) = (Arc::clone(audit), self.clock.now());
            let (source, id) = (event.source.clone(), event.id.clone());
            let delivered = async move { audit.delivered(&source, &id, now).await };
            recording
                .write(&event.source, "a delivery", deadline, delivered)
                .await;
        }
    }

    /// Records how a delivery ended in the audit trail, given up at `deadline` (best effort).
    async fn audit_settled(
        &self,
        event: &Event,
        receipt: &Receipt,
        deadline: Deadline,
        recording: &mut Recording,
    ) {
        let id = String::from_utf8_lossy(&event.id);
        match receipt {
            Receipt::Conflict => {
                tracing::warn!(target: "idem", source = %event.source, event = %id, "idem.inbox: an event id arrived again with another payload; not processed")
            }
            Receipt::Failed(error) => {
                tracing::warn!(target: "idem", source = %event.source, event = %id, %error, "idem.inbox: the handler failed; the event stays retryable")
            }
            _ => tracing::debug!(target: "idem", source = %event.source, event = %id, "idem.inbox"),
        }
        let Some(audit) = &self.audit else { return };
        // A duplicate proves the event was processed: after a crash between the commit and
        // the answer, the redelivery is what records it (never overwriting an earlier time).
        let ended = match receipt {
            Receipt::Processed(_) | Receipt::Duplicate(_) => Some(AuditOutcome::Processed),
            Receipt::Failed(_) => Some(AuditOutcome::Failed),
            Receipt::Conflict => None,
            _ => return,
        };
        let (audit, now) = (Arc::clone(audit), self.clock.now());
        let (source, id) = (event.source.clone(), event.id.clone());
        let settled = async move {
            match ended {
                Some(outcome) => audit.settled(&source, &id, outcome, now).await,
                None => audit.conflicted(&source, &id, now).await,
            }
        };
        recording
            .write(&event.source, "an outcome", deadline, settled)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::MemoryStore;
    use std::sync::Mutex;

    /// The downstream key a handler sees for `id` from `source`, the handler failing when
    /// `fail` (so the event stays retryable and its next delivery runs again).
    async fn key_seen(inbox: &Inbox<MemoryStore>, source: &str, id: &[u8], fail: bool) -> String {
        let seen = Arc::new(Mutex::new(String::new()));
        let event = inbox
            .event(&Delivery::trusted(source, b"{}"), id)
            .expect("an event");
        let sink = Arc::clone(&seen);
        inbox
            .receive(&event, move |ctx| async move {
                *sink.lock().expect("not poisoned") = ctx.downstream_key();
                if fail {
                    Err("the provider timed out")
                } else {
                    Ok(Ack::Done)
                }
            })
            .await
            .expect("received");
        let key = seen.lock().expect("not poisoned").clone();
        key
    }

    /// A redelivery after a failure calls the provider with the key of the first attempt, and
    /// another sender's event of the same id never shares it (C2).
    #[tokio::test]
    async fn c02_an_events_downstream_key_is_the_same_on_every_delivery_and_scoped_by_source() {
        let inbox = Inbox::new(Idempotency::new(MemoryStore::new()));
        let first = key_seen(&inbox, "stripe", b"evt_1", true).await;
        let again = key_seen(&inbox, "stripe", b"evt_1", false).await;
        let other_source = key_seen(&inbox, "adyen", b"evt_1", false).await;
        let other_event = key_seen(&inbox, "stripe", b"evt_2", false).await;
        assert!(first.starts_with("idem_"), "{first}");
        assert_eq!(first, again);
        assert_ne!(first, other_source);
        assert_ne!(first, other_event);
    }
}
