//! sqlx's errors, mapped into idem's: which kind of failure, and the source kept.

use idem_core::{Error, StoreErrorKind};

/// The backend name in [`idem_core::StoreError`].
pub(crate) const BACKEND: &str = "postgres";

/// Maps a sqlx error into idem's, its kind from [`classify`] and the sqlx error kept as the
/// source (docs/state-machine.md C13): the error the store returns for its own statements, for
/// a crate that runs statements of its own beside them (the inbox's audit trail, the outbox) on
/// the store's [`pool`](crate::PgStore::pool) or in the effect's transaction.
///
/// ```
/// use idem_core::StoreErrorKind;
/// use idem_postgres::store_error;
///
/// let error = store_error(sqlx::Error::PoolTimedOut);
/// let store = error.as_store().expect("a store error");
/// assert_eq!((store.backend(), store.kind()), ("postgres", StoreErrorKind::Unavailable));
/// ```
pub fn store_error(error: sqlx::Error) -> Error {
    Error::store(BACKEND, classify(&error), error)
}

/// Which kind of failure a sqlx error is, by what a caller can do about it; the store classifies
/// its own errors with this function, so your queries and the store agree on what an outage is:
///
/// - a serialization failure or a deadlock (SQLSTATE 40001, 40P01) rolled the caller's
///   transaction back: retry the whole transaction ([`StoreErrorKind::TransactionConflict`]);
/// - a refused or dropped connection, a protocol error, a server shutting down or starting, a
///   full disk, no memory, too many connections, a lock or statement timeout, a write on a
///   read-only server (a standby, or a primary a failover demoted) (class 08, 57P01..57P03,
///   53100, 53200, 53300, 55P03, 57014, 25006), a pool that timed out or closed: retry later
///   ([`StoreErrorKind::Unavailable`]);
/// - a missing table or schema, a wrong password, no permission, a bad URL or TLS setup: an
///   operator must act ([`StoreErrorKind::Misconfigured`]);
/// - anything else (a unique violation, a row not found, a decoding error):
///   [`StoreErrorKind::Other`].
///
/// ```
/// use idem_core::StoreErrorKind;
/// use idem_postgres::classify;
///
/// assert_eq!(classify(&sqlx::Error::PoolTimedOut), StoreErrorKind::Unavailable);
/// assert_eq!(classify(&sqlx::Error::RowNotFound), StoreErrorKind::Other);
/// ```
pub fn classify(error: &sqlx::Error) -> StoreErrorKind {
    match error {
        sqlx::Error::Database(db) => kind_of_sqlstate(db.code().as_deref().unwrap_or("")),
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => StoreErrorKind::Unavailable,
        sqlx::Error::Configuration(_) | sqlx::Error::Tls(_) => StoreErrorKind::Misconfigured,
        _ => StoreErrorKind::Other,
    }
}

/// Whether a retry can help: [`classify`] says [`StoreErrorKind::Unavailable`] (retry later)
/// or [`StoreErrorKind::TransactionConflict`] (retry the whole transaction).
///
/// ```
/// use idem_postgres::is_transient;
///
/// assert!(is_transient(&sqlx::Error::PoolTimedOut));
/// assert!(!is_transient(&sqlx::Error::RowNotFound));
/// ```
pub fn is_transient(error: &sqlx::Error) -> bool {
    matches!(
        classify(error),
        StoreErrorKind::Unavailable | StoreErrorKind::TransactionConflict
    )
}

/// Whether `error` says the link to the server may be out of sync or gone: unavailable, and not
/// an answer the server gave on a session it keeps (a statement or lock timeout, a full disk,
/// no memory, answered in order). A lost connection, a protocol error, a deadline the engine enforced, a server
/// ending the session, a read-only server (its session is on a server that can no longer take
/// the store's writes): a connection that saw one is closed, never reused.
pub(crate) fn is_broken_link(error: &Error) -> bool {
    let Some(store) = error.as_store() else {
        return false;
    };
    if store.kind() != StoreErrorKind::Unavailable {
        return false;
    }
    let answered_in_order = std::error::Error::source(store)
        .and_then(|source| source.downcast_ref::<sqlx::Error>())
        .and_then(sqlx::Error::as_database_error)
        .and_then(|db| db.code())
        .is_some_and(|code| matches!(code.as_ref(), "55P03" | "57014" | "53100" | "53200"));
    !answered_in_order
}

/// Whether `error` says a session had ended before its statement ran: the link failed with no
/// answer (an I/O or protocol error), or the server (or a pooler) ended the session (SQLSTATE
/// class 08, or 57P: an administrator's command, a crash, a restart). A server that answered
/// about itself (a standby, a read-only server) is not one: its other sessions answer alike.
pub(crate) fn ended_session(error: &Error) -> bool {
    let Some(sqlx_error) = error
        .as_store()
        .and_then(std::error::Error::source)
        .and_then(|source| source.downcast_ref::<sqlx::Error>())
    else {
        return false;
    };
    match sqlx_error.as_database_error().and_then(|db| db.code()) {
        Some(code) => code.starts_with("57P") || code.starts_with("08"),
        None => matches!(sqlx_error, sqlx::Error::Io(_) | sqlx::Error::Protocol(_)),
    }
}

/// The error of the effect's `BEGIN ..., READ WRITE`: a server in recovery (a standby, or a
/// primary a failover demoted) refuses read-write mode with SQLSTATE 0A000. That is a
/// connection on the wrong server, to close and replace ([`is_broken_link`]), like a write
/// refused as read-only (25006).
pub(crate) fn begin_error(error: sqlx::Error) -> Error {
    let in_recovery = error
        .as_database_error()
        .and_then(|db| db.code())
        .as_deref()
        == Some("0A000");
    if in_recovery {
        Error::store(BACKEND, StoreErrorKind::Unavailable, error)
    } else {
        store_error(error)
    }
}

