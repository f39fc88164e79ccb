//! Memory through a real server (C12): lying Content-Length, endless chunked bodies, huge
//! responses.
#![cfg(feature = "axum")]

mod support;

use axum::body::Body;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use idem_core::{Idempotency, MemoryStore};
use idem_tower::IdempotencyLayer;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{connect_and_write, fixed_account, read_status, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

fn counting(calls: Arc<AtomicUsize>) -> Router {
    Router::new()
        .route(
            "/v1/charges",
            post(move |_body: axum::body::Bytes| {
                let calls = Arc::clone(&calls);
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    "ok"
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(
            Idempotency::new(MemoryStore::new()),
            fixed_account,
        ))
}

/// A Content-Length of 10 GB and no body: a 413 at once, nothing read, nothing run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c12_a_huge_declared_length_is_refused_before_reading() {
    let calls = Arc::new(AtomicUsize::new(0));
    let addr = serve(counting(Arc::clone(&calls))).await;
    let mut s = connect_and_write(addr, b"POST /v1/charges HTTP/1.1\r\nHost: t\r\nIdempotency-Key: big\r\nContent-Length: 10000000000\r\n\r\n").await;
    let started = Instant::now();
    let status = timeout(Duration::from_secs(3), read_status(&mut s))
        .await
        .expect("answered without the body");
    assert_eq!(status, 413);
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// An endless chunked body: a 413 once it crosses 1 MiB, while the client is still sending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c12_an_endless_chunked_body_is_cut_at_the_limit() {
    let calls = Arc::new(AtomicUsize::new(0));
    let addr = serve(counting(Arc::clone(&calls))).await;
    let s = connect_and_write(addr, b"POST /v1/charges HTTP/1.1\r\nHost: t\r\nIdempotency-Key: chunky\r\nTransfer-Encoding: chunked\r\n\r\n").await;
    let (mut rd, mut wr) = s.into_split();
    let writer = tokio::spawn(async move {
        let chunk = format!("{:x}\r\n{}\r\n", 64 * 1024, "x".repeat(64 * 1024));
        let mut sent = 0usize;
        while wr.write_all(chunk.as_bytes()).await.is_ok() {
            sent += 64 * 1024;
            if sent > 64 * 1024 * 1024 {
                break;
            }
        }
        sent
    });
    let mut buf = vec![0u8; 256];
    let n = timeout(Duration::from_secs(10), rd.read(&mut buf))
        .await
        .expect("answered")
        .expect("read");
    let head = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    drop(rd);
    let sent = timeout(Duration::from_secs(10), writer)
        .await
        .expect("writer ends")
        .expect("task");
    assert!(
        sent < 64 * 1024 * 1024,
        "the server kept reading: {sent} bytes"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// A 5 MiB response (over the 4 MiB default): a stored 500, the effect not rerun.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c08_a_huge_response_is_a_stored_500() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let app = Router::new()
        .route(
            "/v1/charges",
            post(move || {
                let c = Arc::clone(&c);
                async move {
                    c.fetch_add(1, Ordering::SeqCst);
                    (StatusCode::CREATED, Body::from(vec![b'x'; 5 * 1024 * 1024]))
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(
            Idempotency::new(MemoryStore::new()),
            fixed_account,
        ));
    let addr = serve(app).await;
    for _ in 0..2 {
        let mut s = connect_and_write(addr, b"POST /v1/charges HTTP/1.1\r\nHost: t\r\nIdempotency-Key: huge\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
        let status = timeout(Duration::from_secs(5), read_status(&mut s))
            .await
            .expect("answer");
        assert_eq!(status, 500);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
