//! Which database failures mean "unavailable, retry later" (a 503 with `Retry-After`) rather
//! than a fault of the request or the code (a 500). The same classes as the stores' own
//! (idem-postgres and idem-sqlite), so a read and a charge agree on what an outage is.

use super::DbError;
use idem::postgres::sqlx;
use idem::sqlite::rusqlite;
use std::fmt;
use std::time::Duration;

/// How long a read may take before it is given up as unavailable: a frozen or blackholed
/// database answers 503 within it, never a hang.
pub const READ_DEADLINE: Duration = Duration::from_secs(5);

/// The database could not be reached in time: no connection, or no answer within
/// [`READ_DEADLINE`]. Always unavailable.
#[derive(Debug)]
pub struct Unreachable(pub String);

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the database is unreachable: {}", self.0)
    }
}

impl std::error::Error for Unreachable {}

/// Whether a failure is the database being unreachable or busy (a retry later may succeed),
/// rather than a fault of the request or the code.
pub fn is_unavailable(error: &DbError) -> bool {
    if error.downcast_ref::<Unreachable>().is_some() {
        return true;
    }
    if let Some(error) = error.downcast_ref::<idem::Error>() {
        return error.is_retryable();
    }
    if let Some(error) = error.downcast_ref::<sqlx::Error>() {
        return sqlx_unavailable(error);
    }
    if let Some(error) = error.downcast_ref::<rusqlite::Error>() {
        return sqlite_unavailable(error);
    }
    false
}

/// sqlx: a lost or refused connection, a pool that timed out or closed, a protocol error, or
/// a SQLSTATE that says the server cannot serve now.
fn sqlx_unavailable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| sqlstate_unavailable(&code)),
        _ => false,
    }
}

/// PostgreSQL's codes for "retry later": connection exceptions (class 08), too many
/// connections (53300), the server shutting down or starting (57P01..57P03), a lock or
/// statement timeout (55P03, 57014), a serialization failure or deadlock (40001, 40P01).
fn sqlstate_unavailable(code: &str) -> bool {
    code.starts_with("08")
        || matches!(
            code,
            "53300" | "57P01" | "57P02" | "57P03" | "55P03" | "57014" | "40001" | "40P01"
        )
}

/// SQLite: busy or locked past the busy timeout, an I/O failure, a full disk, no memory, a
/// file that cannot be opened or locked.
fn sqlite_unavailable(error: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode;
    matches!(
        error.sqlite_error_code(),
        Some(
            ErrorCode::DatabaseBusy
                | ErrorCode::DatabaseLocked
                | ErrorCode::SystemIoFailure
                | ErrorCode::DiskFull
                | ErrorCode::OutOfMemory
                | ErrorCode::CannotOpen
                | ErrorCode::FileLockingProtocolFailed
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boxed(error: impl std::error::Error + Send + Sync + 'static) -> DbError {
        Box::new(error)
    }

    #[test]
    fn outages_are_unavailable_and_faults_are_not() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert!(is_unavailable(&boxed(sqlx::Error::Io(refused))));
        assert!(is_unavailable(&boxed(sqlx::Error::PoolTimedOut)));
        assert!(is_unavailable(&boxed(Unreachable("timed out".into()))));
        assert!(!is_unavailable(&boxed(sqlx::Error::RowNotFound)));
        for code in [
            "08006", "08001", "53300", "57P01", "57P03", "55P03", "57014", "40001", "40P01",
        ] {
            assert!(sqlstate_unavailable(code), "{code}");
        }
        for code in ["23505", "42P01", "28P01", "22P02"] {
            assert!(!sqlstate_unavailable(code), "{code}");
        }
        let busy = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            None,
        );
        assert!(is_unavailable(&boxed(busy)));
        let constraint = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CONSTRAINT),
            None,
        );
        assert!(!is_unavailable(&boxed(constraint)));
        assert!(!is_unavailable(&boxed(std::fmt::Error)));
    }
}
