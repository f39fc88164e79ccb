//! Request bodies read in full before the router sees them, within a deadline and a budget of
//! bytes shared by all requests: a client that stalls mid-body is answered 408 and cut off, and
//! stalled uploads together hold at most the budget (a body that finds no room is refused at
//! once, 503). A refused body that is still arriving is read and discarded for a moment
//! (lingering), so that its client reads the refusal instead of a reset connection.

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::header::{CONNECTION, CONTENT_LENGTH};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use http_body_util::BodyExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{timeout_at, Instant};

/// How long the rest of a refused body is read and discarded before the connection closes.
const LINGER: Duration = Duration::from_secs(2);

/// The most bytes of a refused body read and discarded.
const LINGER_BYTES: usize = 8 * 1024 * 1024;

/// Why a request's body was refused (the connection is closed after the answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The body is over the limit (413).
    TooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The client did not send the whole body within the deadline (408).
    TimedOut {
        /// The deadline.
        after: Duration,
    },
    /// The server holds as many body bytes as it may; retry shortly (503, `Retry-After`).
    Busy,
    /// The body ended with an error: the client went away or broke the framing (400).
    Broken,
}

impl Refusal {
    /// The HTTP status.
    pub fn status(self) -> u16 {
        match self {
            Refusal::TooLarge { .. } => 413,
            Refusal::TimedOut { .. } => 408,
            Refusal::Busy => 503,
            Refusal::Broken => 400,
        }
    }
}

/// The settings and the shared budget of [`buffer_body`].
#[derive(Debug)]
pub struct BodyGate {
    budget: Arc<Semaphore>,
    max_body: usize,
    timeout: Duration,
    render: fn(Refusal) -> Response,
}

impl BodyGate {
    /// Bodies of at most `max_body` bytes, each read within `timeout`, at most `budget` bytes
    /// held at once (at least `max_body`), refusals answered by `render`.
    pub fn new(
        max_body: usize,
        timeout: Duration,
        budget: usize,
        render: fn(Refusal) -> Response,
    ) -> Arc<Self> {
        let budget = budget.max(max_body).min(Semaphore::MAX_PERMITS);
        Arc::new(Self {
            budget: Arc::new(Semaphore::new(budget)),
            max_body,
            timeout,
            render,
        })
    }

    /// The refusal, the rest of `body` read and discarded meanwhile (for a moment at most).
    fn refuse_lingering(&self, refusal: Refusal, body: Body) -> Response {
        tokio::spawn(discard(body));
        self.refuse(refusal)
    }

    fn refuse(&self, refusal: Refusal) -> Response {
        let mut response = (self.render)(refusal);
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        response
    }
}

/// Middleware: reads the request's body in full (within the gate's deadline and budget) and
/// passes the request on with it, holding its share of the budget until the answer.
pub async fn buffer_body(
    State(gate): State<Arc<BodyGate>>,
    request: Request,
    next: Next,
) -> Response {
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let (parts, mut body) = request.into_parts();
    let too_large = Refusal::TooLarge {
        limit: gate.max_body,
    };
    if declared.is_some_and(|n| n > gate.max_body as u64) {
        return gate.refuse_lingering(too_large, body);
    }
    if body.is_end_stream() {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let deadline = Instant::now() + gate.timeout;
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut held: Option<OwnedSemaphorePermit> = None;
    let mut total = 0usize;
    loop {
        let frame = match timeout_at(deadline, body.frame()).await {
            Err(_) => {
                return gate.refuse(Refusal::TimedOut {
                    after: gate.timeout,
                })
            }
            Ok(None) => break,
            Ok(Some(Err(_))) => return gate.refuse(Refusal::Broken),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers: not kept
        };
        if data.is_empty() {
            continue;
        }
        total += data.len();
        let n = match u32::try_from(data.len()) {
            Ok(n) if total <= gate.max_body => n,
            _ => return gate.refuse_lingering(too_large, body),
        };
        let Ok(permit) = Arc::clone(&gate.budget).try_acquire_many_owned(n) else {
            drop((data, chunks, held));
            return gate.refuse_lingering(Refusal::Busy, body);
        };
        match held.as_mut() {
            Some(held) => held.merge(permit),
            None => held = Some(permit),
        }
        chunks.push(data);
    }
    let bytes = match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.remove(0),
        _ => {
            let mut all = Vec::with_capacity(total);
            for chunk in chunks.drain(..) {
                all.extend_from_slice(&chunk);
            }
            Bytes::from(all)
        }
    };
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    drop(held);
    response
}

/// Reads and drops the rest of a refused body, for [`LINGER`] and [`LINGER_BYTES`] at most.
async fn discard(mut body: Body) {
    let until = Instant::now() + LINGER;
    let mut read = 0usize;
    while read < LINGER_BYTES {
        match timeout_at(until, body.frame()).await {
            Ok(Some(Ok(frame))) => read += frame.data_ref().map_or(0, Bytes::len),
            _ => return,
        }
    }
}
