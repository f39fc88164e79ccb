//! One sender's way of proving a delivery's origin and naming its event: the
//! [`WebhookScheme`] trait the inbox takes, and what a verified delivery tells
//! ([`VerifiedEvent`]).
//!
//! This crate implements [`StandardWebhooks`](crate::StandardWebhooks) (`webhook-id`,
//! `webhook-timestamp`, `webhook-signature`, or Svix's `svix-*`), the scheme idem-outbox signs
//! with; idem-inbox adds Stripe's (`Stripe-Signature`), GitHub's (`X-Hub-Signature-256`) and
//! Shopify's (`X-Shopify-Hmac-Sha256`).

use std::fmt;

use super::headers::Headers;
use super::signature::SignatureError;

/// What a delivery whose origin was verified says about its event.
///
/// ```
/// use idem_signature::VerifiedEvent;
/// let event = VerifiedEvent::new(Some("push 5c1f...".into()), Some("push".into()), None)
///     .with_delivery_id(Some("72d3162e".into()));
/// assert_eq!(event.event_id(), Some("push 5c1f..."));
/// assert_eq!(event.event_type(), Some("push"));
/// assert_eq!(event.delivery_id(), Some("72d3162e"));
/// assert_eq!(event.signed_at(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedEvent {
    event_id: Option<String>,
    event_type: Option<String>,
    signed_at: Option<i64>,
    delivery_id: Option<String>,
}

impl VerifiedEvent {
    /// An event with its id (the inbox's key: what stays the same on every delivery of the
    /// event, and is covered by the signature), its type, and when it was signed (unix
    /// seconds), each when the scheme knows it. No delivery id (see
    /// [`with_delivery_id`](Self::with_delivery_id)).
    pub fn new(
        event_id: Option<String>,
        event_type: Option<String>,
        signed_at: Option<i64>,
    ) -> Self {
        Self {
            event_id,
            event_type,
            signed_at,
            delivery_id: None,
        }
    }

    /// The same event with the sender's id of this delivery (`X-GitHub-Delivery`,
    /// `X-Shopify-Event-Id`, `webhook-id`), for logs and audit.
    ///
    /// ```
    /// use idem_signature::VerifiedEvent;
    /// let event = VerifiedEvent::new(None, None, None).with_delivery_id(Some("d-1".into()));
    /// assert_eq!(event.delivery_id(), Some("d-1"));
    /// ```
    #[must_use]
    pub fn with_delivery_id(mut self, delivery_id: Option<String>) -> Self {
        self.delivery_id = delivery_id;
        self
    }

    /// The id to deduplicate on; `None` when the sender puts it in the body instead (Stripe:
    /// the event's `id`), which the caller reads once verified. For the schemes that sign the
    /// body only (GitHub, Shopify) it is derived from what the signature covers, never from an
    /// unsigned id header: `<event name> <blake3 hex of the raw body>`.
    pub fn event_id(&self) -> Option<&str> {
        self.event_id.as_deref()
    }

    /// The event's type when a header names it (`X-GitHub-Event`, `X-Shopify-Topic`). For
    /// GitHub and Shopify that header is not signed: take the event's meaning from the
    /// verified body.
    pub fn event_type(&self) -> Option<&str> {
        self.event_type.as_deref()
    }

    /// When the sender signed the delivery (unix seconds), for timestamped schemes.
    pub fn signed_at(&self) -> Option<i64> {
        self.signed_at
    }

    /// The sender's id of this delivery when a header carries one, for logs and audit only:
    /// for GitHub and Shopify it is not signed, so it is never the key to deduplicate on.
    pub fn delivery_id(&self) -> Option<&str> {
        self.delivery_id.as_deref()
    }
}

/// One sender's signature scheme: which headers it reads, what it signs, which id it
/// deduplicates on.
///
/// # Contract
///
/// - `verify` checks the signature over the **raw** body before anything else is believed;
///   every comparison of a MAC is in constant time, every configured secret is tried (a
///   rotation), and the work is bounded whatever the headers hold.
/// - A forged delivery is [`SignatureError::Mismatch`] (or `Missing`/`Malformed`), never
///   `Stale`/`Future`: the time is judged only once the signature is proven.
/// - Every failure is a [`SignatureError`] (answer 400), never a panic.
/// - [`VerifiedEvent::event_id`] is what stays the same across the sender's redeliveries of
///   one event (and differs between events), taken only from what the signature covers: a
///   captured delivery replayed with other unsigned headers must not make a new event.
///
/// ```
/// use idem_signature::{StandardWebhooks, WebhookScheme};
/// let scheme = StandardWebhooks::new(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])?;
/// let signature = scheme.sign("msg_1", 1_700_000_000, b"{}");
/// let headers = [
///     ("webhook-id", "msg_1"),
///     ("webhook-timestamp", "1700000000"),
///     ("webhook-signature", signature.as_str()),
/// ];
/// let event = scheme.verify(&headers, b"{}", 1_700_000_000)?;
/// assert_eq!(event.event_id(), Some("msg_1"));
/// assert_eq!(scheme.name(), "standard-webhooks");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait WebhookScheme: fmt::Debug + Send + Sync {
    /// A short stable name (`stripe`, `standard-webhooks`, `github`, `shopify`), for logs and
    /// as a default inbox source.
    fn name(&self) -> &'static str;

    /// Verifies the delivery (`headers` and raw `body`) at `now_unix` (unix seconds; pass
    /// [`now_unix()`](super::now_unix) in production, a fixed value in tests).
    fn verify(
        &self,
        headers: &dyn Headers,
        body: &[u8],
        now_unix: i64,
    ) -> Result<VerifiedEvent, SignatureError>;
}
