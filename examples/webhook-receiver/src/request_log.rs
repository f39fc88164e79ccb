//! One log line per request, written by the task that runs the request to its end: a sender
//! that hangs up does not cancel its delivery (the event is still processed once and its
//! acknowledgement recorded for the redelivery), and the line still says what happened.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use idem::tower::{render::problem, Http};
use serving::{run_logged, Ended, Tasks};

/// Middleware: runs the rest of the stack on a task of `tasks` that logs one line when the
/// request ends: method, path, status, latency, and whether the sender was still there.
/// Never a body, a header or a secret (a delivery's event and outcome are in its own
/// `delivery` line).
pub(crate) async fn log_request(
    State(tasks): State<Tasks>,
    request: Request,
    next: Next,
) -> Response {
    run_logged(&tasks, request, next, log_line, || {
        Http(problem(500, "internal", "The request failed.", false)).into_response()
    })
    .await
}

/// The request's line.
fn log_line(ended: &Ended<'_>) {
    tracing::info!(
        method = %ended.method,
        path = ended.path,
        status = ended.response.status().as_u16(),
        latency_ms = ended.latency_ms(),
        client = ended.client(),
        "request"
    );
}
