//! What can go wrong with an operation, and what the caller can conclude about its effect.

use crate::{IdempotencyKey, InvalidKey, Response};
use reqwest::StatusCode;
use std::fmt;
use std::time::Duration;

/// What the caller can conclude about the operation's effect when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Certainly not executed: nothing was sent (refused before sending, or every attempt
    /// failed to connect), or the server refused with a 4xx (other than a live 409) that it
    /// did not store (neither replayed nor echoing the key) and no earlier attempt may have
    /// run unanswered. Changing the request and sending it again (under a new key) is safe.
    NotExecuted,
    /// In doubt: some attempt may have reached the server and run (a timeout after
    /// connecting, a connection closed after sending or cut mid-answer, a 5xx, a 409 saying
    /// an attempt is still running, a redirect loop, any answer from a redirect's target that
    /// was not stored under the key, an answer over the size limit), or the
    /// endpoint ran and stored a 4xx (replayed, or echoing the key), which may follow an
    /// effect (a 402 after a declined charge, a 422 after one that went through): read its
    /// body. Retry the same operation with the same key later, or look the result up; never
    /// send it again under a new key.
    InDoubt,
}

/// Why the client stopped retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The last attempt's failure is not one a retry can help (a 4xx other than 409/429, a
    /// 501, a redirect loop, a keyed request's answer from a redirect's target, an answer over
    /// the size limit, the body of such an answer cut off).
    NotRetryable,
    /// The policy's `max_attempts` were all made.
    Attempts,
    /// The next pause (backoff or `Retry-After`) would have reached past the deadline or left
    /// less than the policy's `min_attempt_time` before it, or the deadline passed.
    Deadline,
}

/// How one attempt failed without a complete answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AttemptError {
    /// No complete answer within the attempt's timeout (the attempt was abandoned and its
    /// connection closed; the server may still be running it).
    #[error("no complete answer within {0:?}")]
    Timeout(Duration),
    /// The connection could not be opened (refused, unreachable, DNS): nothing was sent.
    #[error("cannot connect")]
    Connect(#[source] reqwest::Error),
    /// The connection failed after it opened (reset, closed before or in the middle of the
    /// answer, a protocol error): the request may have been sent.
    #[error("the connection failed")]
    Transport(#[source] reqwest::Error),
    /// The server kept redirecting (a loop, or more redirects than the `reqwest::Client`
    /// follows): final, since a retry would be redirected alike, and in doubt, since the
    /// server answered.
    #[error("too many redirects")]
    Redirect(#[source] reqwest::Error),
    /// The answer's body is larger than the policy's `max_response_bytes` (by its
    /// `Content-Length` or as read): final, and in doubt (the server answered).
    #[error("the answer is larger than the limit of {limit} bytes")]
    TooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
}

impl AttemptError {
    /// Whether nothing of the request can have reached the server.
    pub fn nothing_sent(&self) -> bool {
        matches!(self, AttemptError::Connect(_))
    }
}

/// A final answer that is not the operation's result: a status of 400 or above, or, for a
/// keyed request, an answer from a redirect's target not stored under its key (whatever its
/// status: the GET that reqwest makes of a POST's 301, 302 or 303 is another request).
#[derive(Debug)]
pub struct StatusFailure {
    /// The answer, read whole, with the attempts and the key.
    pub response: Response,
    /// Why the client stopped.
    pub stop: Stop,
    /// What the caller can conclude.
    pub outcome: Outcome,
}

/// An operation whose last attempt got no complete answer.
#[derive(Debug)]
pub struct TransportFailure {
    /// How the last attempt failed.
    pub last: AttemptError,
    /// The status of the last attempt's answer when its head arrived but its body was not
    /// read whole (cut off, too large, too slow).
    pub status: Option<StatusCode>,
    /// The attempts made.
    pub attempts: u32,
    /// The key every attempt carried; `None` for a safe method (GET, HEAD, OPTIONS, TRACE)
    /// sent without one.
    pub key: Option<IdempotencyKey>,
    /// Why the client stopped.
    pub stop: Stop,
    /// What the caller can conclude.
    pub outcome: Outcome,
}

/// Why an operation did not end with a success.
///
/// [`Error::outcome`] says what the caller may conclude about the effect; the variants keep
/// the last answer or error, the attempts and the key. Its `source()` is the underlying error
/// (reqwest's, or the key's reason), never a repetition of its own message.
///
/// ```
/// use idem_client::{Error, Outcome};
///
/// let refused = Error::StreamingBody;
/// assert_eq!(refused.outcome(), Outcome::NotExecuted);
/// assert_eq!(refused.attempts(), 0);
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The request could not be built (a bad URL or header); nothing was sent.
    Build(reqwest::Error),
    /// The request's body is a stream, which cannot be sent again on a retry; nothing was
    /// sent. Buffer it (`.body(bytes)`, `.json(..)`, `.form(..)`).
    StreamingBody,
    /// The idempotency key given (in the request's key header) is not one servers built on
    /// `idem` accept; nothing was sent.
    InvalidKey(InvalidKey),
    /// No key could be made: the system's random source failed; nothing was sent.
    Randomness(getrandom::Error),
    /// The operation ended with an answer that is not its result: a status of 400 or above,
    /// or a keyed request's answer from a redirect's target (see [`StatusFailure`]).
    Status(Box<StatusFailure>),
    /// The operation's last attempt got no complete answer.
    Transport(Box<TransportFailure>),
}

impl From<InvalidKey> for Error {
    fn from(error: InvalidKey) -> Self {
        Error::InvalidKey(error)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Build(_) => f.write_str("the request could not be built"),
            Error::StreamingBody => f.write_str(
                "the request body is a stream and cannot be replayed on a retry; send a \
                 buffered body (bytes, JSON or form)",
            ),
            Error::InvalidKey(_) => f.write_str("invalid idempotency key"),
            Error::Randomness(_) => f.write_str("no idempotency key could be generated"),
            Error::Status(failure) => StatusDisplay(failure).fmt(f),
            Error::Transport(failure) => TransportDisplay(failure).fmt(f),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Build(error) => Some(error),
            Error::InvalidKey(error) => Some(error),
            Error::Randomness(error) => Some(error),
            // The attempt error's text is already in this message: its cause comes next.
            Error::Transport(failure) => std::error::Error::source(&failure.last),
            Error::StreamingBody | Error::Status(_) => None,
        }
    }
}

