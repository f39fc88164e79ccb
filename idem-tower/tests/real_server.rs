//! One effect per (consumer, route, key) through a real axum server, under
//! concurrency, slow handlers past the lease, client disconnects at every moment, panics and
//! failing bodies.
#![cfg(feature = "axum")]

mod support;

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idem_core::{Idempotency, MemoryStore, Store};
use idem_tower::IdempotencyLayer;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::{
    connect_and_write, exchange, header_account, raw_post, serve, with_lease, Decorated, Frames,
};

fn raw(path: &str, key: &str, body: &str) -> String {
    raw_post(
        path,
        &[
            ("Host", "t"),
            ("X-Account", "acct_1"),
            ("Idempotency-Key", key),
            ("Content-Type", "application/json"),
        ],
        body,
    )
}

/// Sends a request, reads the whole response; returns (status, raw response).
async fn send(addr: SocketAddr, path: &str, key: &str, body: &str) -> (u16, String) {
    exchange(addr, &raw(path, key, body)).await
}

/// Retries while 409 (as a client would), up to ~10 s.
async fn settle(addr: SocketAddr, path: &str, key: &str, body: &str) -> (u16, String) {
    for _ in 0..500 {
        let r = send(addr, path, key, body).await;
        if r.0 != 409 {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("still in flight after 10 s");
}

fn counting_app<S: Store + 'static>(
    idem: Idempotency<S>,
    effects: Arc<AtomicUsize>,
    work: Duration,
) -> Router {
    Router::new()
        .route(
            "/v1/charges",
            post(move |body: String| {
                let effects = Arc::clone(&effects);
                async move {
                    let n = effects.fetch_add(1, Ordering::SeqCst) + 1;
                    tokio::time::sleep(work).await;
                    (StatusCode::CREATED, format!("charge {n} {body}"))
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(idem, header_account))
}

async fn hammer(addr: SocketAddr, key: &str, n: usize) -> Vec<(u16, String)> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let key = key.to_owned();
        tasks.push(tokio::spawn(async move {
            send(addr, "/v1/charges", &key, r#"{"amount":1}"#).await
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c04_many_identical_requests_one_effect_memory_store() {
    let effects = Arc::new(AtomicUsize::new(0));
    let idem = with_lease(MemoryStore::new(), Duration::from_millis(300));
    let addr = serve(counting_app(
        idem,
        Arc::clone(&effects),
        Duration::from_millis(150),
    ))
    .await;
    for round in 0..5 {
        let key = format!("k-{round}");
        let replies = hammer(addr, &key, 48).await;
        for (status, text) in &replies {
            assert!(
                *status == 201 || *status == 409,
                "unexpected answer: {text}"
            );
            if *status == 201 {
                assert!(text.ends_with(&format!("charge {} {{\"amount\":1}}", round + 1)));
            }
        }
        let last = settle(addr, "/v1/charges", &key, r#"{"amount":1}"#).await;
        assert_eq!(last.0, 201, "{}", last.1);
        assert_eq!(
            effects.load(Ordering::SeqCst),
            round + 1,
            "one effect per key"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c04_many_identical_requests_one_effect_sqlite_store() {
    let dir = tempfile::tempdir().expect("dir");
    let store = idem_sqlite::SqliteStore::open(dir.path().join("i.db"))
        .await
        .expect("open");
    let effects = Arc::new(AtomicUsize::new(0));
    let idem = with_lease(store, Duration::from_millis(300));
    let addr = serve(counting_app(
        idem,
        Arc::clone(&effects),
        Duration::from_millis(100),
    ))
    .await;
    for round in 0..4 {
        let key = format!("k-{round}");
        let replies = hammer(addr, &key, 40).await;
        for (status, text) in &replies {
            assert!(*status == 201 || *status == 409, "unexpected: {text}");
        }
        let last = settle(addr, "/v1/charges", &key, r#"{"amount":1}"#).await;
        assert_eq!(last.0, 201, "{}", last.1);
        assert_eq!(effects.load(Ordering::SeqCst), round + 1);
    }
}

/// Concurrent requests with the same key and *different* bodies: one runs, the others are 422
/// (mismatch beats in flight), never a second effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c03_concurrent_mismatches_are_422_and_one_effect() {
    let effects = Arc::new(AtomicUsize::new(0));
    let idem = Idempotency::new(MemoryStore::new());
    let addr = serve(counting_app(
        idem,
        Arc::clone(&effects),
        Duration::from_millis(200),
    ))
    .await;
    let mut tasks = Vec::new();
    for i in 0..32 {
        tasks.push(tokio::spawn(async move {
            send(addr, "/v1/charges", "same", &format!("{{\"amount\":{i}}}")).await
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.expect("task").0);
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        1,
        "{statuses:?}"
    );
    assert!(
        statuses.iter().all(|s| *s == 201 || *s == 422),
        "{statuses:?}"
    );
}

/// A handler 5x longer than the lease, duplicates every 25 ms: the heartbeat keeps the lease,
/// nobody takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c09_slow_handler_past_the_lease_is_not_taken_over() {
    let effects = Arc::new(AtomicUsize::new(0));
    let idem = with_lease(MemoryStore::new(), Duration::from_millis(300));
    let addr = serve(counting_app(
        idem,
        Arc::clone(&effects),
        Duration::from_millis(1500),
    ))
    .await;
    let first = tokio::spawn(send(addr, "/v1/charges", "slow", r#"{"amount":1}"#));
    let mut saw = Vec::new();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(25)).await;
        saw.push(send(addr, "/v1/charges", "slow", r#"{"amount":1}"#).await.0);
    }
    let first = first.await.expect("task");
    assert_eq!(first.0, 201);
    assert_eq!(effects.load(Ordering::SeqCst), 1, "taken over: {saw:?}");
}

/// The client hangs up while its body is still being sent: nothing is recorded, and the full
/// request sent again runs (not a 409, not a replay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c08_disconnect_mid_body_records_nothing() {
    let effects = Arc::new(AtomicUsize::new(0));
    let addr = serve(counting_app(
        Idempotency::new(MemoryStore::new()),
        Arc::clone(&effects),
        Duration::ZERO,
    ))
    .await;
    let s = connect_and_write(
        addr,
        b"POST /v1/charges HTTP/1.1\r\nHost: t\r\nX-Account: acct_1\r\nIdempotency-Key: mid\r\nContent-Length: 100\r\n\r\n{\"amou",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(s);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = send(addr, "/v1/charges", "mid", r#"{"amount":1}"#).await;
    assert_eq!(r.0, 201, "{}", r.1);
    assert!(!r.1.to_ascii_lowercase().contains("idempotent-replayed"));
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

/// Disconnects at several moments: right after the request is written, mid-handler, after the
/// handler returned but before its completion is stored (the store delays `complete`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c08_disconnect_at_every_moment_one_effect_and_a_replay() {
    for (i, hang_up_after) in [0u64, 5, 50, 120, 180, 250, 350].into_iter().enumerate() {
        let effects = Arc::new(AtomicUsize::new(0));
        let store = Decorated::new(MemoryStore::new()).slow_complete(Duration::from_millis(150));
        // The completion (150 ms) fits well within the lease: this is about disconnects only.
        let idem = with_lease(store, Duration::from_secs(2));
        let addr = serve(counting_app(
            idem,
            Arc::clone(&effects),
            Duration::from_millis(100),
        ))
        .await;
        let key = format!("d-{i}");
        let s =
            connect_and_write(addr, raw("/v1/charges", &key, r#"{"amount":1}"#).as_bytes()).await;
        tokio::time::sleep(Duration::from_millis(hang_up_after)).await;
        drop(s);
        let r = settle(addr, "/v1/charges", &key, r#"{"amount":1}"#).await;
        assert_eq!(r.0, 201, "hang up after {hang_up_after} ms: {}", r.1);
        assert_eq!(
            effects.load(Ordering::SeqCst),
            1,
            "hang up after {hang_up_after} ms"
        );
        assert!(r.1.ends_with("charge 1 {\"amount\":1}"), "{}", r.1);
    }
}

/// A handler that panics: a 500 is stored; no retry runs it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c08_panicking_handler_runs_once() {
    let effects = Arc::new(AtomicUsize::new(0));
    let e = Arc::clone(&effects);
    let app = Router::new()
        .route(
            "/v1/charges",
            post(move || {
                let e = Arc::clone(&e);
                async move {
                    e.fetch_add(1, Ordering::SeqCst);
                    if e.load(Ordering::SeqCst) < 100 {
                        panic!("boom after the effect");
                    }
                    "unreachable"
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(
            Idempotency::new(MemoryStore::new()),
            header_account,
        ));
    let addr = serve(app).await;
    let first = send(addr, "/v1/charges", "p", "{}").await;
    assert_eq!(
        first.0, 0,
        "the connection is dropped by the panic: {}",
        first.1
    );
    for _ in 0..3 {
        let r = settle(addr, "/v1/charges", "p", "{}").await;
        assert_eq!(r.0, 500, "{}", r.1);
        assert!(r.1.contains("outcome-unknown"), "{}", r.1);
    }
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

/// A streaming response body that fails half way: stored 500, never rerun.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c08_failing_response_stream_is_a_stored_500() {
    let effects = Arc::new(AtomicUsize::new(0));
    let e = Arc::clone(&effects);
    let app = Router::new()
        .route(
            "/v1/charges",
            post(move || {
                let e = Arc::clone(&e);
                async move {
                    e.fetch_add(1, Ordering::SeqCst);
                    Response::builder()
                        .status(201)
                        .body(Body::new(Frames::new([
                            Ok("{\"partial\":"),
                            Err("upstream broke"),
                        ])))
                        .expect("response")
                        .into_response()
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(
            Idempotency::new(MemoryStore::new()),
            header_account,
        ));
    let addr = serve(app).await;
    for _ in 0..3 {
        let r = settle(addr, "/v1/charges", "s", "{}").await;
        assert_eq!(r.0, 500, "{}", r.1);
        assert!(!r.1.contains("partial"), "{}", r.1);
    }
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}
