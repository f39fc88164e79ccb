//! One logical operation and its retry loop: the key chosen once, the attempts, the pauses,
//! the deadline, and what the caller may conclude when it fails.

use crate::decision::{is_retryable_status, is_safe_method, may_have_run};
use crate::error::{AttemptError, Outcome, StatusFailure, Stop, TransportFailure};
use crate::response::is_replayed;
use crate::{
    parse_retry_after, Client, Error, IdempotencyKey, Response, RetryPolicy, DEFAULT_KEY_HEADER,
};
use bytes::{Bytes, BytesMut};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{Request, RequestBuilder, StatusCode};
use std::fmt;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, SystemTime};
use tokio::time::Instant;
use tracing::{field, Instrument};

/// One logical operation: one request, one idempotency key, as many attempts as the policy
/// allows.
///
/// The key is, in order: the one given with [`Operation::key`]; the one already in the
/// request's key header (read as servers built on `idem` read it: bare or an sf-string); a
/// fresh UUID v4 for every method but the safe ones (POST, PATCH, PUT, DELETE, ...); none for
/// GET, HEAD, OPTIONS and TRACE ([`is_safe_method`](crate::is_safe_method)). The key is sent
/// in its header form ([`IdempotencyKey::to_header`]), marked sensitive.
///
/// Its `Debug` form shows the key's length and the policy, never the request (whose headers
/// hold the key).
///
/// ```no_run
/// use idem_client::{Client, IdempotencyKey};
///
/// # async fn demo(order_id: u64) -> Result<(), Box<dyn std::error::Error>> {
/// let client = Client::new(reqwest::Client::new());
/// // The caller's own key: a restarted caller retries the same operation under it.
/// let key = IdempotencyKey::new(format!("order-{order_id}-payment"))?;
/// let response = client
///     .operation(client.post("http://127.0.0.1:8080/v1/charges").form(&[("amount", "500"), ("currency", "eur")]))
///     .key(key)
///     .send()
///     .await?;
/// # let _ = response;
/// # Ok(())
/// # }
/// ```
#[must_use = "an operation does nothing until `send` is awaited"]
pub struct Operation<'c> {
    client: &'c Client,
    builder: RequestBuilder,
    key: Option<IdempotencyKey>,
    policy: Option<RetryPolicy>,
}

impl fmt::Debug for Operation<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Operation")
            .field("key", &self.key)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl<'c> Operation<'c> {
    pub(crate) fn new(client: &'c Client, builder: RequestBuilder) -> Self {
        Operation {
            client,
            builder,
            key: None,
            policy: None,
        }
    }

    /// Sends every attempt under `key` (whatever the method).
    pub fn key(mut self, key: IdempotencyKey) -> Self {
        self.key = Some(key);
        self
    }

    /// Runs under `policy` instead of the client's.
    pub fn policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Sends the request, retrying under the policy, until an answer below 400 (`Ok`), an
    /// answer or error that is not retried, the last attempt, or the deadline (`Err`, with
    /// the last answer or error).
    ///
    /// Nothing is sent when the body is a stream ([`Error::StreamingBody`]), the request
    /// cannot be built, or the key in its header is invalid.
    pub async fn send(self) -> Result<Response, Error> {
        let started = Instant::now();
        let policy = self.policy.unwrap_or_else(|| self.client.policy().clone());
        let header = self.client.key_header().clone();
        let (http, request) = self.builder.build_split();
        let mut request = request.map_err(Error::Build)?;
        if request.body().is_some_and(|body| body.as_bytes().is_none()) {
            return Err(Error::StreamingBody);
        }
        let key = match self.key {
            Some(key) => Some(key),
            None => key_in(request.headers(), &header)?,
        };
        let key = match key {
            Some(key) => Some(key),
            None if is_safe_method(request.method()) => None,
            None => Some(IdempotencyKey::random().map_err(Error::Randomness)?),
        };
        if let Some(key) = &key {
            let mut value = HeaderValue::from_str(&key.to_header())
                .expect("a key's header form is visible ASCII");
            value.set_sensitive(true);
            request.headers_mut().insert(header.clone(), value);
        }
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
        if let Some(key) = &key {
            tracing::debug!(parent: &span, key = %key, "the operation's idempotency key");
        }
        let run = Run {
            http,
            request,
            key,
            policy,
            started,
            key_header: header,
        };
        let result = run.retry_loop(&span).instrument(span.clone()).await;
        match &result {
            Ok(response) => {
                span.record("attempts", response.attempts);
                span.record("status", response.status.as_u16());
                span.record("outcome", "answered");
            }
            Err(error) => {
                span.record("attempts", error.attempts());
                if let Some(response) = error.response() {
                    span.record("status", response.status.as_u16());
                }
                span.record("outcome", format!("{:?}", error.outcome()).as_str());
            }
        }
        result
    }
}

