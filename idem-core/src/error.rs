//! The one error type of idem.

use std::fmt;

/// Which part of a request an [`Error::InvalidInput`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Field {
    /// The idempotency key (C1).
    Key,
    /// The consumer part of the scope (C2).
    Consumer,
    /// The route part of the scope (C2).
    Route,
    /// The HTTP method fed to the fingerprint.
    Method,
    /// A header fed to the fingerprint or stored with a response.
    Header,
    /// The request body (for example JSON that does not parse).
    Body,
    /// A response to be stored (for example a status outside 100..=599).
    Response,
    /// A configuration value (policy, table name, ...).
    Config,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::Key => "idempotency key",
            Field::Consumer => "consumer",
            Field::Route => "route",
            Field::Method => "method",
            Field::Header => "header",
            Field::Body => "body",
            Field::Response => "response",
            Field::Config => "configuration",
        })
    }
}

/// Everything that can go wrong in idem.
///
/// Outcomes of the protocol (replay, in flight, mismatch) are *values* of
/// [`Begin`](crate::Begin), not errors. An error always means the request was not
/// (and must not be) executed under protection, or that a completion did not land.
///
/// ```
/// use idem_core::{Error, IdempotencyKey};
/// let err = IdempotencyKey::new("has space").unwrap_err();
/// assert!(matches!(err, Error::InvalidInput { .. }));
/// assert_eq!(err.http_status(), 400);
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Input that breaks a rule (C1, C2, C12). Nothing was written.
    #[error("invalid {field}: {reason}")]
    InvalidInput {
        /// What was invalid.
        field: Field,
        /// Why, in words safe to show to a client.
        reason: String,
    },
    /// A body over the configured limit (C12). Nothing was written.
    #[error("body of {actual} bytes is over the limit of {limit} bytes")]
    BodyTooLarge {
        /// The configured limit in bytes.
        limit: usize,
        /// The size that was offered.
        actual: usize,
    },
    /// The lease no longer carries this caller's token (C6, C9): it expired and
    /// was taken over, was released, or the record was already completed.
    /// On SQL stores the caller's transaction must roll back.
    #[error("lease lost: the record no longer carries this caller's fencing token")]
    LeaseLost,
    /// The store could not be reached or failed (C13). Never run the effect unprotected.
    #[error("idempotency store unavailable: {0}")]
    StoreUnavailable(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// A stored record that cannot be decoded (C12). Never treated as absent.
    #[error("corrupt idempotency record: {0}")]
    CorruptRecord(String),
}

impl Error {
    /// Shorthand for [`Error::InvalidInput`].
    pub fn invalid(field: Field, reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            field,
            reason: reason.into(),
        }
    }

    /// Wraps any backend error as [`Error::StoreUnavailable`].
    pub fn unavailable(
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Error::StoreUnavailable(source.into())
    }

    /// The HTTP status this error maps to at the edge (DESIGN §7).
    ///
    /// `LeaseLost` and `CorruptRecord` are server faults (500): the client may retry.
    pub fn http_status(&self) -> u16 {
        match self {
            Error::InvalidInput { .. } => 400,
            Error::BodyTooLarge { .. } => 413,
            Error::StoreUnavailable(_) => 503,
            Error::LeaseLost | Error::CorruptRecord(_) => 500,
        }
    }

    /// Whether a client may retry the same request later and expect progress.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::StoreUnavailable(_) | Error::LeaseLost)
    }
}