struct StatusDisplay<'a>(&'a StatusFailure);

impl fmt::Display for StatusDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let failure = self.0;
        write!(
            f,
            "the server answered {} after {} attempt(s) ({}; {})",
            failure.response.status,
            failure.response.attempts,
            stop_text(failure.stop),
            outcome_text(failure.outcome)
        )
    }
}

struct TransportDisplay<'a>(&'a TransportFailure);

impl fmt::Display for TransportDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let failure = self.0;
        write!(
            f,
            "no complete answer after {} attempt(s): {}",
            failure.attempts, failure.last,
        )?;
        if let Some(status) = failure.status {
            write!(f, " (status {status})")?;
        }
        write!(
            f,
            " ({}; {})",
            stop_text(failure.stop),
            outcome_text(failure.outcome)
        )
    }
}

impl std::error::Error for TransportFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.last)
    }
}

impl fmt::Display for TransportFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        TransportDisplay(self).fmt(f)
    }
}

fn stop_text(stop: Stop) -> &'static str {
    match stop {
        Stop::NotRetryable => "not retryable",
        Stop::Attempts => "out of attempts",
        Stop::Deadline => "out of time",
    }
}

fn outcome_text(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::NotExecuted => "not executed",
        Outcome::InDoubt => "outcome in doubt",
    }
}

impl Error {
    /// What the caller can conclude about the operation's effect: everything refused before
    /// sending is [`Outcome::NotExecuted`]; see [`Outcome`] for the rest.
    pub fn outcome(&self) -> Outcome {
        match self {
            Error::Status(failure) => failure.outcome,
            Error::Transport(failure) => failure.outcome,
            Error::Build(_)
            | Error::StreamingBody
            | Error::InvalidKey(_)
            | Error::Randomness(_) => Outcome::NotExecuted,
        }
    }

    /// The last answer, when the operation ended with one.
    pub fn response(&self) -> Option<&Response> {
        match self {
            Error::Status(failure) => Some(&failure.response),
            _ => None,
        }
    }

    /// The attempts made (0 when refused before sending).
    pub fn attempts(&self) -> u32 {
        match self {
            Error::Status(failure) => failure.response.attempts,
            Error::Transport(failure) => failure.attempts,
            _ => 0,
        }
    }

    /// The key every attempt carried. `None` when no attempt was made (refused before a key
    /// was chosen: [`Error::attempts`] is 0), or when the method is a safe one (GET, HEAD,
    /// OPTIONS, TRACE) sent without a key.
    pub fn key(&self) -> Option<&IdempotencyKey> {
        match self {
            Error::Status(failure) => failure.response.key.as_ref(),
            Error::Transport(failure) => failure.key.as_ref(),
            _ => None,
        }
    }

    /// The crate's error inside an error of a `reqwest_middleware` chain, when the
    /// [`IdempotencyMiddleware`](crate::IdempotencyMiddleware) made it (an operation whose
    /// last attempt got no answer, a refused key); `None` for reqwest's own errors and those
    /// of other middleware.
    ///
    /// ```
    /// use idem_client::{reqwest_middleware, Error, Outcome};
    ///
    /// let chained = reqwest_middleware::Error::middleware(Error::StreamingBody);
    /// let error = Error::in_middleware(&chained).expect("the crate's error");
    /// assert_eq!(error.outcome(), Outcome::NotExecuted);
    /// ```
    pub fn in_middleware(error: &reqwest_middleware::Error) -> Option<&Error> {
        match error {
            reqwest_middleware::Error::Middleware(error) => error.downcast_ref::<Error>(),
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }

    /// Why the client stopped retrying, when it made attempts.
    pub fn stop(&self) -> Option<Stop> {
        match self {
            Error::Status(failure) => Some(failure.stop),
            Error::Transport(failure) => Some(failure.stop),
            _ => None,
        }
    }
}
