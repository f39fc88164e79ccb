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
    /// A listing's cursor that this store did not make.
    Cursor,
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
            Field::Cursor => "cursor",
        })
    }
}

/// Everything that can go wrong (replay, in flight, mismatch are [`Answer`](crate::Answer)s).
///
/// ```
/// use idem_core::{Error, IdempotencyKey};
/// let err = IdempotencyKey::new("has space").unwrap_err();
/// assert!(matches!(err, Error::InvalidInput { .. }));
/// assert!(!err.is_retryable());
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The idempotency key is missing where one is required (C1). Nothing was written.
    #[error("missing idempotency key")]
    KeyMissing,
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
    /// The record no longer carries this caller's token (C6, C9): taken over, released or
    /// completed. On SQL stores the caller's transaction must roll back.
    #[error("lease lost: the record no longer carries this caller's fencing token")]
    LeaseLost,
    /// The store failed (C13). Never run the effect unprotected.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A stored record that cannot be decoded (C12). Never treated as absent.
    #[error("corrupt idempotency record: {0}")]
    CorruptRecord(String),
    /// The table is at another schema version (the message says what to do). Nothing was done.
    ///
    /// ```
    /// use idem_core::Error;
    /// let newer = Error::SchemaVersion { table: "idem_records".into(), found: 9, expected: 3 };
    /// assert!(newer.to_string().contains("upgrade this program"));
    /// ```
    #[error("{}", schema_version_message(table, *found, *expected))]
    SchemaVersion {
        /// The table, as the store names it.
        table: String,
        /// The version applied to it (0: none).
        found: i64,
        /// The version this code uses.
        expected: i64,
    },
}

fn schema_version_message(table: &str, found: i64, expected: i64) -> String {
    if found == 0 {
        format!("no idem table {table} in this database (apply the schema first)")
    } else if found < expected {
        format!("table {table} has schema version {found}; this release uses {expected} (migrate it first)")
    } else {
        format!("table {table} has schema version {found}, newer than this release knows ({expected}): a newer release migrated it; upgrade this program (migrating cannot help)")
    }
}

impl Error {
    /// Shorthand for [`Error::InvalidInput`].
    pub fn invalid(field: Field, reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            field,
            reason: reason.into(),
        }
    }

    /// A store failure of `kind` on `backend`, keeping `source`.
    pub fn store(
        backend: &'static str,
        kind: StoreErrorKind,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Error::Store(StoreError::new(backend, kind, source))
    }

    /// The store error, if this is one.
    pub fn as_store(&self) -> Option<&StoreError> {
        match self {
            Error::Store(e) => Some(e),
            _ => None,
        }
    }

    /// Whether a later retry may succeed: a transient store failure or a lost lease.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Store(e) => e.is_retryable(),
            Error::LeaseLost => true,
            _ => false,
        }
    }
}

/// What kind of failure an [`Error::Store`] is: whether a retry helps, and what to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// Unreachable, connection dropped, timed out or busy. Retrying later may help.
    Unavailable,
    /// The transaction lost a conflict and rolled back: retry **all of it**, effect included.
    TransactionConflict,
    /// Not set up as idem needs (table, password, permission): an operator must act.
    Misconfigured,
    /// Any other failure of the backend.
    Other,
}

impl fmt::Display for StoreErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::TransactionConflict => "transaction conflict (retry the transaction)",
            StoreErrorKind::Misconfigured => "misconfigured",
            StoreErrorKind::Other => "failed",
        })
    }
}

/// A backend failure: which backend, what kind, and the backend's own error as the source.
///
/// ```
/// use idem_core::{Error, StoreErrorKind};
/// let err = Error::store("sqlite", StoreErrorKind::Unavailable, "database is locked");
/// assert!(matches!(err, Error::Store(_)) && err.is_retryable());
/// let store = err.as_store().expect("a store error");
/// assert_eq!((store.backend(), store.kind()), ("sqlite", StoreErrorKind::Unavailable));
/// assert_eq!(err.to_string(), "idempotency store sqlite unavailable: database is locked");
/// ```
#[derive(Debug, thiserror::Error)]
#[error("idempotency store {backend} {kind}: {source}")]
pub struct StoreError {
    backend: &'static str,
    kind: StoreErrorKind,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync + 'static>,
}

impl StoreError {
    /// A failure of `kind` on `backend` (`"sqlite"`, `"postgres"`, `"redis"`, ...).
    pub fn new(
        backend: &'static str,
        kind: StoreErrorKind,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Self {
            backend,
            kind,
            source: source.into(),
        }
    }

    /// The backend's name.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// What kind of failure it is.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// Whether trying again later can help (not for a misconfigured store).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            StoreErrorKind::Unavailable | StoreErrorKind::TransactionConflict
        )
    }

    /// The backend's own error, to downcast (`rusqlite::Error`, `sqlx::Error`, ...).
    pub fn source_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self.source.as_ref()
    }
}
