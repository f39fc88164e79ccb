//! The answer to a request that does not run: a replay, an in-flight duplicate, a mismatch.

use crate::policy::{InFlightAnswer, Policy};
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

/// The problem type URIs of the answers and errors (RFC 9457), under this prefix.
pub const PROBLEM_BASE: &str = "https://idem.rs/problems/";

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
                InFlightAnswer::Conflict => 409,
                InFlightAnswer::Accepted => 202,
            },
            Answer::Mismatch => 422,
        }
    }

    /// The whole HTTP response: a replay is the stored response plus `Idempotent-Replayed: true`;
    /// in flight is a `application/problem+json` 409 with `Retry-After` (or a bare 202); a
    /// mismatch a problem 422. Problems carry `Cache-Control: no-store`.
    pub fn to_http(&self, policy: &Policy) -> StoredResponse {
        match self {
            Answer::Replay(stored) => stored.clone().with_header("idempotent-replayed", "true"),
            Answer::InFlight { retry_after } => {
                let secs = retry_after_secs(*retry_after).to_string();
                match policy.in_flight {
                    InFlightAnswer::Conflict => problem(
                        409,
                        "request-in-progress",
                        "A request with this idempotency key is still being processed.",
                        true,
                    )
                    .with_header("retry-after", secs),
                    InFlightAnswer::Accepted => StoredResponse::new(202, Vec::new())
                        .with_header("retry-after", secs)
                        .with_header("cache-control", "no-store"),
                }
            }
            Answer::Mismatch => problem(
                422,
                "idempotency-key-reused",
                "This idempotency key was used with another request.",
                false,
            ),
        }
    }
}

/// An RFC 9457 problem response: `type` is [`PROBLEM_BASE`] + `kind`.
///
/// ```
/// let p = idem_core::problem(503, "store-unavailable", "Try again later.", true);
/// assert_eq!(p.header("content-type"), Some(&b"application/problem+json"[..]));
/// assert!(String::from_utf8_lossy(&p.body).contains("\"retryable\":true"));
/// ```
pub fn problem(status: u16, kind: &str, detail: &str, retryable: bool) -> StoredResponse {
    let body = format!(
        "{{\"type\":\"{PROBLEM_BASE}{kind}\",\"title\":\"{kind}\",\"status\":{status},\"detail\":\"{}\",\"retryable\":{retryable}}}",
        detail.replace('\\', "\\\\").replace('"', "\\\"")
    );
    StoredResponse::new(status, body)
        .with_header("content-type", "application/problem+json")
        .with_header("cache-control", "no-store")
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
    u64::try_from(retry_after.as_millis().div_ceil(1000))
        .unwrap_or(u64::MAX)
        .max(1)
}
