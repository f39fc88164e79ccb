//! The retry loop that the client and the middleware both run: the key chosen once, the
//! attempts, what the end of each one means (the result, final, or retried and after how
//! long), the pauses and the deadline, and what the caller may conclude when it fails.
//!
//! The rules live here once. [`Client`](crate::Client) and
//! [`IdempotencyMiddleware`](crate::IdempotencyMiddleware) each say only how one attempt is
//! made ([`Exchange`]): the client sends the request and reads its answer whole; the
//! middleware passes it down the middleware chain and stops at the answer's head.

use crate::decision::{is_retryable_status, is_safe_method, may_have_run};
use crate::error::{AttemptError, Outcome, Stop};
use crate::response::is_replayed;
use crate::{parse_retry_after, Error, IdempotencyKey, RetryPolicy};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{Method, Request, StatusCode, Url};
use std::future::Future;
use std::time::{Duration, SystemTime};
use tokio::time::Instant;
use tracing::{field, Instrument, Span};

/// What the retry rules read of an answer: its status and headers.
pub(crate) trait Head {
    /// The answer's status.
    fn status(&self) -> StatusCode;
    /// The answer's headers.
    fn headers(&self) -> &HeaderMap;
}

impl Head for reqwest::Response {
    fn status(&self) -> StatusCode {
        reqwest::Response::status(self)
    }

    fn headers(&self) -> &HeaderMap {
        reqwest::Response::headers(self)
    }
}

/// How one attempt ended: an answer, or an error with what its head said when it arrived
/// before the error.
pub(crate) type Attempted<A> = (Result<A, AttemptError>, Option<Seen>);

/// What the head of an answer said, kept for an error that cut its body off.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    /// The answer's status.
    pub(crate) status: StatusCode,
    /// Whether the server stored the answer under the key: replayed, or echoing the key in
    /// `key_header`.
    pub(crate) stored: bool,
    /// Whether the answer came from another URL than the request's: the `reqwest::Client`
    /// followed a redirect, so the request reached a server that answered it, and the answer
    /// is another request's (a POST turned into a GET by a 302 or 303).
    pub(crate) redirected: bool,
    /// Whether the request is a GET or a HEAD, which a redirect re-sends as it is (reqwest
    /// turns only other methods into a GET without their body): its target's answer is its own.
    pub(crate) resent_as_is: bool,
    /// The wait its `Retry-After` asked for, if any: kept for an error that cut the body of
    /// an answer that is retried, whose head still said when to come back.
    pub(crate) retry_after: Option<Duration>,
}

impl Seen {
    /// The head of `response`, the key's header being `key_header`, for a request of `method`
    /// sent to `url`.
    pub(crate) fn of(
        response: &reqwest::Response,
        method: &Method,
        url: &Url,
        key_header: &HeaderName,
    ) -> Self {
        let headers = response.headers();
        Self {
            status: response.status(),
            stored: is_replayed(headers) || headers.contains_key(key_header),
            redirected: without_fragment(response.url()) != without_fragment(url),
            resent_as_is: matches!(*method, Method::GET | Method::HEAD),
            retry_after: retry_after(headers),
        }
    }
}

/// The wait the `Retry-After` of `headers` asks for, from now; `None` when absent or
/// unreadable.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, SystemTime::now()))
}

/// `url` without its fragment, which is never sent (reqwest's answer's URL has none).
fn without_fragment(url: &Url) -> &str {
    let url = url.as_str();
    // A serialized URL holds `#` only as the fragment's delimiter.
    url.split_once('#').map_or(url, |(before, _)| before)
}

/// How one attempt is made; the loop ([`retry`]) decides everything else.
pub(crate) trait Exchange {
    /// An answer, as much of it as the attempt reads.
    type Answer: Head + Send;
    /// Why the operation must end at once, with no decision of the rules (a request that
    /// cannot be sent again, an error of another middleware).
    type Abort: Send;

