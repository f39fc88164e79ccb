//! C9 through the layer: only a dead process's record becomes an orphan. A live process keeps
//! its lease while its completion is stored and while its handler blocks a worker thread.
#![cfg(feature = "axum")]

mod support;

use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use idem_core::MemoryStore;
use idem_tower::IdempotencyLayer;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::{exchange, fixed_account, raw_post, serve, with_lease, Decorated};

/// POSTs `{}` to `/v1/charges` with `key`: (status, raw response).
async fn send(addr: SocketAddr, key: &str) -> (u16, String) {
    let request = raw_post(
        "/v1/charges",
        &[("Host", "t"), ("Idempotency-Key", key)],
        "{}",
    );
    exchange(addr, &request).await
}

/// The handler returns at once; storing its completion takes 1.5 leases. The heartbeat runs
/// until the completion is stored, so a duplicate meanwhile is in flight, never a takeover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c09_a_completion_slower_than_the_rest_of_the_lease_keeps_the_key() {
    let effects = Arc::new(AtomicUsize::new(0));
    let e = Arc::clone(&effects);
    let idem = with_lease(
        Decorated::new(MemoryStore::new()).slow_complete(Duration::from_millis(450)),
        Duration::from_millis(300),
    );
    let app = Router::new()
        .route(
            "/v1/charges",
            post(move || {
                let e = Arc::clone(&e);
                async move {
                    let n = e.fetch_add(1, Ordering::SeqCst) + 1;
                    (StatusCode::CREATED, format!("charge {n}"))
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(idem, fixed_account));
    let addr = serve(app).await;

    let first = tokio::spawn(send(addr, "k"));
    tokio::time::sleep(Duration::from_millis(350)).await;
    let duplicate = tokio::spawn(send(addr, "k"));
    let (first, duplicate) = (first.await.expect("task"), duplicate.await.expect("task"));
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "the live process was still storing its completion; the duplicate must get a 409, not \
         run again.\nfirst: {}\nduplicate: {}",
        first.1,
        duplicate.1
    );
}

/// A handler that blocks its worker thread (synchronous I/O in an async handler, 5 leases
/// long) on a two-worker runtime. The engine lets the heartbeat start before the handler (it
/// would otherwise sit in that worker's LIFO slot, which other workers do not steal), so the
/// lease is renewed from the other worker and the duplicate is answered in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c09_a_handler_that_blocks_its_worker_keeps_its_lease() {
    let effects = Arc::new(AtomicUsize::new(0));
    let e = Arc::clone(&effects);
    let idem = with_lease(MemoryStore::new(), Duration::from_millis(300));
    let app = Router::new()
        .route(
            "/v1/charges",
            post(move || {
                let e = Arc::clone(&e);
                async move {
                    e.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(1500));
                    (StatusCode::CREATED, "done")
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(idem, fixed_account));
    let addr = serve(app).await;
    let first = tokio::spawn(send(addr, "blk"));
    let mut saw = Vec::new();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        saw.push(send(addr, "blk").await.0);
    }
    let _ = first.await;
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "the first execution was alive the whole time; answers seen by the duplicate: {saw:?}"
    );
}

/// The same blocking handler, but the work is wrapped in `block_in_place` (what tokio asks
/// for): the heartbeat runs and nobody takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c09_block_in_place_keeps_the_lease() {
    let effects = Arc::new(AtomicUsize::new(0));
    let e = Arc::clone(&effects);
    let idem = with_lease(MemoryStore::new(), Duration::from_millis(300));
    let app = Router::new()
        .route(
            "/v1/charges",
            post(move || {
                let e = Arc::clone(&e);
                async move {
                    e.fetch_add(1, Ordering::SeqCst);
                    tokio::task::block_in_place(|| std::thread::sleep(Duration::from_millis(1500)));
                    (StatusCode::CREATED, "done")
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(idem, fixed_account));
    let addr = serve(app).await;
    let first = tokio::spawn(send(addr, "bip"));
    let mut saw = Vec::new();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        saw.push(send(addr, "bip").await.0);
    }
    let _ = first.await;
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(effects.load(Ordering::SeqCst), 1, "{saw:?}");
}
