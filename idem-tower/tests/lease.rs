//! C9 through the layer: only a dead process's record becomes an orphan. A live process keeps
//! its lease while its completion is stored and while its handler blocks a worker thread.
#![cfg(feature = "axum")]

use axum::http::StatusCode;
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

fn account(_: &http::request::Parts) -> Result<String, ConsumerError> {
    Ok("acct_1".to_owned())
}

/// A store whose `complete` is slow (a large response over a slow link, a loaded database, a
/// SQLite write waiting for the lock); every other operation, `renew` included, is fast.
#[derive(Debug)]
struct SlowComplete {
    inner: MemoryStore,
    delay: Duration,
}

#[async_trait]
impl Store for SlowComplete {
    async fn reserve(&self, request: &IdemRequest, lease_for: Duration) -> Result<Begin, Error> {
        self.inner.reserve(request, lease_for).await
    }
    async fn complete(&self, completion: &Completion) -> Result<(), Error> {
        tokio::time::sleep(self.delay).await;
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

async fn send(addr: SocketAddr, key: &str) -> (u16, String) {
    let fut = async {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let req = format!(
            "POST /v1/charges HTTP/1.1\r\nHost: t\r\nIdempotency-Key: {key}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
        );
        s.write_all(req.as_bytes()).await.expect("write");
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        let text = String::from_utf8_lossy(&out).into_owned();
        (
            text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0),
            text,
        )
    };
    timeout(Duration::from_secs(20), fut)
        .await
        .expect("in time")
}

/// The handler returns at once; storing its completion takes 1.5 leases. The heartbeat runs
/// until the completion is stored, so a duplicate meanwhile is in flight, never a takeover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c09_a_completion_slower_than_the_rest_of_the_lease_keeps_the_key() {
    let effects = Arc::new(AtomicUsize::new(0));
    let e = Arc::clone(&effects);
    let idem = Idempotency::with_policy(
        SlowComplete {
            inner: MemoryStore::new(),
            delay: Duration::from_millis(450),
        },
        Policy::default().lease(Duration::from_millis(300)),
    )
    .expect("policy");
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
        .route_layer(IdempotencyLayer::new(idem, account));
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
    let idem = Idempotency::with_policy(
        MemoryStore::new(),
        Policy::default().lease(Duration::from_millis(300)),
    )
    .expect("policy");
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
        .route_layer(IdempotencyLayer::new(idem, account));
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
    let idem = Idempotency::with_policy(
        MemoryStore::new(),
        Policy::default().lease(Duration::from_millis(300)),
    )
    .expect("policy");
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
        .route_layer(IdempotencyLayer::new(idem, account));
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
