//! One log line per request, written by the task that runs the request to its end: a client
//! that hangs up does not cancel its request (a charge under way is still made, and the
//! idempotency layer stores its answer for the retry), and the line still says what happened.

use crate::errors::ApiError;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use idem::tower::Handled;
use serving::Tasks;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Middleware: runs the rest of the stack on a task of `tasks` that logs one line when the
/// request ends: method, path, status, what idempotency did, the key's consumer (an account
/// id, never the API key), the latency, and whether the client was still there. Never the
/// idempotency key, a body or a credential.
pub async fn log_request(State(tasks): State<Tasks>, request: Request, next: Next) -> Response {
    let waiting = ClientWaiting::default();
    let seen = waiting.clone();
    let task = tasks.spawn(async move {
        let started = Instant::now();
        let (method, path) = (request.method().clone(), request.uri().path().to_owned());
        let response = next.run(request).await;
        let handled = response.extensions().get::<Handled>();
        tracing::info!(
            %method,
            path,
            status = response.status().as_u16(),
            outcome = handled.map_or("-", |h| h.disposition.name()),
            consumer = handled.and_then(|h| h.consumer.as_deref()).unwrap_or("-"),
            latency_ms = format!("{:.1}", started.elapsed().as_secs_f64() * 1000.0),
            client = if seen.is_gone() { "gone" } else { "waiting" },
            "request"
        );
        response
    });
    let guard = waiting.guard();
    let answer = task.await;
    guard.disarm();
    match answer {
        Ok(response) => response,
        Err(error) => {
            tracing::error!(%error, "a request's task failed");
            ApiError::internal().into_response()
        }
    }
}

/// Whether the client still waits for the answer: cleared when the request's future is
/// dropped (hyper drops it when the client hangs up).
#[derive(Debug, Clone, Default)]
struct ClientWaiting(Arc<AtomicBool>);

impl ClientWaiting {
    fn is_gone(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn guard(&self) -> GoneOnDrop {
        GoneOnDrop(Some(self.clone()))
    }
}

/// Marks the client gone when dropped, unless disarmed (the answer was handed over).
struct GoneOnDrop(Option<ClientWaiting>);

impl GoneOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for GoneOnDrop {
    fn drop(&mut self) {
        if let Some(waiting) = self.0.take() {
            waiting.0.store(true, Ordering::Release);
        }
    }
}