    /// Sends the request once, within `timeout`.
    fn attempt(
        &mut self,
        timeout: Duration,
    ) -> impl Future<Output = Result<Attempted<Self::Answer>, Self::Abort>> + Send;
}

/// What the last failed attempt left.
pub(crate) enum Last<A> {
    /// An answer of 400 or above.
    Answer(A),
    /// The error, and the answer's status when its head arrived.
    Error(AttemptError, Option<StatusCode>),
}

/// How an operation ended.
pub(crate) enum Ended<A, E> {
    /// An answer below 400.
    Answered {
        /// The answer.
        answer: A,
        /// The attempts made, this one included.
        attempts: u32,
    },
    /// The last answer or error, when the rules stopped retrying.
    Failed {
        /// The last attempt's answer or error.
        last: Last<A>,
        /// The attempts made.
        attempts: u32,
        /// Why the loop stopped.
        stop: Stop,
        /// What the caller may conclude.
        outcome: Outcome,
    },
    /// Ended at once by the exchange.
    Aborted(E),
}

/// What the end of one attempt means.
enum Verdict<A> {
    /// An answer below 400: the result.
    Result(A),
    /// A failure a retry cannot help.
    Final(Last<A>),
    /// A failure worth a retry, with the `Retry-After` the answer asked for.
    Retry(Last<A>, Option<Duration>),
}

/// The one decision of the rules: what the end of an attempt means, and whether it leaves the
/// operation's effect in doubt (`in_doubt` is set, never cleared). `echo` is the key's header
/// when the operation has a key: an answer that carries it was stored under the key.
fn judge<A: Head>(
    result: Result<A, AttemptError>,
    seen: Option<Seen>,
    echo: Option<&HeaderName>,
    in_doubt: &mut bool,
) -> Verdict<A> {
    match result {
        Ok(answer) => {
            let status = answer.status();
            // A replayed answer is the stored answer of the operation: a retry would get it
            // again, so it is final whatever its status. A stored answer (replayed, or echoing
            // the key, as a server built on idem echoes it on the answers it stores and never
            // on a refusal it gave back) comes from an endpoint that ran: a 4xx too may follow
            // an effect (a 402 after a declined charge, a 422 after one that went through), so
            // its effect is in doubt, never "not executed".
            let replayed = is_replayed(answer.headers());
            let stored = replayed || echo.is_some_and(|name| answer.headers().contains_key(name));
            // An answer from a redirect's target says nothing of what the first server did
            // with the request: a refusal of the GET that followed a POST's 302 or 303 is not
            // the POST's, nor is its success (a 301 or 302 turns the POST into a GET without
            // its body: the charge was never sent, and the GET's 200 would say it was).
            let redirected = seen.is_some_and(|head| head.redirected);
            if status.as_u16() < 400 {
                // A keyed request's answer from another URL is its result only when stored
                // under its key (the POST itself re-sent by a 307 or 308 to a server that
                // echoes the key); any other is final and in doubt: a retry would be
                // redirected alike. A GET or HEAD is re-sent as it is: its target's answer is
                // its own.
                let resent_as_is = seen.is_some_and(|head| head.resent_as_is);
                if redirected && !stored && !resent_as_is && echo.is_some() {
                    *in_doubt = true;
                    return Verdict::Final(Last::Answer(answer));
                }
                return Verdict::Result(answer);
            }
            if stored || redirected || may_have_run(status) {
                *in_doubt = true;
            }
            if replayed || !is_retryable_status(status) {
                return Verdict::Final(Last::Answer(answer));
            }
            let retry_after = retry_after(answer.headers());
            Verdict::Retry(Last::Answer(answer), retry_after)
        }
        Err(error) => {
            let give_up = match (&error, seen) {
                // The server answered: what it said is unknown, and a retry would be
                // redirected, or answered at that size, alike.
                (AttemptError::Redirect(_) | AttemptError::TooLarge { .. }, _) => {
                    *in_doubt = true;
                    true
                }
                // The head said "not retried" (a 400, a 422, a 501): its body failing after it
                // changes nothing; a head the server stored is in doubt, as its whole answer.
                (_, Some(head))
                    if head.status.as_u16() >= 400 && !is_retryable_status(head.status) =>
                {
                    *in_doubt |= may_have_run(head.status)
                        || (head.stored && echo.is_some())
                        || head.redirected;
                    true
                }
                _ => {
                    *in_doubt |= !error.nothing_sent();
                    false
                }
            };
            let last = Last::Error(error, seen.map(|head| head.status));
            if give_up {
                Verdict::Final(last)
            } else {
                // A retried status (a 409, a 503) whose body was cut off: its head still said
                // when to come back.
                let retry_after = seen
                    .filter(|head| is_retryable_status(head.status))
                    .and_then(|head| head.retry_after);
                Verdict::Retry(last, retry_after)
            }
        }
    }
}

