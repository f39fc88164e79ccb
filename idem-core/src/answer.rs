//! The answer to a request that does not run: a replay, an in-flight duplicate, a mismatch.

use crate::response::StoredResponse;
use std::time::Duration;

/// What a request gets when its handler must not run (C3, C5, C7), for every caller alike. `R`:
/// [`StoredResponse`], or undecoded bytes a store decodes with [`Answer::try_map`] to replay.
///
/// ```
/// use idem_core::{Answer, StoredResponse};
/// use std::time::Duration;
/// let busy: Answer = Answer::InFlight { retry_after: Duration::from_millis(1500) };
/// assert!(!busy.is_replay());
/// let stored = Answer::Replay(b"{}".as_slice()).try_map(|bytes| Ok::<_, ()>(StoredResponse::new(200, bytes)));
/// assert_eq!(stored, Ok(Answer::Replay(StoredResponse::new(200, "{}"))));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Answer<R = StoredResponse> {
    /// A duplicate of a completed request: its stored response, byte for byte (C7).
    Replay(R),
    /// A duplicate of a request still running: answer at once, never wait (C5).
    InFlight {
        /// Time left on the running lease.
        retry_after: Duration,
    },
    /// The key was used for another request (C3): nothing runs, nothing changes.
    Mismatch,
}

impl<R> Answer<R> {
    /// Converts a replay's response (decodes it, say); other variants are kept.
    pub fn try_map<T, E>(self, f: impl FnOnce(R) -> Result<T, E>) -> Result<Answer<T>, E> {
        Ok(match self {
            Answer::Replay(r) => Answer::Replay(f(r)?),
            Answer::InFlight { retry_after } => Answer::InFlight { retry_after },
            Answer::Mismatch => Answer::Mismatch,
        })
    }

    /// Whether this is a replay.
    pub fn is_replay(&self) -> bool {
        matches!(self, Answer::Replay(_))
    }
}
