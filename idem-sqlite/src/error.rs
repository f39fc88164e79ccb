//! rusqlite's errors, mapped into idem's: which kind of failure, and the source kept.

use idem_core::{Error, StoreErrorKind};
use rusqlite::ErrorCode;

/// The backend name in [`idem_core::StoreError`].
pub(crate) const BACKEND: &str = "sqlite";

/// Maps a rusqlite error into idem's, its kind from [`classify`] and the rusqlite error kept as
/// the source (docs/state-machine.md C13): the error the store returns for its own statements
/// ([`SqliteStore::try_call`](crate::SqliteStore::try_call) maps with it), for a crate that runs
/// statements of its own on the store's database (the inbox's audit trail, the outbox), in
/// [`call`](crate::SqliteStore::call), [`read`](crate::SqliteStore::read) or on a connection of
/// its own ([`connect`](crate::SqliteStore::connect)).
///
/// ```
/// use idem_core::StoreErrorKind;
/// use idem_sqlite::{store_error, SqliteStore};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_core::Error> {
/// # let dir = tempfile::tempdir().expect("temp dir");
/// let store = SqliteStore::open(dir.path().join("idem.db")).await?;
/// let read = store
///     .read(|db| db.query_row("SELECT COUNT(*) FROM no_such_table", [], |row| row.get::<_, i64>(0)))
///     .await?
///     .map_err(store_error);
/// let error = read.expect_err("no such table");
/// assert_eq!(error.as_store().map(|e| (e.backend(), e.kind())), Some(("sqlite", StoreErrorKind::Misconfigured)));
/// # Ok(())
/// # }
/// ```
pub fn store_error(error: rusqlite::Error) -> Error {
    Error::store(BACKEND, classify(&error), error)
}

/// Which kind of failure a rusqlite error is, by what a caller can do about it; the store
/// classifies its own errors with this function, so your statements and the store agree on what
/// an outage is:
///
/// - busy or locked past the busy timeout, an I/O failure, a full disk, no memory, a file that
///   cannot be opened or locked: retry later ([`StoreErrorKind::Unavailable`]);
/// - a missing table or column, no permission, a read-only, foreign or corrupt file, a statement
///   the authorizer denied: an operator must act ([`StoreErrorKind::Misconfigured`]);
/// - anything else (a constraint violation, a query returning no rows):
///   [`StoreErrorKind::Other`].
///
/// ```
/// use idem_core::StoreErrorKind;
/// use idem_sqlite::classify;
/// use rusqlite::ffi;
///
/// let busy = rusqlite::Error::SqliteFailure(ffi::Error::new(ffi::SQLITE_BUSY), None);
/// assert_eq!(classify(&busy), StoreErrorKind::Unavailable);
/// assert_eq!(classify(&rusqlite::Error::QueryReturnedNoRows), StoreErrorKind::Other);
/// ```
pub fn classify(error: &rusqlite::Error) -> StoreErrorKind {
    if let rusqlite::Error::SqliteFailure(_, Some(message)) = error {
        if message.starts_with("no such table") || message.starts_with("no such column") {
            return StoreErrorKind::Misconfigured;
        }
    }
    match error.sqlite_error_code() {
        Some(
            ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::SystemIoFailure
            | ErrorCode::DiskFull
            | ErrorCode::OutOfMemory
            | ErrorCode::CannotOpen
            | ErrorCode::FileLockingProtocolFailed,
        ) => StoreErrorKind::Unavailable,
        Some(
            ErrorCode::PermissionDenied
            | ErrorCode::ReadOnly
            | ErrorCode::NotADatabase
            | ErrorCode::DatabaseCorrupt
            | ErrorCode::AuthorizationForStatementDenied,
        ) => StoreErrorKind::Misconfigured,
        _ => StoreErrorKind::Other,
    }
}

/// Whether a retry can help: [`classify`] says [`StoreErrorKind::Unavailable`] (retry later)
/// or [`StoreErrorKind::TransactionConflict`] (retry the whole transaction).
///
/// ```
/// use idem_sqlite::is_transient;
/// use rusqlite::ffi;
///
/// let full = rusqlite::Error::SqliteFailure(ffi::Error::new(ffi::SQLITE_FULL), None);
/// assert!(is_transient(&full));
/// let constraint = rusqlite::Error::SqliteFailure(ffi::Error::new(ffi::SQLITE_CONSTRAINT), None);
/// assert!(!is_transient(&constraint));
/// ```
pub fn is_transient(error: &rusqlite::Error) -> bool {
    matches!(
        classify(error),
        StoreErrorKind::Unavailable | StoreErrorKind::TransactionConflict
    )
}

/// Whether `error` is SQLite's "busy" or "locked".
pub(crate) fn is_busy(error: &Error) -> bool {
    error
        .as_store()
        .and_then(|e| e.source_ref().downcast_ref::<rusqlite::Error>())
        .and_then(rusqlite::Error::sqlite_error_code)
        .is_some_and(|code| matches!(code, ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c13_errors_keep_their_nature() {
        let conn = rusqlite::Connection::open_in_memory().expect("memory db");
        let missing = conn
            .execute("DELETE FROM nowhere", [])
            .expect_err("no table");
        let err = store_error(missing);
        let store = err.as_store().expect("a store error");
        assert_eq!(store.backend(), "sqlite");
        assert_eq!(store.kind(), StoreErrorKind::Misconfigured);
        assert!(!err.is_retryable());
        assert!(store
            .source_ref()
            .downcast_ref::<rusqlite::Error>()
            .is_some());

        let busy = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            None,
        );
        let err = store_error(busy);
        assert!(err.is_retryable());
        assert!(is_busy(&err));
    }

    #[test]
    fn c13_io_failures_and_a_full_disk_are_transient() {
        let failure = |code| rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None);
        for code in [
            rusqlite::ffi::SQLITE_BUSY,
            rusqlite::ffi::SQLITE_LOCKED,
            rusqlite::ffi::SQLITE_IOERR,
            rusqlite::ffi::SQLITE_FULL,
        ] {
            assert!(is_transient(&failure(code)), "{code}");
        }
        assert_eq!(
            classify(&failure(rusqlite::ffi::SQLITE_READONLY)),
            StoreErrorKind::Misconfigured
        );
        assert!(!is_transient(&failure(rusqlite::ffi::SQLITE_CONSTRAINT)));
    }
}
