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

/// Maps a redis error: a refused or dropped connection, a timeout, a cluster that is down or
/// moving slots, a server loading its data: retry later ([`StoreErrorKind::Unavailable`]); a
/// refused password or command: an operator must act ([`StoreErrorKind::Misconfigured`]).
pub(crate) fn store_error(error: redis::RedisError) -> Error {
    match error.code() {
        // A value of another type at a record's key: not a record, never a new one (C12).
        Some("WRONGTYPE") => {
            return Error::CorruptRecord(format!("redis record: {error}"));
        }
        // Out of memory under noeviction: writes come back once memory is freed.
        Some("OOM") => return Error::store(BACKEND, StoreErrorKind::Unavailable, error),
        _ => {}
    }
    let kind = if error.is_io_error()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.is_timeout()
        || error.is_cluster_error()
    {
        StoreErrorKind::Unavailable
    } else {
        match error.kind() {
            redis::ErrorKind::AuthenticationFailed | redis::ErrorKind::InvalidClientConfig => {
                StoreErrorKind::Misconfigured
            }
            redis::ErrorKind::Server(
                redis::ServerErrorKind::BusyLoading
                | redis::ServerErrorKind::TryAgain
                | redis::ServerErrorKind::ClusterDown
                | redis::ServerErrorKind::MasterDown,
            ) => StoreErrorKind::Unavailable,
            _ => StoreErrorKind::Other,
        }
    };
    Error::store(BACKEND, kind, error)
}
