//! redis-rs's errors, mapped into idem's: which kind of failure, and the source kept.

use idem_core::{Error, StoreErrorKind};

/// The backend name in [`idem_core::StoreError`].
pub(crate) const BACKEND: &str = "redis";

/// A reply that is not what the command or script returns: [`StoreErrorKind::Other`].
pub(crate) fn unexpected(what: &str, reply: &redis::Value) -> Error {
    Error::store(
        BACKEND,
        StoreErrorKind::Other,
        format!("{what} returned {reply:?}"),
    )
}

/// Maps a redis error: a value of another type at a record's key is a corrupt record (C12);
/// anything else is a store error of [`classify`], its source kept (C13).
pub(crate) fn store_error(error: redis::RedisError) -> Error {
    // A value of another type at a record's key: not a record, never a new one (C12).
    if is_wrong_type(&error) {
        return Error::CorruptRecord(format!("redis record: {error}"));
    }
    Error::store(BACKEND, classify(&error), error)
}

/// Whether `error` is Redis's `WRONGTYPE`, alone or as one reply of a pipeline (a read's
/// `HMGET` of a key holding a string: redis-rs gives the code of a pipeline's failure only
/// among its server errors).
fn is_wrong_type(error: &redis::RedisError) -> bool {
    const WRONG_TYPE: &str = "WRONGTYPE";
    error.code() == Some(WRONG_TYPE)
        || error
            .clone()
            .into_server_errors()
            .is_some_and(|errors| errors.iter().any(|(_, e)| e.code() == WRONG_TYPE))
}

/// Which kind of failure a redis error is, by what a caller can do about it; the store
/// classifies its own errors with this function, so your commands and the store agree on what
/// an outage is:
///
/// - a refused or dropped connection (on a Cluster, no connection left to any node), a timeout (a call past its response timeout, a connection
///   past its connection timeout), a cluster that is down or moving slots, a server loading its
///   data, a primary that is down, a replica's `READONLY` (a master demoted by a failover),
///   sentinels that name no master up (a failover under way), out of memory, a master refusing
///   writes while its replicas lag (`NOREPLICAS`, `min-replicas-to-write`), a server busy
///   running a slow script (`BUSY`), a server whose save failed refusing writes (`MISCONF`):
///   retry later
///   ([`StoreErrorKind::Unavailable`]);
/// - a refused password, a client configuration redis-rs rejects: an operator must act
///   ([`StoreErrorKind::Misconfigured`]);
/// - anything else: [`StoreErrorKind::Other`]. (The store itself reports a `WRONGTYPE` reply at a
///   record's key as a corrupt record, docs/state-machine.md C12, not as a store error.)
///
/// ```
/// use idem_core::StoreErrorKind;
/// use idem_redis::classify;
/// use std::io;
///
/// let reset = redis::RedisError::from(io::Error::from(io::ErrorKind::ConnectionReset));
/// assert_eq!(classify(&reset), StoreErrorKind::Unavailable);
/// ```
pub fn classify(error: &redis::RedisError) -> StoreErrorKind {
    // Out of memory under noeviction: writes come back once memory is freed. Not enough
    // replicas in step (`min-replicas-to-write`): writes come back with a replica (a failover
    // or a replica's restart under way). Busy running a script past `busy-reply-threshold`
    // (someone else's, on a shared Redis): calls come back when it ends or is killed. A
    // failed save under `stop-writes-on-bgsave-error` (`MISCONF`, a full or unwritable disk):
    // writes come back once a save succeeds, as after PostgreSQL's disk full (53100). Taken
    // for a refusal, either would store a completion's 500 in place of its answer (C8).
    // Found among a pipeline's server errors too (a read's `HMGET`, `TIME`), whose codes
    // redis-rs gives only there.
    let passing = |code: &str| matches!(code, "OOM" | "NOREPLICAS" | "BUSY" | "MISCONF");
    if error.code().is_some_and(passing)
        || error
            .clone()
            .into_server_errors()
            .is_some_and(|errors| errors.iter().any(|(_, e)| passing(e.code())))
    {
        return StoreErrorKind::Unavailable;
    }
    if error.is_io_error()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.is_timeout()
        || error.is_cluster_error()
    {
        return StoreErrorKind::Unavailable;
    }
    match error.kind() {
        // A cluster client with no connection to the key's node, nor to any other: every
        // connection was lost and is being re-established (a blackhole, a partition, every
        // node restarting). A store that is down, never a refusal: a completion given up on
        // it would leave its record in progress, and after the lease a retry would run the
        // effect again (C8).
        redis::ErrorKind::ClusterConnectionNotFound => StoreErrorKind::Unavailable,
        redis::ErrorKind::AuthenticationFailed
        | redis::ErrorKind::InvalidClientConfig
        | redis::ErrorKind::EmptySentinelList => StoreErrorKind::Misconfigured,
        redis::ErrorKind::MasterNameNotFoundBySentinel
        | redis::ErrorKind::Server(
            redis::ServerErrorKind::BusyLoading
            | redis::ServerErrorKind::TryAgain
            | redis::ServerErrorKind::ClusterDown
            | redis::ServerErrorKind::MasterDown
            | redis::ServerErrorKind::ReadOnly,
        ) => StoreErrorKind::Unavailable,
        _ => StoreErrorKind::Other,
    }
}

