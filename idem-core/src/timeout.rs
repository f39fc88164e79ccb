//! The error of a store call cut off by the engine's deadline (C13), told from store failures.

use crate::error::{Error, StoreErrorKind};
use crate::event_kind::Operation;
use std::fmt;
use std::time::Duration;

/// The error of a store call that did not answer within `timeout` (C13).
pub(crate) fn timed_out(operation: Operation, timeout: Duration) -> Error {
    Error::store(
        "idem",
        StoreErrorKind::Unavailable,
        TimedOut(format!(
            "the store did not answer {} within {timeout:?}",
            operation.name()
        )),
    )
}

/// The source of [`timed_out`]'s error.
#[derive(Debug)]
struct TimedOut(String);

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TimedOut {}

/// Whether `error` is a store call cut off by the engine's deadline.
pub(crate) fn is_timed_out(error: &Error) -> bool {
    error
        .as_store()
        .is_some_and(|e| e.source_ref().downcast_ref::<TimedOut>().is_some())
}
