//! The one place that renders what idem answers as HTTP (the HTTP mapping of
//! docs/state-machine.md): errors and answers become an RFC 9457 [`Problem`] or a
//! [`StoredResponse`], and a [`StoredResponse`] an `http` response ([`into_http`]). The types
//! themselves ([`Error`], [`Answer`], [`Outcome`], [`RunError`]) carry meaning only; the HTTP
//! layer, the gRPC layer, the inbox and the examples all render through these functions, and an
//! application with its own error shape (Stripe's `{"error": {...}}`) renders the same
//! [`Problem`] its own way.
//!
//! ```
//! use idem_core::{Answer, Error, IdempotencyKey, StoredResponse};
//! use idem_tower::render;
//! use std::time::Duration;
//! let missing = IdempotencyKey::required(None).unwrap_err();
//! assert!(matches!(missing, Error::KeyMissing));
//! assert_eq!(render::problem_for(&missing).kind, "idempotency-key-missing");
//! assert_eq!(render::error(&missing).status, 400);
//!
//! let busy: Answer = Answer::InFlight { retry_after: Duration::from_millis(1500) };
//! let http = render::answer(&busy);
//! assert_eq!((http.status, http.header("retry-after")), (409, Some(&b"2"[..])));
//! let replay = render::answer(&Answer::Replay(StoredResponse::new(402, "declined")));
//! assert_eq!(replay.header("idempotent-replayed"), Some(&b"true"[..]));
//! assert_eq!(render::answer_status(&Answer::<StoredResponse>::Mismatch), 422);
//! ```

mod into_http;

mod problem;
pub use into_http::into_http;
pub use problem::{retry_after_secs, Problem, PROBLEM_BASE};

use idem_core::{Answer, Error, Field, Outcome, RunError, StoredResponse};
use std::time::Duration;

/// How long a client is told to wait before retrying after a store failure (C13).
const STORE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The HTTP status of `error` at the edge: 400 bad input or a missing key, 413 a body over the
/// limit, 503 a store failure (C13), 500 a lost lease, a corrupt record or a table at another
/// schema version (server faults: a retry cannot help, and the schema is the deployment's).
///
/// ```
/// use idem_core::{Error, StoreErrorKind};
/// use idem_tower::render;
/// assert_eq!(render::status_for(&Error::store("redis", StoreErrorKind::Unavailable, "down")), 503);
/// assert_eq!(render::status_for(&Error::LeaseLost), 500);
/// ```
pub fn status_for(error: &Error) -> u16 {
    match error {
        Error::KeyMissing | Error::InvalidInput { .. } => 400,
        Error::BodyTooLarge { .. } => 413,
        Error::Store(_) => 503,
        // A lost lease, a corrupt record, a table at another schema version: server faults.
        _ => 500,
    }
}

/// An RFC 9457 problem response: `type` is [`PROBLEM_BASE`] + `kind` (shorthand for
/// [`Problem::new`] + [`Problem::to_response`]).
///
/// ```
/// let p = idem_tower::render::problem(503, "store-unavailable", "Try again later.", true);
/// assert_eq!(p.header("content-type"), Some(&b"application/problem+json"[..]));
/// assert!(String::from_utf8_lossy(&p.body).contains("\"retryable\":true"));
/// ```
pub fn problem(status: u16, kind: &'static str, detail: &str, retryable: bool) -> StoredResponse {
    Problem::new(status, kind, detail, retryable).to_response()
}

/// The problem (RFC 9457) to answer `error` with: 400 `idempotency-key-missing` /
/// `idempotency-key-invalid` / `invalid-request`, 413 `body-too-large`, 503
/// `store-unavailable` with `Retry-After`, 500 `internal`. The detail is safe to show a client:
/// it never echoes the body.
///
/// ```
/// use idem_core::IdempotencyKey;
/// use idem_tower::render;
/// let p = render::problem_for(&IdempotencyKey::new("has space").unwrap_err());
/// assert_eq!((p.status, p.kind), (400, "idempotency-key-invalid"));
/// ```
pub fn problem_for(error: &Error) -> Problem {
    let (kind, detail) = match error {
        Error::KeyMissing => (
            "idempotency-key-missing",
            "This endpoint requires an Idempotency-Key header.".to_owned(),
        ),
        Error::InvalidInput {
            field: Field::Key,
            reason,
        } => (
            "idempotency-key-invalid",
            format!("Invalid Idempotency-Key: {reason}."),
        ),
        Error::InvalidInput { field, reason } => {
            ("invalid-request", format!("Invalid {field}: {reason}."))
        }
        Error::BodyTooLarge { limit, .. } => (
            "body-too-large",
            format!("The body is over the limit of {limit} bytes."),
        ),
        Error::Store(_) => (
            "store-unavailable",
            "The idempotency store is unavailable; retry later.".to_owned(),
        ),
        _ => ("internal", "The request could not be completed.".to_owned()),
    };
    let problem = Problem::new(status_for(error), kind, detail, error.is_retryable());
    match error {
        Error::Store(_) => problem.with_retry_after(STORE_RETRY_AFTER),
        _ => problem,
    }
}