/// Whether a retry can help: [`classify`] says [`StoreErrorKind::Unavailable`] (retry later)
/// or [`StoreErrorKind::TransactionConflict`] (retry the whole transaction).
///
/// ```
/// use idem_redis::is_transient;
/// use std::io;
///
/// let timed_out = redis::RedisError::from(io::Error::from(io::ErrorKind::TimedOut));
/// assert!(is_transient(&timed_out));
/// ```
pub fn is_transient(error: &redis::RedisError) -> bool {
    matches!(
        classify(error),
        StoreErrorKind::Unavailable | StoreErrorKind::TransactionConflict
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    /// A call past its response timeout, or a connection past its connection timeout, is what
    /// redis-rs reports as an I/O error of kind `TimedOut`: unavailable, retryable, a 503.
    #[test]
    fn c13_a_timeout_is_unavailable_and_retryable() {
        let timed_out = redis::RedisError::from(io::Error::from(io::ErrorKind::TimedOut));
        assert!(timed_out.is_timeout());
        let error = store_error(timed_out);
        assert_eq!(
            error.as_store().map(|e| e.kind()),
            Some(StoreErrorKind::Unavailable),
            "{error}"
        );
        assert!(error.is_retryable(), "{error}");
        let source = error
            .as_store()
            .and_then(std::error::Error::source)
            .and_then(|source| source.downcast_ref::<redis::RedisError>());
        assert!(
            source.is_some_and(redis::RedisError::is_timeout),
            "the redis error is kept as the source: {source:?}"
        );
    }

    /// C13: a master demoted to a replica answers writes `READONLY`, and sentinels name no
    /// master up while a failover is under way: both retry later, and both count towards the
    /// rebuild that asks the sentinels again.
    #[test]
    fn c13_a_demoted_master_and_a_failover_under_way_are_unavailable() {
        let read_only = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
            "You can't write against a read only replica.",
        ));
        let no_master = redis::RedisError::from((
            redis::ErrorKind::MasterNameNotFoundBySentinel,
            "Master with given name not found in sentinel",
        ));
        for error in [read_only, no_master] {
            assert_eq!(classify(&error), StoreErrorKind::Unavailable, "{error}");
        }
    }

    /// C8, C13: a Redis running a slow script answers `BUSY` until it ends: unavailable, so a
    /// completion is retried, never replaced by a stored 500.
    #[test]
    fn c13_a_redis_busy_running_a_script_is_unavailable() {
        let reply = b"-BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.\r\n";
        let Ok(redis::Value::ServerError(busy)) = redis::parse_redis_value(reply) else {
            panic!("a server error");
        };
        let busy = redis::RedisError::from(busy);
        assert_eq!(busy.code(), Some("BUSY"));
        assert_eq!(classify(&busy), StoreErrorKind::Unavailable, "{busy}");
    }

    /// C8, C13: a Redis whose save failed refuses writes `MISCONF` until one succeeds again
    /// (a disk freed): unavailable, as PostgreSQL's disk full.
    #[test]
    fn c13_a_redis_refusing_writes_after_a_failed_save_is_unavailable() {
        let reply = b"-MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.\r\n";
        let Ok(redis::Value::ServerError(refused)) = redis::parse_redis_value(reply) else {
            panic!("a server error");
        };
        let refused = redis::RedisError::from(refused);
        assert_eq!(refused.code(), Some("MISCONF"));
        assert_eq!(classify(&refused), StoreErrorKind::Unavailable, "{refused}");
    }

    /// C8, C13: a cluster client left without a connection to any node is unavailable.
    #[test]
    fn c13_a_cluster_with_no_connection_left_is_unavailable() {
        let none = redis::RedisError::from((
            redis::ErrorKind::ClusterConnectionNotFound,
            "No connections found",
        ));
        assert_eq!(classify(&none), StoreErrorKind::Unavailable);
    }

    #[test]
    fn c13_a_lost_or_refused_connection_is_unavailable() {
        for kind in [
            io::ErrorKind::ConnectionRefused,
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::BrokenPipe,
            io::ErrorKind::UnexpectedEof,
        ] {
            let error = store_error(redis::RedisError::from(io::Error::from(kind)));
            assert_eq!(
                error.as_store().map(|e| e.kind()),
                Some(StoreErrorKind::Unavailable),
                "{kind:?}: {error}"
            );
        }
    }
}
