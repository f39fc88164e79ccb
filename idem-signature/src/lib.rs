//! Webhook signatures, shared by the receiving side (idem-inbox verifies with them) and the
//! sending side (idem-outbox signs with them): one implementation of each scheme, never a copy.
//!
//! - [`StandardWebhooks`]: the open specification behind Svix (`webhook-id`,
//!   `webhook-timestamp`, `webhook-signature: v1,<base64 HMAC-SHA256>`, secrets as
//!   `whsec_<base64>`, one signature per secret during a rotation).
//! - [`WebhookScheme`] and [`VerifiedEvent`]: what any scheme verifies and what it tells.
//! - [`SignatureError`] and the bounds every scheme keeps ([`signature`]).
//! - [`Headers`]: the request headers a scheme reads, from any HTTP library.
//! - [`mac`]: HMAC-SHA256 under several secrets, compared in constant time, for other schemes.
//!
//! ```
//! use idem_signature::{StandardWebhooks, WebhookScheme};
//! // The sender signs afresh on every attempt, with the message's stable id.
//! let sender = StandardWebhooks::new(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])?;
//! let body = br#"{"type":"charge.succeeded"}"#;
//! let signature = sender.sign("msg_1", 1_700_000_000, body);
//! let headers = [
//!     ("webhook-id", "msg_1"),
//!     ("webhook-timestamp", "1700000000"),
//!     ("webhook-signature", signature.as_str()),
//! ];
//! // The receiver verifies over the raw body and deduplicates on the id.
//! let event = sender.verify(&headers, body, 1_700_000_001)?;
//! assert_eq!(event.event_id(), Some("msg_1"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod headers;
pub mod mac;
pub mod scheme;
pub mod signature;
pub mod standard_webhooks;

pub use headers::Headers;
pub use scheme::{VerifiedEvent, WebhookScheme};
pub use signature::{now_unix, SignatureError};
pub use standard_webhooks::StandardWebhooks;
