//! The outbox: the messages an effect sends (webhooks), committed with it and delivered until
//! received, signed, with a stable id (C17).
//!
//! - **Enqueued in the effect's transaction.** On the transactional path of a SQL store
//!   ([`SqliteOutbox::enqueue`] with the `rusqlite` transaction of `run_in_transaction`,
//!   [`PgOutbox::enqueue`] with its `PgConnection`), one statement per message: the effect, its
//!   idempotency record and its messages commit together or vanish together. The plain closure
//!   path and the Redis store share no transaction with the effect, so they cannot enqueue
//!   (C14); a transaction of another database or a connection outside a transaction is refused
//!   ([`OutboxError::NotInEffectTransaction`]).
//! - **Endpoints by name** ([`Endpoint`]): URL, Standard Webhooks secrets, timeout,
//!   [`Schedule`], enabled. A [`Message`] names one or more (one delivery each), carries bytes
//!   or JSON and headers, and a stable [`MessageId`] (`msg_` and a UUIDv7), its `webhook-id`
//!   on every attempt.
//! - **Dispatchers** ([`Dispatcher`]), any number in any number of processes, claim due
//!   deliveries with a lease, deliver them signed afresh on every attempt (idem-signature's
//!   [`StandardWebhooks`](idem_signature::StandardWebhooks), the scheme idem-inbox verifies
//!   with), and record each attempt fenced by the claim.
//!
//! Delivery is **at least once**, in no promised order: receivers deduplicate on
//! `webhook-id` (idem-inbox does it for them). See docs/outbox.md.
//!
//! Bad input is a typed error and writes nothing: a URL that is not an absolute http(s) URL,
//! a secret that is not `whsec_<base64>`, a payload over the limit
//! ([`DEFAULT_MAX_PAYLOAD`], 256 KiB, configurable), an unknown endpoint.
#![forbid(unsafe_code)]
// Without a store feature there is no outbox to dispatch: the types and checks only.
#![cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod address;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod backend;
mod claim;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod dispatcher;
mod endpoint;
mod error;
mod event;
mod id;
mod inspect;
mod message;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(feature = "postgres")]
mod postgres;
mod schedule;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod transport;

pub use claim::DeliveryState;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use dispatcher::{
    Dispatcher, Dispatching, Observer, ENDPOINT_CACHE, MAX_RETRY_AFTER, RECORD_LINGER,
};
pub use endpoint::{Endpoint, DEFAULT_TIMEOUT, MAX_NAME_LEN};
pub use error::OutboxError;
pub use event::{DeadReason, OutboxEvent, OutboxEventKind};
pub use id::MessageId;
pub use inspect::{AttemptInfo, Counts, DeliveryInfo, Retention};
pub use message::{Message, DEFAULT_MAX_PAYLOAD, MAX_HEADERS};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::{PgOutbox, CHANNEL};
pub use schedule::{Schedule, MAX_RETRIES};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::SqliteOutbox;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use transport::STORED_RESPONSE;

/// docs/outbox.md, whose examples compile as this crate's doctests (only when doctests are
/// built, so the package needs no file outside it).
#[cfg(doctest)]
#[doc = include_str!("../../docs/outbox.md")]
pub struct OutboxMd;
