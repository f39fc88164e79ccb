//! One effect per (consumer, route, key) through a real axum server, under
//! concurrency, slow handlers past the lease, client disconnects at every moment, panics and
//! failing bodies.
#![cfg(feature = "axum")]

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idem_core::store::{Capabilities, Completion, Lease, Record};
use idem_core::{
    async_trait, Begin, Error, Idempotency, MemoryStore, Policy, RecordId, Request as IdemRequest,
    Store, Timestamp,
};
use idem_tower::{ConsumerError, IdempotencyLayer};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

fn account(req: &http::request::Parts) -> Result<String, ConsumerError> {
    req.headers
        .get("x-account")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(ConsumerError::unauthenticated)
}

/// A store that delays `complete` (the window between the handler's return and the stored
/// completion) and counts completions.
#[derive(Debug, Clone)]
struct SlowComplete<S> {
    inner: S,
    delay: Duration,
    completes: Arc<AtomicUsize>,
}

#[async_trait]
impl<S: Store> Store for SlowComplete<S> {
    async fn reserve(&self, request: &IdemRequest, lease_for: Duration) -> Result<Begin, Error> {
        self.inner.reserve(request, lease_for).await
    }
    async fn complete(&self, completion: &Completion) -> Result<(), Error> {
        tokio::time::sleep(self.delay).await;
        self.completes.fetch_add(1, Ordering::SeqCst);
        self.inner.complete(completion).await
    }
    async fn release(&self, lease: &Lease) -> Result<(), Error> {
        self.inner.release(lease).await
    }
    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<Timestamp, Error> {
        self.inner.renew(lease, lease_for).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, Error> {
        self.inner.purge_expired(limit).await
    }
    async fn lookup(&self, id: &RecordId) -> Result<Option<Record>, Error> {
        self.inner.lookup(id).await
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn raw(path: &str, key: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nX-Account: acct_1\r\nIdempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Sends a request, reads the whole response; returns (status, raw response).
async fn send(addr: SocketAddr, path: &str, key: &str, body: &str) -> (u16, String) {
    let fut = async {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(raw(path, key, body).as_bytes())
            .await
            .expect("write");
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        let text = String::from_utf8_lossy(&out).into_owned();
        let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
        (status, text)
    };
    timeout(Duration::from_secs(20), fut)
        .await
        .expect("in time")
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
        .route_layer(IdempotencyLayer::new(idem, account))
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
    let idem = Idempotency::with_policy(
        MemoryStore::new(),
        Policy::default().lease(Duration::from_millis(300)),
    )
    .expect("policy");
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
    let idem = Idempotency::with_policy(store, Policy::default().lease(Duration::from_millis(300)))
        .expect("policy");
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
    let idem = Idempotency::with_policy(
        MemoryStore::new(),
        Policy::default().lease(Duration::from_millis(300)),
    )
    .expect("policy");
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
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(
        b"POST /v1/charges HTTP/1.1\r\nHost: t\r\nX-Account: acct_1\r\nIdempotency-Key: mid\r\nContent-Length: 100\r\n\r\n{\"amou",
    )
    .await
    .expect("write");
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
        let store = SlowComplete {
            inner: MemoryStore::new(),
            delay: Duration::from_millis(150),
            completes: Arc::new(AtomicUsize::new(0)),
        };
        // The completion (150 ms) fits well within the lease: this is about disconnects only.
        let idem = Idempotency::with_policy(store, Policy::default().lease(Duration::from_secs(2)))
            .expect("policy");
        let addr = serve(counting_app(
            idem,
            Arc::clone(&effects),
            Duration::from_millis(100),
        ))
        .await;
        let key = format!("d-{i}");
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(raw("/v1/charges", &key, r#"{"amount":1}"#).as_bytes())
            .await
            .expect("write");
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
            account,
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
                        .body(Body::new(FailHalfWay { sent: false }))
                        .expect("response")
                        .into_response()
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(
            Idempotency::new(MemoryStore::new()),
            account,
        ));
    let addr = serve(app).await;
    for _ in 0..3 {
        let r = settle(addr, "/v1/charges", "s", "{}").await;
        assert_eq!(r.0, 500, "{}", r.1);
        assert!(!r.1.contains("partial"), "{}", r.1);
    }
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

/// A body that yields one chunk, then fails.
struct FailHalfWay {
    sent: bool,
}

impl http_body::Body for FailHalfWay {
    type Data = bytes::Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if self.sent {
            std::task::Poll::Ready(Some(Err(std::io::Error::other("upstream broke"))))
        } else {
            self.sent = true;
            std::task::Poll::Ready(Some(Ok(http_body::Frame::data(bytes::Bytes::from_static(
                b"{\"partial\":",
            )))))
        }
    }
}
