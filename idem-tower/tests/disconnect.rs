//! C8 over a real connection: hyper drops a request's future when its client disconnects; the
//! layer's execution must not be cancelled with it.
#![cfg(feature = "axum")]

mod support;

use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use idem_core::{Idempotency, MemoryStore};
use idem_tower::IdempotencyLayer;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::{connect_and_write, fixed_account, raw_post};
use tokio::io::AsyncReadExt;
use tokio::sync::Notify;

/// Sets its flag when dropped before `done` was called: the future was cancelled.
struct CancelProbe {
    cancelled: Arc<AtomicBool>,
    done: bool,
}

impl Drop for CancelProbe {
    fn drop(&mut self) {
        if !self.done {
            self.cancelled.store(true, Ordering::SeqCst);
        }
    }
}

struct Server {
    addr: SocketAddr,
    charged: Arc<AtomicUsize>,
    started: Arc<Notify>,
    protected_cancelled: Arc<AtomicBool>,
    unprotected_cancelled: Arc<AtomicBool>,
}

/// A slow charge endpoint behind the layer, and the same endpoint without it, on a real server.
async fn serve() -> Server {
    let charged = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(Notify::new());
    let protected_cancelled = Arc::new(AtomicBool::new(false));
    let unprotected_cancelled = Arc::new(AtomicBool::new(false));
    let handler = |charged: Arc<AtomicUsize>, started: Arc<Notify>, cancelled: Arc<AtomicBool>| {
        move || {
            let (charged, started, cancelled) =
                (charged.clone(), started.clone(), cancelled.clone());
            async move {
                let mut probe = CancelProbe {
                    cancelled,
                    done: false,
                };
                started.notify_one();
                tokio::time::sleep(Duration::from_millis(400)).await;
                let n = charged.fetch_add(1, Ordering::SeqCst) + 1;
                probe.done = true;
                (StatusCode::CREATED, format!("charge {n}"))
            }
        }
    };
    let idem = Idempotency::new(MemoryStore::new());
    let protected = Router::new()
        .route(
            "/v1/charges",
            post(handler(
                charged.clone(),
                started.clone(),
                protected_cancelled.clone(),
            )),
        )
        .route_layer(IdempotencyLayer::new(idem, fixed_account));
    let app = protected.route(
        "/unprotected",
        post(handler(
            Arc::new(AtomicUsize::new(0)),
            started.clone(),
            unprotected_cancelled.clone(),
        )),
    );
    let addr = support::serve(app).await;
    Server {
        addr,
        charged,
        started,
        protected_cancelled,
        unprotected_cancelled,
    }
}

fn post_request(path: &str, key: &str) -> String {
    raw_post(
        path,
        &[
            ("Host", "test"),
            ("Idempotency-Key", key),
            ("Content-Type", "application/json"),
        ],
        "{}",
    )
}

/// Sends the request, waits until the handler started, and hangs up.
async fn send_and_disconnect(server: &Server, path: &str, key: &str) {
    let stream = connect_and_write(server.addr, post_request(path, key).as_bytes()).await;
    server.started.notified().await;
    drop(stream);
}

/// Sends the request and reads the whole response.
async fn send(server: &Server, path: &str, key: &str) -> String {
    let mut stream = connect_and_write(server.addr, post_request(path, key).as_bytes()).await;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    response
}

async fn eventually(what: &str, condition: impl Fn() -> bool) {
    for _ in 0..100 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what}: not after 2 s");
}

#[tokio::test]
async fn c08_a_client_disconnect_does_not_cancel_the_execution_and_the_retry_gets_its_replay() {
    let server = serve().await;

    // Without the layer, hyper cancels the handler when the client hangs up: the hazard is real.
    send_and_disconnect(&server, "/unprotected", "k-0").await;
    eventually("the unprotected handler is cancelled", || {
        server.unprotected_cancelled.load(Ordering::SeqCst)
    })
    .await;

    // Behind the layer the charge finishes on its own task and its response is stored.
    send_and_disconnect(&server, "/v1/charges", "k-1").await;
    eventually("the charge completes", || {
        server.charged.load(Ordering::SeqCst) == 1
    })
    .await;
    assert!(!server.protected_cancelled.load(Ordering::SeqCst));

    // The completion is stored just after the effect: a retry in between gets a 409 and
    // retries, as a client would.
    let mut retry = send(&server, "/v1/charges", "k-1").await;
    for _ in 0..50 {
        if !retry.starts_with("HTTP/1.1 409") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        retry = send(&server, "/v1/charges", "k-1").await;
    }
    assert!(retry.starts_with("HTTP/1.1 201"), "{retry}");
    assert!(
        retry
            .to_ascii_lowercase()
            .contains("idempotent-replayed: true"),
        "{retry}"
    );
    assert!(retry.ends_with("charge 1"), "{retry}");
    assert_eq!(server.charged.load(Ordering::SeqCst), 1, "charged once");
}