/// The problem response for `error`: [`problem_for`], as `application/problem+json`.
///
/// ```
/// use idem_core::IdempotencyKey;
/// use idem_tower::render;
/// let http = render::error(&IdempotencyKey::required(None).unwrap_err());
/// assert_eq!(http.status, 400);
/// assert!(String::from_utf8_lossy(&http.body).contains("idempotency-key-missing"));
/// ```
pub fn error(error: &Error) -> StoredResponse {
    problem_for(error).to_response()
}

/// The HTTP status of an answer: the stored one for a replay, 409 in flight (an asynchronous
/// endpoint answers [`accepted`] instead), 422 for a mismatch.
pub fn answer_status(answer: &Answer) -> u16 {
    match answer {
        Answer::Replay(r) => r.status,
        Answer::InFlight { .. } => 409,
        Answer::Mismatch => 422,
    }
}

/// The problem of an answer that is one: 409 `request-in-progress` with `Retry-After`, 422
/// `idempotency-key-reused`; `None` for a replay.
pub fn answer_problem<R>(answer: &Answer<R>) -> Option<Problem> {
    match answer {
        Answer::Replay(_) => None,
        Answer::InFlight { retry_after } => Some(
            Problem::new(
                409,
                "request-in-progress",
                "A request with this idempotency key is still being processed.",
                true,
            )
            .with_retry_after(*retry_after),
        ),
        Answer::Mismatch => Some(Problem::new(
            422,
            "idempotency-key-reused",
            "This idempotency key was used with another request.",
            false,
        )),
    }
}

/// The whole HTTP response of an answer: the stored response marked
/// `Idempotent-Replayed: true` (C7), or the problem ([`answer_problem`]).
pub fn answer(answer: &Answer) -> StoredResponse {
    match answer {
        Answer::Replay(stored) => stored.clone().with_header("idempotent-replayed", "true"),
        _ => answer_problem(answer)
            .map(|p| p.to_response())
            .unwrap_or_default(),
    }
}

/// What an asynchronous endpoint answers a duplicate in flight instead of the 409 (C5): a 202
/// with `Retry-After`, to which the layer adds the `Location` of a status resource
/// ([`IdempotencyLayer::accept_in_flight`](crate::IdempotencyLayer::accept_in_flight)).
///
/// ```
/// use idem_tower::render;
/// use std::time::Duration;
/// let http = render::accepted(Duration::from_millis(200));
/// assert_eq!((http.status, http.header("retry-after")), (202, Some(&b"1"[..])));
/// ```
pub fn accepted(retry_after: Duration) -> StoredResponse {
    StoredResponse::new(202, Vec::new())
        .with_header("retry-after", retry_after_secs(retry_after).to_string())
        .with_header("cache-control", "no-store")
}

/// The HTTP status of an outcome of [`Idempotency::run`](idem_core::Idempotency::run).
///
/// ```
/// use idem_core::{Answer, Outcome, StoredResponse};
/// use idem_tower::render;
/// assert_eq!(render::outcome_status(&Outcome::Executed(StoredResponse::new(201, ""))), 201);
/// assert_eq!(render::outcome_status(&Outcome::Answered(Answer::Mismatch)), 422);
/// ```
pub fn outcome_status(outcome: &Outcome) -> u16 {
    match outcome {
        Outcome::Executed(r) | Outcome::Refused(r) => r.status,
        Outcome::Answered(a) => answer_status(a),
    }
}

/// The whole HTTP response of an outcome: the handler's response as it is, or the answer's
/// ([`answer`]).
pub fn outcome(outcome: &Outcome) -> StoredResponse {
    match outcome {
        Outcome::Executed(r) | Outcome::Refused(r) => r.clone(),
        Outcome::Answered(a) => answer(a),
    }
}

/// The HTTP status of a failed run: the error's own before the handler ran, the stored
/// answer's for an unknown outcome, 500 otherwise (never a 4xx once the effect may have run,
/// C8).
///
/// ```
/// use idem_core::{Error, RunError};
/// use idem_tower::render;
/// assert_eq!(render::run_error_status(&RunError::<()>::Idem(Error::KeyMissing)), 400);
/// assert_eq!(render::run_error_status(&RunError::Released(())), 500);
/// ```
pub fn run_error_status<E>(error: &RunError<E>) -> u16 {
    match error {
        RunError::Idem(e) => status_for(e),
        RunError::Unknown { response, .. } => response.status,
        _ => 500,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::StoreErrorKind;

    #[test]
    fn c13_a_store_failure_is_a_503_with_retry_after() {
        let down = Error::store("memory", StoreErrorKind::Unavailable, "down");
        let http = error(&down);
        assert_eq!(http.status, 503);
        assert_eq!(http.header("retry-after"), Some(&b"1"[..]));
        assert_eq!(http.header("cache-control"), Some(&b"no-store"[..]));
    }

    #[test]
    fn c05_an_asynchronous_endpoint_answers_202_in_flight() {
        let http = accepted(Duration::from_millis(200));
        assert_eq!(
            (http.status, http.header("retry-after")),
            (202, Some(&b"1"[..]))
        );
        assert_eq!(http.header("cache-control"), Some(&b"no-store"[..]));
        assert!(http.body.is_empty());
    }
}
