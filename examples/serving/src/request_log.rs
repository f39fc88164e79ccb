//! One log line per request, written by the task that runs the request to its end: a client
//! that hangs up does not cancel its request, and the line still says what happened and that
//! the client was gone. Each server writes its own line (its own fields) from an [`Ended`].

use crate::Tasks;
use axum::extract::Request;
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a request ended, for its log line.
#[derive(Debug)]
pub struct Ended<'a> {
    /// The request's method.
    pub method: &'a Method,
    /// The request's path (without the query).
    pub path: &'a str,
    /// The answer.
    pub response: &'a Response,
    /// From the start of the request's task to its answer.
    pub latency: Duration,
    /// Whether the client hung up before the answer was ready.
    pub client_gone: bool,
}

impl Ended<'_> {
    /// The latency in milliseconds with one decimal (`12.3`).
    pub fn latency_ms(&self) -> String {
        format!("{:.1}", self.latency.as_secs_f64() * 1000.0)
    }

    /// `"gone"` if the client hung up, else `"waiting"`.
    pub fn client(&self) -> &'static str {
        if self.client_gone {
            "gone"
        } else {
            "waiting"
        }
    }
}

/// Runs the rest of the stack (`next`) for `request` on a task of `tasks`, which calls `log`
/// once the answer is ready (whether or not the client still waits); `failed` gives the answer
/// if the task itself fails (a panic), which is logged.
pub async fn run_logged(
    tasks: &Tasks,
    request: Request,
    next: Next,
    log: fn(&Ended<'_>),
    failed: fn() -> Response,
) -> Response {
    let waiting = ClientWaiting::default();
    let seen = waiting.clone();
    let task = tasks.spawn(async move {
        let started = Instant::now();
        let (method, path) = (request.method().clone(), request.uri().path().to_owned());
        let response = next.run(request).await;
        log(&Ended {
            method: &method,
            path: &path,
            response: &response,
            latency: started.elapsed(),
            client_gone: seen.is_gone(),
        });
        response
    });
    let guard = waiting.guard();
    let answer = task.await;
    guard.disarm();
    match answer {
        Ok(response) => response,
        Err(error) => {
            tracing::error!(%error, "a request's task failed");
            failed()
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
