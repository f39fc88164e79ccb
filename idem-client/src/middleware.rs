//! The same loop as a `reqwest-middleware` middleware: a key per `send`, kept on every retry.

use crate::error::{Outcome, Stop, TransportFailure};
use crate::retry::{
    choose_key, classify, operation_span, record_end, retry, Attempted, Ended, Exchange, Last, Seen,
};
use crate::{AttemptError, Error, IdempotencyKey, RetryPolicy, DEFAULT_KEY_HEADER};
use http::Extensions;
use reqwest::header::HeaderName;
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use std::time::Duration;
use tokio::time::Instant;
use tracing::Instrument;

/// A [`reqwest_middleware::Middleware`] that gives every operation one idempotency key, kept
/// on each of its retries, and retries it under the same rules as the crate's
/// [`Client`](crate::Client): the same decision, backoff, `Retry-After` and deadline.
///
/// - **An operation is one `send`** (one call of [`Middleware::handle`]). Its key is, in
///   order: an [`IdempotencyKey`] given in the request's extensions
///   (`RequestBuilder::with_extension`); the one already in the key header (read as servers
///   built on `idem` read it); a fresh UUID v4 for every method but the safe ones (POST,
///   PATCH, PUT, DELETE, extension methods); none for GET, HEAD, OPTIONS and TRACE
///   ([`is_safe_method`](crate::is_safe_method)), which are retried without one. Every
///   attempt of the operation carries the same key.
/// - **What is retried** is what the client retries ([`is_retryable_status`](crate::is_retryable_status)):
///   connection errors, attempts that time out, 409 (the same key is being processed) and
///   429 after their `Retry-After`, 500, 502, 503 and 504; never another 4xx, a 501, nor an
///   answer marked `Idempotent-Replayed: true`. Pauses, `Retry-After` and the total deadline
///   follow the [`RetryPolicy`].
/// - **The body must be cloneable to be sent again.** A buffered body (bytes, text, `json`,
///   `form`) is. A streaming body (`reqwest::Body::wrap_stream`) is not: such a request is
///   sent once, under its key and the attempt timeout, and never retried.
/// - **What comes back.** An answer, whatever its status, is `Ok` (as reqwest does): the
///   operation's result, or the last answer when the rules stopped retrying (a 200 from a
///   redirect's target that does not echo the key included: check [`Attempts::outcome`]). Its extensions hold
///   [`Attempts`] (how many, why it stopped, whether the outcome is in doubt) and the
///   [`IdempotencyKey`] it was sent under, when it was keyed. An operation whose last attempt
///   got no answer is `Err(reqwest_middleware::Error::Middleware)` wrapping an [`Error`]
///   (`Error::Transport`, with the key, the attempts and the [`Outcome`]); a refused key is an
///   `Error::InvalidKey`. An error of a middleware further down the chain is returned as it
///   is, at once.
/// - **The answer's body is the caller's to read.** The middleware stops at the answer's
///   head: the attempt timeout covers sending and the head, not the body, and a connection
///   cut while the caller reads the body is an error of `Response::bytes` (or `json`, `text`)
///   that is not retried. The crate's [`Client`](crate::Client) reads every answer whole and
///   retries such a cut.
///
/// Use it instead of a generic retry middleware, not with one: a retrying middleware added
/// before it would make each of its retries a new operation, under a new key; one added after
/// it would retry each attempt again on its own, past the deadline.
///
/// ```no_run
/// use idem_client::{reqwest, reqwest_middleware, Attempts, IdempotencyMiddleware, RetryPolicy};
/// use std::time::Duration;
///
/// # async fn demo() -> Result<(), reqwest_middleware::Error> {
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(IdempotencyMiddleware::new().with_policy(RetryPolicy::default().deadline(Duration::from_secs(30))))
///     .build();
/// let response = client
///     .post("http://127.0.0.1:8080/v1/charges")
///     .basic_auth("sk_test_123", None::<&str>)
///     .form(&[("amount", "4242"), ("currency", "usd")])
///     .send()
///     .await?;
/// let attempts = response.extensions().get::<Attempts>().map_or(1, Attempts::count);
/// println!("{} after {attempts} attempt(s)", response.status());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct IdempotencyMiddleware {
    policy: RetryPolicy,
    key_header: HeaderName,
}

impl Default for IdempotencyMiddleware {
    fn default() -> Self {
        Self::new()
    }
}

impl IdempotencyMiddleware {
    /// The middleware under the default [`RetryPolicy`], with the `Idempotency-Key` header.
    ///
    /// ```
    /// use idem_client::{IdempotencyMiddleware, RetryPolicy};
    ///
    /// let middleware = IdempotencyMiddleware::new().with_policy(RetryPolicy::never());
    /// assert_eq!(middleware.policy().max_attempts_value(), 1);
    /// assert_eq!(middleware.key_header().as_str(), "idempotency-key");
    /// ```
    pub fn new() -> Self {
        Self {
            policy: RetryPolicy::default(),
            key_header: HeaderName::from_static(DEFAULT_KEY_HEADER),
        }
    }

    /// With `policy` for every operation.
    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// With the key sent in the header `name` instead of `Idempotency-Key`.
    ///
    /// ```
    /// use idem_client::reqwest::header::HeaderName;
    ///
    /// let middleware = idem_client::IdempotencyMiddleware::new()
    ///     .with_key_header(HeaderName::from_static("x-request-key"));
    /// assert_eq!(middleware.key_header().as_str(), "x-request-key");
    /// ```
    pub fn with_key_header(mut self, name: HeaderName) -> Self {
        self.key_header = name;
        self
    }

