//! One log line per request, written by the task that runs the request to its end: a client
//! that hangs up does not cancel its request (a charge under way is still made, and the
//! idempotency layer stores its answer for the retry), and the line still says what happened.

use crate::errors::ApiError;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use idem::tower::Handled;
use serving::{run_logged, Ended, Tasks};

/// Middleware: runs the rest of the stack on a task of `tasks` that logs one line when the
/// request ends: method, path, status, what idempotency did, the key's consumer (an account
/// id, never the API key), the latency, and whether the client was still there. Never the
/// idempotency key, a body or a credential.
pub(crate) async fn log_request(
    State(tasks): State<Tasks>,
    request: Request,
    next: Next,
) -> Response {
    run_logged(&tasks, request, next, log_line, || {
        ApiError::internal().into_response()
    })
    .await
}

/// The request's line.
fn log_line(ended: &Ended<'_>) {
    let handled = ended.response.extensions().get::<Handled>();
    tracing::info!(
        method = %ended.method,
        path = ended.path,
        status = ended.response.status().as_u16(),
        outcome = handled.map_or("-", |h| h.disposition.name()),
        consumer = handled.and_then(|h| h.consumer.as_deref()).unwrap_or("-"),
        latency_ms = ended.latency_ms(),
        client = ended.client(),
        "request"
    );
}
