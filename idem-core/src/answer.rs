//! The answer to a request that does not run: a replay, an in-flight duplicate, a mismatch.

use crate::policy::{InFlightAnswer, Policy};
use crate::problem::{retry_after_secs, Problem};
use crate::response::StoredResponse;
use std::time::Duration;

/// What a request gets when its handler must not run (C3, C5, C7): one type, rendered the same
/// way by every caller (the engine, the HTTP layer, an inbox).
///
/// `R` is the stored response: [`StoredResponse`] for applications; a store may decide on a
/// record whose response is still undecoded (`Answer<&[u8]>`) and decode only what it replays,
/// with [`Answer::try_map`].
///
/// ```
/// use idem_core::{Answer, Policy, StoredResponse};
/// use std::time::Duration;
/// let policy = Policy::default();
/// let busy: Answer = Answer::InFlight { retry_after: Duration::from_millis(1500) };
/// assert_eq!(busy.http_status(&policy), 409);
/// let http = busy.to_http(&policy);
/// assert_eq!(http.header("retry-after"), Some(&b"2"[..]));
/// assert_eq!(Answer::<StoredResponse>::Mismatch.http_status(&policy), 422);
/// let replay = Answer::Replay(StoredResponse::new(402, "declined")).to_http(&policy);
/// assert_eq!(replay.status, 402);
/// assert_eq!(replay.header("idempotent-replayed"), Some(&b"true"[..]));
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
    /// Converts the stored response, keeping the other variants; for example decodes the bytes
    /// a store read, only when the answer is a replay.
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

impl Answer {
    /// The HTTP status (docs/state-machine.md, HTTP mapping): the stored status for a replay, 409
    /// (or 202 for asynchronous endpoints, [`InFlightAnswer::Accepted`]) in flight, 422 for a
    /// mismatch.
    pub fn http_status(&self, policy: &Policy) -> u16 {
        match self {
            Answer::Replay(r) => r.status,
            Answer::InFlight { .. } => match policy.in_flight {
                InFlightAnswer::Accepted => 202,
                // A wait that ended before the original did answers like a conflict.
                _ => 409,
            },
            Answer::Mismatch => 422,
        }
    }

    /// The problem to answer with when this is not a replay: 409 `request-in-progress` with
    /// `Retry-After` (retryable), 422 `idempotency-key-reused`. `None` for a replay, and for an
    /// in-flight answer on an asynchronous endpoint ([`InFlightAnswer::Accepted`], a bare 202).
    ///
    /// ```
    /// use idem_core::{Answer, Policy};
    /// let p = Answer::Mismatch.problem(&Policy::default()).expect("a problem");
    /// assert_eq!((p.status, p.kind, p.retryable), (422, "idempotency-key-reused", false));
    /// ```
    pub fn problem(&self, policy: &Policy) -> Option<Problem> {
        match self {
            Answer::Replay(_) => None,
            Answer::InFlight { retry_after } => match policy.in_flight {
                InFlightAnswer::Accepted => None,
                _ => Some(
                    Problem::new(
                        409,
                        "request-in-progress",
                        "A request with this idempotency key is still being processed.",
                        true,
                    )
                    .with_retry_after(*retry_after),
                ),
            },
            Answer::Mismatch => Some(Problem::new(
                422,
                "idempotency-key-reused",
                "This idempotency key was used with another request.",
                false,
            )),
        }
    }

    /// The whole HTTP response: a replay is the stored response plus `Idempotent-Replayed: true`;
    /// in flight is a `application/problem+json` 409 with `Retry-After` (or a bare 202); a
    /// mismatch a problem 422. Problems carry `Cache-Control: no-store`.
    pub fn to_http(&self, policy: &Policy) -> StoredResponse {
        match self {
            Answer::Replay(stored) => stored.clone().with_header("idempotent-replayed", "true"),
            Answer::InFlight { retry_after } if self.problem(policy).is_none() => {
                StoredResponse::new(202, Vec::new())
                    .with_header("retry-after", retry_after_secs(*retry_after).to_string())
                    .with_header("cache-control", "no-store")
            }
            _ => self
                .problem(policy)
                .map(|p| p.to_response())
                .unwrap_or_default(),
        }
    }
}