/// Whether `error` is PostgreSQL's lock_not_available (SQLSTATE 55P03): a `lock_timeout`
/// passed while waiting for a lock.
pub(crate) fn is_lock_timeout(error: &Error) -> bool {
    has_sqlstate(error, "55P03")
}

/// Whether `error` is PostgreSQL's in_failed_sql_transaction (SQLSTATE 25P02): a statement
/// sent in a transaction an earlier error aborted, which is still open.
pub(crate) fn in_aborted_transaction(error: &Error) -> bool {
    has_sqlstate(error, "25P02")
}

/// Whether `error` is the server's answer with SQLSTATE `code`.
fn has_sqlstate(error: &Error, code: &str) -> bool {
    error
        .as_store()
        .and_then(std::error::Error::source)
        .and_then(|source| source.downcast_ref::<sqlx::Error>())
        .and_then(sqlx::Error::as_database_error)
        .and_then(|db| db.code())
        .as_deref()
        == Some(code)
}

/// The kind of a PostgreSQL error code (SQLSTATE).
pub(crate) fn kind_of_sqlstate(code: &str) -> StoreErrorKind {
    match code {
        // serialization_failure, deadlock_detected
        "40001" | "40P01" => StoreErrorKind::TransactionConflict,
        // undefined_table, undefined_column, invalid_schema_name, undefined_function,
        // invalid_password, invalid_authorization_specification, invalid_catalog_name,
        // insufficient_privilege
        "42P01" | "42703" | "3F000" | "42883" | "28P01" | "28000" | "3D000" | "42501" => {
            StoreErrorKind::Misconfigured
        }
        // connection exceptions, admin/crash shutdown, cannot connect now, disk full, out of
        // memory, too many connections, lock_not_available, query_canceled (statement
        // timeout), read_only_sql_transaction (a standby, or a primary demoted by a failover)
        c if c.starts_with("08") => StoreErrorKind::Unavailable,
        "57P01" | "57P02" | "57P03" | "53100" | "53200" | "53300" | "55P03" | "57014" | "25006" => {
            StoreErrorKind::Unavailable
        }
        _ => StoreErrorKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c13_sqlstates_keep_their_nature() {
        assert_eq!(
            kind_of_sqlstate("40001"),
            StoreErrorKind::TransactionConflict
        );
        assert_eq!(
            kind_of_sqlstate("40P01"),
            StoreErrorKind::TransactionConflict
        );
        assert_eq!(kind_of_sqlstate("42P01"), StoreErrorKind::Misconfigured);
        assert_eq!(kind_of_sqlstate("28P01"), StoreErrorKind::Misconfigured);
        assert_eq!(kind_of_sqlstate("08006"), StoreErrorKind::Unavailable);
        assert_eq!(kind_of_sqlstate("57P01"), StoreErrorKind::Unavailable);
        assert_eq!(kind_of_sqlstate("23505"), StoreErrorKind::Other);
        let refused = sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ));
        let err = store_error(refused);
        assert!(err.is_retryable());
        assert_eq!(err.as_store().map(|e| e.backend()), Some("postgres"));
    }

    #[test]
    fn c13_only_a_lost_link_closes_a_connection() {
        let lost = store_error(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "eof",
        )));
        assert!(is_broken_link(&lost));
        let cut = Error::store(BACKEND, StoreErrorKind::Unavailable, "timed out");
        assert!(is_broken_link(&cut), "a deadline the process enforced");
        assert!(!is_broken_link(&Error::LeaseLost));
        let conflict = Error::store(BACKEND, StoreErrorKind::TransactionConflict, "40001");
        assert!(!is_broken_link(&conflict));
    }

    /// A server's answer with a SQLSTATE, as sqlx gives it.
    #[derive(Debug)]
    struct Answered(&'static str);

    impl std::fmt::Display for Answered {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "the server answered {}", self.0)
        }
    }

    impl std::error::Error for Answered {}

    impl sqlx::error::DatabaseError for Answered {
        fn message(&self) -> &str {
            "the server answered"
        }
        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.0.into())
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    /// C13: a full disk or no memory is the server's answer on a session still in sync (like a
    /// statement or lock timeout): retried, but the connection is kept and the store stays on
    /// its host; one out-of-memory answer to a large statement never closes the connection nor
    /// moves a store given several hosts off a healthy primary (a new epoch closing all).
    #[test]
    fn c13_a_full_disk_or_no_memory_keeps_the_connection_and_the_host() {
        for code in ["55P03", "57014", "53100", "53200"] {
            let error = store_error(sqlx::Error::Database(Box::new(Answered(code))));
            assert!(error.is_retryable(), "{code}");
            assert!(
                !is_broken_link(&error),
                "SQLSTATE {code} is taken for a broken link: the connection is closed and the \
                 store leaves its host (Hosts::failed) as for a read-only server"
            );
        }
    }

    #[test]
    fn c13_busy_servers_and_broken_links_are_transient() {
        for code in [
            "53100", "53200", "53300", "55P03", "57014", "57P03", "08001", "25006",
        ] {
            assert_eq!(
                kind_of_sqlstate(code),
                StoreErrorKind::Unavailable,
                "{code}"
            );
        }
        assert!(is_transient(&sqlx::Error::Protocol(
            "unexpected message".into()
        )));
        assert!(is_transient(&sqlx::Error::PoolClosed));
        assert!(!is_transient(&sqlx::Error::RowNotFound));
        assert_eq!(
            classify(&sqlx::Error::Configuration("bad url".into())),
            StoreErrorKind::Misconfigured
        );
    }
}
