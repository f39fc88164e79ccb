//! The outbox's one error type.

use std::time::Duration;

/// Why an outbox call failed. Input errors are refused before anything is written.
///
/// ```
/// use idem_outbox::{Endpoint, OutboxError};
/// let err = Endpoint::new("merchant", "ftp://example.com/hook", ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]);
/// assert!(matches!(err, Err(OutboxError::InvalidUrl { .. })));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// An endpoint's URL is not an absolute `http` or `https` URL with a host (or names an
    /// address the outbox refuses).
    #[error("invalid endpoint URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A secret is not a Standard Webhooks secret (`whsec_` and the base64 of 16 to 64 bytes).
    #[error("invalid endpoint secret: {0}")]
    InvalidSecret(String),
    /// An endpoint name is empty, longer than 64 bytes, or not visible ASCII.
    #[error("invalid endpoint name {0:?}: 1 to 64 bytes of visible ASCII")]
    InvalidEndpointName(String),
    /// A setting out of its range (a zero timeout, an empty schedule, ...).
    #[error("invalid setting: {0}")]
    InvalidSetting(&'static str),
    /// A message header is reserved, repeated, or not a valid header.
    #[error("invalid message header {name:?}: {reason}")]
    InvalidHeader {
        /// The header's name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A message's payload is over the outbox's limit.
    #[error("payload of {size} bytes is over the limit of {limit} bytes")]
    PayloadTooLarge {
        /// The payload's size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A message names no endpoint.
    #[error("a message names no endpoint")]
    NoEndpoint,
    /// A message names an endpoint that is not registered: nothing was written.
    #[error("a message names an endpoint that is not registered: {0}")]
    UnknownEndpoint(String),
    /// The message cannot be committed with the effect (C14, C17): the connection or
    /// transaction given is not a transaction of the outbox's database. Only the
    /// transactional path of a SQL store can enqueue: the plain closure path and Redis have no
    /// transaction shared with the effect.
    #[error("a message can only be enqueued in the effect's transaction: {0}")]
    NotInEffectTransaction(&'static str),
    /// A JSON payload could not be serialised.
    #[error("the payload is not serialisable as JSON: {0}")]
    Json(String),
    /// The database failed (mapped by the store crate; see [`idem_core::Error`]).
    #[error(transparent)]
    Store(#[from] idem_core::Error),
    /// A stored row is not what the outbox writes.
    #[error("corrupt outbox row: {0}")]
    Corrupt(String),
    /// A call did not finish within its deadline.
    #[error("outbox call timed out after {0:?}")]
    Timeout(Duration),
}
