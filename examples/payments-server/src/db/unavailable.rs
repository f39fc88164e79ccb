//! Which database failures mean "unavailable, retry later" (a 503 with `Retry-After`) rather
//! than a fault of the request or the code (a 500). The stores' own classification
//! ([`idem::postgres::is_transient`], [`idem::sqlite::is_transient`]), so a read and a charge
//! agree on what an outage is.

use super::DbError;
use idem::postgres::sqlx;
use idem::sqlite::rusqlite;
use std::fmt;
use std::time::Duration;

/// How long a read may take before it is given up as unavailable: a frozen or blackholed
/// database answers 503 within it, never a hang.
pub(crate) const READ_DEADLINE: Duration = Duration::from_secs(5);

/// The database could not be reached in time: no connection, or no answer within
/// [`READ_DEADLINE`]. Always unavailable.
#[derive(Debug)]
pub(crate) struct Unreachable(pub String);

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the database is unreachable: {}", self.0)
    }
}

impl std::error::Error for Unreachable {}

/// Whether a failure is the database being unreachable or busy (a retry later may succeed),
/// rather than a fault of the request or the code. A sqlx or rusqlite error is judged as the
/// store judges its own: transient (unavailable, or a transaction conflict) or not.
pub(crate) fn is_unavailable(error: &DbError) -> bool {
    if error.downcast_ref::<Unreachable>().is_some() {
        return true;
    }
    if let Some(error) = error.downcast_ref::<idem::Error>() {
        return error.is_retryable();
    }
    if let Some(error) = error.downcast_ref::<sqlx::Error>() {
        return idem::postgres::is_transient(error);
    }
    if let Some(error) = error.downcast_ref::<rusqlite::Error>() {
        return idem::sqlite::is_transient(error);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boxed(error: impl std::error::Error + Send + Sync + 'static) -> DbError {
        Box::new(error)
    }

    fn sqlite(code: std::os::raw::c_int) -> DbError {
        boxed(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(code),
            None,
        ))
    }

    #[test]
    fn outages_are_unavailable_and_faults_are_not() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert!(is_unavailable(&boxed(sqlx::Error::Io(refused))));
        assert!(is_unavailable(&boxed(sqlx::Error::PoolTimedOut)));
        assert!(is_unavailable(&boxed(sqlx::Error::Protocol(
            "unexpected message".into()
        ))));
        assert!(is_unavailable(&boxed(Unreachable("timed out".into()))));
        assert!(!is_unavailable(&boxed(sqlx::Error::RowNotFound)));
        for code in [
            rusqlite::ffi::SQLITE_BUSY,
            rusqlite::ffi::SQLITE_IOERR,
            rusqlite::ffi::SQLITE_FULL,
        ] {
            assert!(is_unavailable(&sqlite(code)), "{code}");
        }
        assert!(!is_unavailable(&sqlite(rusqlite::ffi::SQLITE_CONSTRAINT)));
        assert!(!is_unavailable(&boxed(std::fmt::Error)));
    }

    #[test]
    fn a_store_error_is_judged_by_the_store() {
        let store = |kind| boxed(idem::Error::store("postgres", kind, "cause"));
        assert!(is_unavailable(&store(
            idem::store::StoreErrorKind::Unavailable
        )));
        assert!(is_unavailable(&store(
            idem::store::StoreErrorKind::TransactionConflict
        )));
        assert!(!is_unavailable(&store(
            idem::store::StoreErrorKind::Misconfigured
        )));
    }
}
