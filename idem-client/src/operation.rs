//! One logical operation of the client: its request, its key, its policy, and how the client
//! makes one attempt of it (the loop itself is the crate's one retry loop, shared with the
//! middleware).

use crate::error::{AttemptError, StatusFailure, TransportFailure};
use crate::retry::{
    choose_key, classify, operation_span, record_end, retry, Attempted, Ended, Exchange, Head,
    Last, Seen,
};
use crate::{Client, Error, IdempotencyKey, Response, RetryPolicy, DEFAULT_KEY_HEADER};
use bytes::{Bytes, BytesMut};
use reqwest::header::{HeaderMap, HeaderName};
use reqwest::{Request, RequestBuilder, StatusCode};
use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;
use tracing::Instrument;

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
        let key_header = self.client.key_header().clone();
        let (http, request) = self.builder.build_split();
        let mut request = request.map_err(Error::Build)?;
        if request.body().is_some_and(|body| body.as_bytes().is_none()) {
            return Err(Error::StreamingBody);
        }
        let key = choose_key(self.key, &mut request, &key_header)?;
        let span = operation_span(&request, key.as_ref());
        let mut wire = Wire {
            http,
            request,
            limit: policy.max_response_bytes_value(),
            key_header: &key_header,
        };
        let echo = key.is_some().then_some(&key_header);
        let ended = retry(&mut wire, &policy, started, &span, echo)
            .instrument(span.clone())
            .await;
        record_end(&span, &ended);
        let response = |answer: Answer, attempts: u32| Response {
            status: answer.status,
            headers: answer.headers,
            body: answer.body,
            attempts,
            key: key.clone(),
            elapsed: started.elapsed(),
            key_header: key_header.clone(),
        };
        match ended {
            Ended::Answered { answer, attempts } => Ok(response(answer, attempts)),
            Ended::Failed {
                last: Last::Answer(answer),
                attempts,
                stop,
                outcome,
            } => Err(Error::Status(Box::new(StatusFailure {
                response: response(answer, attempts),
                stop,
                outcome,
            }))),
            Ended::Failed {
                last: Last::Error(last, status),
                attempts,
                stop,
                outcome,
            } => Err(Error::Transport(Box::new(TransportFailure {
                last,
                status,
                attempts,
                key: key.clone(),
                stop,
                outcome,
            }))),
            Ended::Aborted(error) => Err(error),
        }
    }
}

/// The client's way of making one attempt: the request sent by the `reqwest::Client` that
/// built it, and its answer read whole (up to the policy's `max_response_bytes`).
struct Wire<'a> {
    http: reqwest::Client,
    request: Request,
    limit: usize,
    key_header: &'a HeaderName,
}

/// An answer read whole.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Head for Answer {
    fn status(&self) -> StatusCode {
        self.status
    }

    fn headers(&self) -> &HeaderMap {
        &self.headers
    }
}

impl Exchange for Wire<'_> {
    type Answer = Answer;
    type Abort = Error;

    /// One attempt: the request sent and its answer read whole within `timeout`; with the
    /// answer's status when its head arrived.
    async fn attempt(&mut self, timeout: Duration) -> Result<Attempted<Answer>, Error> {
        let request = self.request.try_clone().ok_or(Error::StreamingBody)?;
        let seen = Mutex::new(None);
        let limit = self.limit;
        let exchange = async {
            let mut response = self.http.execute(request).await.map_err(classify)?;
            let status = response.status();
            let head = Seen::of(
                &response,
                self.request.method(),
                self.request.url(),
                self.key_header,
            );
            *seen.lock().unwrap_or_else(PoisonError::into_inner) = Some(head);
            let too_large = AttemptError::TooLarge { limit };
            if response
                .content_length()
                .is_some_and(|announced| announced > u64::try_from(limit).unwrap_or(u64::MAX))
            {
                return Err(too_large);
            }
            let mut headers = response.headers().clone();
            for (name, value) in headers.iter_mut() {
                if name == self.key_header || name == DEFAULT_KEY_HEADER {
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
        let head = *seen.lock().unwrap_or_else(PoisonError::into_inner);
        Ok((result, head))
    }
}
