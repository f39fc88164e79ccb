//! The layer under a policy that waits (C5, `Policy::wait_in_flight`, docs/http.md "Waiting for
//! the original"): a duplicate sent while the original runs gets the original's response,
//! marked as a replay, once it ends; a wait that ends first is the 409 with `Retry-After`; the
//! handler runs once.
#![cfg(feature = "axum")]

mod support;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::routing::post;
use axum::Router;
use idem_core::{Idempotency, MemoryStore, Policy};
use idem_tower::{ConsumerError, IdempotencyLayer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{build_request, header, header_account, problem_type, send};
use tokio::sync::Notify;

const KEY: &str = "0b7a2c44-5d1e-4f0e-9a43-1f7c9d2e8b10";

/// A charges endpoint that takes `hold` (or until `go` is notified) and counts its executions.
fn app(wait: Duration, calls: Arc<AtomicUsize>, go: Arc<Notify>) -> Router {
    let policy = Policy::default().wait_in_flight(wait);
    let idem = Idempotency::with_policy(MemoryStore::new(), policy).expect("policy");
    let layer = IdempotencyLayer::new(
        idem,
        header_account as fn(&http::request::Parts) -> Result<String, ConsumerError>,
    );
    Router::new()
        .route(
            "/v1/charges",
            post(move |body: String| {
                let (calls, go) = (Arc::clone(&calls), Arc::clone(&go));
                async move {
                    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    go.notified().await;
                    (
                        StatusCode::CREATED,
                        [("content-type", "application/json")],
                        format!(r#"{{"charge":{n},"body":{body:?}}}"#),
                    )
                }
            }),
        )
        .route_layer(layer)
}

fn charge() -> Request<Body> {
    build_request(
        Method::POST,
        "/v1/charges",
        &[
            ("x-account", "acct_1"),
            ("content-type", "application/json"),
        ],
        Some(KEY),
        r#"{"amount":100}"#,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c05_a_waiting_duplicate_gets_the_original_response_marked_as_a_replay() {
    let calls = Arc::new(AtomicUsize::new(0));
    let go = Arc::new(Notify::new());
    let app = app(Duration::from_secs(5), Arc::clone(&calls), Arc::clone(&go));
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, charge()).await }
    });
    while calls.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let second = tokio::spawn({
        let app = app.clone();
        async move { (send(&app, charge()).await, Instant::now()) }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(!second.is_finished(), "the duplicate did not wait");
    go.notify_waiters();
    let first = first.await.expect("the original");
    let ended = Instant::now();
    let (second, answered) = second.await.expect("the duplicate");
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(second.status, StatusCode::CREATED);
    assert_eq!(
        second.body, first.body,
        "the original's body, byte for byte"
    );
    assert_eq!(header(&second, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&first, "idempotent-replayed"), None);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one execution");
    assert!(
        answered.saturating_duration_since(ended) < Duration::from_millis(300),
        "the duplicate was answered {:?} after the original",
        answered.saturating_duration_since(ended)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c05_a_wait_that_ends_before_the_original_is_a_409_with_retry_after() {
    let calls = Arc::new(AtomicUsize::new(0));
    let go = Arc::new(Notify::new());
    let wait = Duration::from_millis(200);
    let app = app(wait, Arc::clone(&calls), Arc::clone(&go));
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, charge()).await }
    });
    while calls.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let started = Instant::now();
    let second = send(&app, charge()).await;
    let took = started.elapsed();
    assert_eq!(second.status, StatusCode::CONFLICT);
    assert!(header(&second, "retry-after").is_some(), "Retry-After");
    assert_eq!(
        problem_type(&second),
        format!("{}request-in-progress", idem_tower::render::PROBLEM_BASE)
    );
    assert!(
        took >= wait,
        "answered after {took:?}, before the wait ended"
    );
    assert!(
        took < wait + Duration::from_millis(800),
        "answered after {took:?}"
    );
    go.notify_waiters();
    assert_eq!(
        first.await.expect("the original").status,
        StatusCode::CREATED
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one execution");
}
