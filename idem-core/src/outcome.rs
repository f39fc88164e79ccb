//! What the closure style returns.

use crate::error::Error;
use crate::policy::{InFlightAnswer, Policy};
use crate::response::StoredResponse;
use std::time::Duration;

/// The result of [`Idempotency::run`](crate::Idempotency::run) when nothing failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Outcome {
    /// The handler ran now; this is its response as stored.
    Executed(StoredResponse),
    /// A duplicate of a completed request: the stored response, byte for byte (C7).
    Replayed(StoredResponse),
    /// A duplicate of a request still running (C5).
    InFlight {
        /// Time left on the running lease.
        retry_after: Duration,
    },
    /// The key was used for another request (C3).
    Mismatch,
}

impl Outcome {
    /// The HTTP status to answer with (DESIGN §7).
    ///
    /// ```
    /// use idem_core::{Outcome, Policy};
    /// use std::time::Duration;
    /// let busy = Outcome::InFlight { retry_after: Duration::from_millis(1500) };
    /// assert_eq!(busy.http_status(&Policy::default()), 409);
    /// assert_eq!(Outcome::Mismatch.http_status(&Policy::default()), 422);
    /// ```
    pub fn http_status(&self, policy: &Policy) -> u16 {
        match self {
            Outcome::Executed(r) | Outcome::Replayed(r) => r.status,
            Outcome::InFlight { .. } => match policy.in_flight {
                InFlightAnswer::Conflict => 409,
                InFlightAnswer::Accepted => 202,
            },
            Outcome::Mismatch => 422,
        }
    }

    /// The response, for executed and replayed outcomes.
    pub fn response(&self) -> Option<&StoredResponse> {
        match self {
            Outcome::Executed(r) | Outcome::Replayed(r) => Some(r),
            _ => None,
        }
    }
}

/// `Retry-After` in whole seconds, rounded up and at least 1 (C5).
///
/// ```
/// use idem_core::retry_after_secs;
/// use std::time::Duration;
/// assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
/// assert_eq!(retry_after_secs(Duration::from_millis(1500)), 2);
/// ```
pub fn retry_after_secs(retry_after: Duration) -> u64 {
    retry_after.as_millis().div_ceil(1000).max(1) as u64
}

/// Why [`Idempotency::run`](crate::Idempotency::run) failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError<E> {
    /// The idempotency layer failed (store down, lease lost, bad input...).
    #[error(transparent)]
    Idem(Error),
    /// The handler returned an error; the reservation was released so a retry can run (C8).
    #[error("handler failed: {0}")]
    Handler(E),
}
