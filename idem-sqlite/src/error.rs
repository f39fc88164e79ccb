//! rusqlite's errors, mapped into idem's: which kind of failure, and the source kept.

use idem_core::{Error, StoreErrorKind};
use rusqlite::ErrorCode;

/// The backend name in [`idem_core::StoreError`].
pub(crate) const BACKEND: &str = "sqlite";

/// Maps a rusqlite error: busy or locked past the busy timeout and I/O failures may pass
/// (retryable); a missing table or column, a read-only or foreign file, no permission need an
/// operator (misconfigured).
pub(crate) fn store_error(error: rusqlite::Error) -> Error {
    Error::store(BACKEND, kind_of(&error), error)
}

fn kind_of(error: &rusqlite::Error) -> StoreErrorKind {
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
}