/// The key already in the request's header, if any, read as servers built on `idem` read it.
fn key_in(headers: &HeaderMap, name: &HeaderName) -> Result<Option<IdempotencyKey>, Error> {
    match headers.get(name) {
        None => Ok(None),
        Some(value) => Ok(Some(IdempotencyKey::from_header(value.as_bytes())?)),
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

/// One operation under way.
struct Run {
    http: reqwest::Client,
    request: Request,
    key: Option<IdempotencyKey>,
    policy: RetryPolicy,
    started: Instant,
    key_header: HeaderName,
}

/// An answer read whole.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

/// What the last failed attempt left.
enum Last {
    Answer(Answer),
    /// The error, and the answer's status when its head arrived.
    Error(AttemptError, Option<StatusCode>),
}

impl Run {
    async fn retry_loop(self, span: &tracing::Span) -> Result<Response, Error> {
        let deadline = deadline_at(self.started, self.policy.deadline_value());
        // Whether some attempt may have reached the server and run without a definitive answer.
        let mut in_doubt = false;
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            let remaining = deadline.saturating_duration_since(Instant::now());
            let timeout = self.policy.attempt_timeout_value().min(remaining);
            let attempt_span = tracing::info_span!(
                parent: span,
                "idem_client.attempt",
                attempt,
                timeout_ms = millis(timeout),
                status = field::Empty,
                error = field::Empty,
                delay_ms = field::Empty,
            );
            let request = self.request.try_clone().ok_or(Error::StreamingBody)?;
            let (result, seen) = self
                .attempt(request, timeout)
                .instrument(attempt_span.clone())
                .await;
            let (last, retry_after) = match result {
                Ok(answer) => {
                    attempt_span.record("status", answer.status.as_u16());
                    if answer.status.as_u16() < 400 {
                        return Ok(self.response(answer, attempt));
                    }
                    // A replayed answer is the stored answer of the operation: a retry would
                    // get it again, so it is final whatever its status, and definitive (only
                    // a stored 5xx, "outcome unknown", leaves the effect in doubt).
                    let replayed = is_replayed(&answer.headers);
                    let retryable = !replayed && is_retryable_status(answer.status);
                    if replayed {
                        in_doubt = answer.status.is_server_error();
                    } else if may_have_run(answer.status) {
                        in_doubt = true;
                    }
                    if !retryable {
                        tracing::info!(parent: &attempt_span, "the answer is not retried");
                        return Err(self.status_failure(
                            answer,
                            attempt,
                            Stop::NotRetryable,
                            in_doubt,
                        ));
                    }
                    let retry_after = answer
                        .headers
                        .get(RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| parse_retry_after(v, SystemTime::now()));
                    (Last::Answer(answer), retry_after)
                }
                Err(error) => {
                    attempt_span.record("error", field::display(&error));
                    let give_up = match (&error, seen) {
                        // The server answered: what it said is unknown, and a retry would be
                        // redirected, or answered at that size, alike.
                        (AttemptError::Redirect(_) | AttemptError::TooLarge { .. }, _) => {
                            in_doubt = true;
                            true
                        }
                        // The head said "not retried" (a 400, a 422, a 501): its body failing
                        // after it changes nothing.
                        (_, Some(status))
                            if status.as_u16() >= 400 && !is_retryable_status(status) =>
                        {
                            in_doubt |= may_have_run(status);
                            true
                        }
                        _ => {
                            in_doubt |= !error.nothing_sent();
                            false
                        }
                    };
                    if give_up {
                        tracing::info!(parent: &attempt_span, "the failure is not retried");
                        return Err(self.failure(
                            Last::Error(error, seen),
                            attempt,
                            Stop::NotRetryable,
                            in_doubt,
                        ));
                    }
                    (Last::Error(error, seen), None)
                }
            };
            if attempt >= self.policy.max_attempts_value() {
                tracing::info!(parent: &attempt_span, "no attempt left");
                return Err(self.failure(last, attempt, Stop::Attempts, in_doubt));
            }
            let pause = self.policy.pause(attempt, retry_after);
            let remaining = deadline.saturating_duration_since(Instant::now());
            // A pause (a Retry-After, as honoured) reaching past the deadline, or leaving less
            // than an attempt's least time after it: the server would not be asked again in
            // time (or with too little time to answer, leaving the outcome in doubt), so stop
            // now with the last answer, not sleep in vain.
            if pause.saturating_add(self.policy.min_attempt_time_value()) >= remaining {
                tracing::info!(
                    parent: &attempt_span,
                    remaining_ms = millis(remaining),
                    pause_ms = millis(pause),
                    "the deadline leaves no time for another attempt"
                );
                return Err(self.failure(last, attempt, Stop::Deadline, in_doubt));
            }
            attempt_span.record("delay_ms", millis(pause));
            tracing::info!(parent: &attempt_span, delay_ms = millis(pause), "retrying");
            tokio::time::sleep(pause).await;
        }
    }

    /// One attempt: the request sent and its answer read whole (up to the policy's
    /// `max_response_bytes`) within `timeout`; with the answer's status when its head arrived.
    async fn attempt(
        &self,
        request: Request,
        timeout: Duration,
    ) -> (Result<Answer, AttemptError>, Option<StatusCode>) {
        let seen = AtomicU16::new(0);
        let limit = self.policy.max_response_bytes_value();
        let exchange = async {
            let mut response = self.http.execute(request).await.map_err(classify)?;
            let status = response.status();
            seen.store(status.as_u16(), Ordering::Relaxed);
            let too_large = AttemptError::TooLarge { limit };
            if response
                .content_length()
                .is_some_and(|announced| announced > u64::try_from(limit).unwrap_or(u64::MAX))
            {
                return Err(too_large);
            }
            let mut headers = response.headers().clone();
            for (name, value) in headers.iter_mut() {
                if *name == self.key_header || name == DEFAULT_KEY_HEADER {
                    value.set_sensitive(true);
                }
            }
            let mut body = BytesMut::new();
            while let Some(chunk) = response.chunk().await.map_err(classify)? {
                if chunk.len() > limit - body.len() {
                    return Err(too_large);
                }
                body.extend_from_slice(&chunk);
            }
            Ok(Answer {
                status,
                headers,
                body: body.freeze(),
            })
        };
        let result = match tokio::time::timeout(timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(AttemptError::Timeout(timeout)),
        };
        let status = StatusCode::from_u16(seen.load(Ordering::Relaxed)).ok();
        (result, status)
    }

    fn response(&self, answer: Answer, attempts: u32) -> Response {
        Response {
            status: answer.status,
            headers: answer.headers,
            body: answer.body,
            attempts,
            key: self.key.clone(),
            elapsed: self.started.elapsed(),
            key_header: self.key_header.clone(),
        }
    }

    fn status_failure(&self, answer: Answer, attempts: u32, stop: Stop, in_doubt: bool) -> Error {
        Error::Status(Box::new(StatusFailure {
            response: self.response(answer, attempts),
            stop,
            outcome: outcome(in_doubt),
        }))
    }

    fn failure(&self, last: Last, attempts: u32, stop: Stop, in_doubt: bool) -> Error {
        match last {
            Last::Answer(answer) => self.status_failure(answer, attempts, stop, in_doubt),
            Last::Error(last, status) => Error::Transport(Box::new(TransportFailure {
                last,
                status,
                attempts,
                key: self.key.clone(),
                stop,
                outcome: outcome(in_doubt),
            })),
        }
    }
}

fn outcome(in_doubt: bool) -> Outcome {
    if in_doubt {
        Outcome::InDoubt
    } else {
        Outcome::NotExecuted
    }
}

/// A connection that could not be opened is [`AttemptError::Connect`] (nothing sent); too
/// many redirects is [`AttemptError::Redirect`]; any other failure may have sent the request.
fn classify(error: reqwest::Error) -> AttemptError {
    if error.is_connect() {
        AttemptError::Connect(error)
    } else if error.is_redirect() {
        AttemptError::Redirect(error)
    } else {
        AttemptError::Transport(error)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