    /// The policy operations run under.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// The key's header name.
    pub fn key_header(&self) -> &HeaderName {
        &self.key_header
    }
}

/// How the middleware got the answer it returns: in the extensions of that
/// `reqwest::Response` (`response.extensions().get::<Attempts>()`).
///
/// ```
/// use idem_client::Attempts;
///
/// // What a response that came without the middleware lacks: one attempt is all it tells.
/// let response = idem_client::reqwest::Response::from(http::Response::new(""));
/// assert_eq!(response.extensions().get::<Attempts>().map_or(1, Attempts::count), 1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempts {
    count: u32,
    elapsed: Duration,
    ended: Option<(Stop, Outcome)>,
}

impl Attempts {
    /// How many attempts the operation made, this answer's included (1 = no retry).
    pub fn count(&self) -> u32 {
        self.count
    }

    /// From the start of the first attempt to this answer's head.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// Why the middleware stopped retrying when this answer is not the operation's result (a
    /// status of 400 or above, or a keyed request's answer from a redirect's target that does
    /// not echo the key, whatever its status); `None` for the operation's result.
    pub fn stop(&self) -> Option<Stop> {
        self.ended.map(|(stop, _)| stop)
    }

    /// What the caller may conclude about the effect when this answer is not the operation's
    /// result (a status of 400 or above: a 429 after an attempt that timed out is
    /// [`Outcome::InDoubt`]; a keyed request's answer from a redirect's target that does not
    /// echo the key, whatever its status, is in doubt); `None` for the operation's result.
    pub fn outcome(&self) -> Option<Outcome> {
        self.ended.map(|(_, outcome)| outcome)
    }
}

#[async_trait::async_trait]
impl Middleware for IdempotencyMiddleware {
    async fn handle(
        &self,
        request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let started = Instant::now();
        let mut request = request;
        let given = extensions.get::<IdempotencyKey>().cloned();
        let key = choose_key(given, &mut request, &self.key_header)
            .map_err(reqwest_middleware::Error::middleware)?;
        // A body that cannot be cloned cannot be sent again: one attempt.
        let replayable = request.try_clone().is_some();
        let policy = if replayable {
            self.policy.clone()
        } else {
            self.policy.clone().max_attempts(1)
        };
        let span = operation_span(&request, key.as_ref());
        if !replayable {
            tracing::info!(parent: &span, "the body cannot be cloned: sent once, not retried");
        }
        let mut chain = Chain {
            next,
            extensions,
            request: Some(request),
            replayable,
            key_header: &self.key_header,
        };
        let echo = key.is_some().then_some(&self.key_header);
        let ended = retry(&mut chain, &policy, started, &span, echo)
            .instrument(span.clone())
            .await;
        record_end(&span, &ended);
        let annotate = |mut response: Response, count: u32, ended: Option<(Stop, Outcome)>| {
            response.extensions_mut().insert(Attempts {
                count,
                elapsed: started.elapsed(),
                ended,
            });
            if let Some(key) = &key {
                response.extensions_mut().insert(key.clone());
            }
            response
        };
        match ended {
            Ended::Answered { answer, attempts } => Ok(annotate(answer, attempts, None)),
            Ended::Failed {
                last: Last::Answer(answer),
                attempts,
                stop,
                outcome,
            } => Ok(annotate(answer, attempts, Some((stop, outcome)))),
            Ended::Failed {
                last: Last::Error(last, status),
                attempts,
                stop,
                outcome,
            } => Err(reqwest_middleware::Error::middleware(Error::Transport(
                Box::new(TransportFailure {
                    last,
                    status,
                    attempts,
                    key,
                    stop,
                    outcome,
                }),
            ))),
            Ended::Aborted(error) => Err(error),
        }
    }
}

/// The middleware's way of making one attempt: the request passed down the rest of the chain,
/// the answer's head awaited within the attempt's timeout.
struct Chain<'a> {
    next: Next<'a>,
    extensions: &'a mut Extensions,
    /// The request as it came (with its key): cloned for each attempt, or given to the only
    /// one when its body cannot be cloned.
    request: Option<Request>,
    replayable: bool,
    /// The key's header.
    key_header: &'a HeaderName,
}

impl Exchange for Chain<'_> {
    type Answer = Response;
    type Abort = reqwest_middleware::Error;

    async fn attempt(
        &mut self,
        timeout: Duration,
    ) -> Result<Attempted<Response>, reqwest_middleware::Error> {
        let request = if self.replayable {
            self.request.as_ref().and_then(Request::try_clone)
        } else {
            self.request.take()
        };
        let request =
            request.ok_or_else(|| reqwest_middleware::Error::middleware(Error::StreamingBody))?;
        let (method, url) = (request.method().clone(), request.url().clone());
        let sent = self.next.clone().run(request, &mut *self.extensions);
        match tokio::time::timeout(timeout, sent).await {
            Err(_) => Ok((Err(AttemptError::Timeout(timeout)), None)),
            Ok(Ok(response)) => {
                let head = Seen::of(&response, &method, &url, self.key_header);
                Ok((Ok(response), Some(head)))
            }
            Ok(Err(reqwest_middleware::Error::Reqwest(error))) => Ok((Err(classify(error)), None)),
            // Another middleware's error: not the rules' to judge.
            Ok(Err(error)) => Err(error),
        }
    }
}