/// Runs one operation under `policy`, from `started`: attempts made by `exchange`, each judged
/// by the rules (`echo`: the key's header, when the operation has a key), with pauses between them, until a result, a failure that is not retried, the
/// last attempt, or the deadline. Each attempt gets an `idem_client.attempt` span under `span`.
pub(crate) async fn retry<X: Exchange>(
    exchange: &mut X,
    policy: &RetryPolicy,
    started: Instant,
    span: &Span,
    echo: Option<&HeaderName>,
) -> Ended<X::Answer, X::Abort> {
    let deadline = deadline_at(started, policy.deadline_value());
    // Whether some attempt may have reached the server and run without a definitive answer.
    let mut in_doubt = false;
    let mut attempt: u32 = 0;
    loop {
        attempt += 1;
        let remaining = deadline.saturating_duration_since(Instant::now());
        let timeout = policy.attempt_timeout_value().min(remaining);
        let attempt_span = tracing::info_span!(
            parent: span,
            "idem_client.attempt",
            attempt,
            timeout_ms = millis(timeout),
            status = field::Empty,
            error = field::Empty,
            delay_ms = field::Empty,
        );
        let (result, seen) = match exchange
            .attempt(timeout)
            .instrument(attempt_span.clone())
            .await
        {
            Ok(attempted) => attempted,
            Err(abort) => return Ended::Aborted(abort),
        };
        match &result {
            Ok(answer) => {
                attempt_span.record("status", answer.status().as_u16());
            }
            Err(error) => {
                attempt_span.record("error", field::display(error));
            }
        }
        let (last, retry_after) = match judge(result, seen, echo, &mut in_doubt) {
            Verdict::Result(answer) => {
                return Ended::Answered {
                    answer,
                    attempts: attempt,
                }
            }
            Verdict::Final(last) => {
                match &last {
                    Last::Answer(_) => {
                        tracing::info!(parent: &attempt_span, "the answer is not retried")
                    }
                    Last::Error(..) => {
                        tracing::info!(parent: &attempt_span, "the failure is not retried")
                    }
                }
                return failed(last, attempt, Stop::NotRetryable, in_doubt);
            }
            Verdict::Retry(last, retry_after) => (last, retry_after),
        };
        if attempt >= policy.max_attempts_value() {
            tracing::info!(parent: &attempt_span, "no attempt left");
            return failed(last, attempt, Stop::Attempts, in_doubt);
        }
        let pause = policy.pause(attempt, retry_after);
        let remaining = deadline.saturating_duration_since(Instant::now());
        // A pause (a Retry-After, as honoured) reaching past the deadline, or leaving less
        // than an attempt's least time after it: the server would not be asked again in time
        // (or with too little time to answer, leaving the outcome in doubt), so stop now with
        // the last answer, not sleep in vain.
        if pause.saturating_add(policy.min_attempt_time_value()) >= remaining {
            tracing::info!(
                parent: &attempt_span,
                remaining_ms = millis(remaining),
                pause_ms = millis(pause),
                "the deadline leaves no time for another attempt"
            );
            return failed(last, attempt, Stop::Deadline, in_doubt);
        }
        attempt_span.record("delay_ms", millis(pause));
        tracing::info!(parent: &attempt_span, delay_ms = millis(pause), "retrying");
        tokio::time::sleep(pause).await;
    }
}

