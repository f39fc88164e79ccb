//! One log line per request, written by the task that runs the request to its end: a sender
//! that hangs up does not cancel its delivery (the event is still processed once and its
//! acknowledgement recorded for the redelivery), and the line still says what happened.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use idem::problem;
use serving::Tasks;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Middleware: runs the rest of the stack on a task of `tasks` that logs one line when the
/// request ends: method, path, status, latency, and whether the sender was still there.
/// Never a body, a header or a secret (a delivery's event and outcome are in its own
/// `delivery` line).
pub async fn log_request(State(tasks): State<Tasks>, request: Request, next: Next) -> Response {
    let waiting = SenderWaiting::default();
    let seen = waiting.clone();
    let task = tasks.spawn(async move {
        let started = Instant::now();
        let (method, path) = (request.method().clone(), request.uri().path().to_owned());
        let response = next.run(request).await;
        tracing::info!(
            %method,
            path,
            status = response.status().as_u16(),
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
            problem(500, "internal", "The request failed.", false).into_response()
        }
    }
}

/// Whether the sender still waits for the answer: cleared when the request's future is
/// dropped (hyper drops it when the sender hangs up).
#[derive(Debug, Clone, Default)]
struct SenderWaiting(Arc<AtomicBool>);

impl SenderWaiting {
    fn is_gone(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn guard(&self) -> GoneOnDrop {
        GoneOnDrop(Some(self.clone()))
    }
}

/// Marks the sender gone when dropped, unless disarmed (the answer was handed over).
struct GoneOnDrop(Option<SenderWaiting>);

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