fn failed<A, E>(last: Last<A>, attempts: u32, stop: Stop, in_doubt: bool) -> Ended<A, E> {
    Ended::Failed {
        last,
        attempts,
        stop,
        outcome: if in_doubt {
            Outcome::InDoubt
        } else {
            Outcome::NotExecuted
        },
    }
}

/// Chooses the operation's key and writes it in `request`'s header `name`: in order, `given`
/// (the caller's own), the one already in the header (read as servers built on `idem` read
/// it: bare or an sf-string), a fresh UUID v4 for every method but the safe ones, none for
/// GET, HEAD, OPTIONS and TRACE. The header value is marked sensitive.
pub(crate) fn choose_key(
    given: Option<IdempotencyKey>,
    request: &mut Request,
    name: &HeaderName,
) -> Result<Option<IdempotencyKey>, Error> {
    let key = match given {
        Some(key) => Some(key),
        None => match request.headers().get(name) {
            Some(value) => Some(IdempotencyKey::from_header(value.as_bytes())?),
            None => None,
        },
    };
    let key = match key {
        Some(key) => key,
        None if is_safe_method(request.method()) => return Ok(None),
        None => IdempotencyKey::random().map_err(Error::Randomness)?,
    };
    let mut value =
        HeaderValue::from_str(&key.to_header()).expect("a key's header form is visible ASCII");
    value.set_sensitive(true);
    request.headers_mut().insert(name.clone(), value);
    Ok(Some(key))
}

/// The `idem_client.operation` span of one operation on `request` (method, URL without its
/// query, whether it is keyed); the key's value is logged in it at debug level only.
pub(crate) fn operation_span(request: &Request, key: Option<&IdempotencyKey>) -> Span {
    let mut url = request.url().clone();
    url.set_query(None);
    url.set_fragment(None);
    let span = tracing::info_span!(
        "idem_client.operation",
        method = %request.method(),
        url = %url,
        keyed = key.is_some(),
        attempts = field::Empty,
        status = field::Empty,
        outcome = field::Empty,
    );
    if let Some(key) = key {
        tracing::debug!(parent: &span, key = %key, "the operation's idempotency key");
    }
    span
}

/// Records how the operation ended in its span: attempts, final status, outcome.
pub(crate) fn record_end<A: Head, E>(span: &Span, ended: &Ended<A, E>) {
    match ended {
        Ended::Answered { answer, attempts } => {
            span.record("attempts", attempts);
            span.record("status", answer.status().as_u16());
            span.record("outcome", "answered");
        }
        Ended::Failed {
            last,
            attempts,
            outcome,
            ..
        } => {
            span.record("attempts", attempts);
            if let Last::Answer(answer) = last {
                span.record("status", answer.status().as_u16());
            }
            span.record("outcome", format!("{outcome:?}").as_str());
        }
        Ended::Aborted(_) => {
            span.record("outcome", "aborted");
        }
    }
}

/// A connection that could not be opened is [`AttemptError::Connect`] (nothing sent); too
/// many redirects is [`AttemptError::Redirect`]; any other failure may have sent the request.
pub(crate) fn classify(error: reqwest::Error) -> AttemptError {
    if error.is_connect() {
        AttemptError::Connect(error)
    } else if error.is_redirect() {
        AttemptError::Redirect(error)
    } else {
        AttemptError::Transport(error)
    }
}

/// A deadline this far away stands for "none" (`Duration::MAX` cannot be added to an instant).
const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 86_400);

/// `started + deadline`, or a far future when that is past what an `Instant` can hold.
fn deadline_at(started: Instant, deadline: Duration) -> Instant {
    started
        .checked_add(deadline)
        .or_else(|| started.checked_add(FAR_FUTURE))
        .unwrap_or(started)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
