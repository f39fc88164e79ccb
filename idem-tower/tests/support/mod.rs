//! What the integration tests share: the consumer functions, requests sent through a service
//! in process and their replies, a real server and raw HTTP/1.1 over TCP, a SQLite shop, one
//! store decorator and one scripted body.
//!
//! Each test file has `mod support;` and uses the part it needs.
#![allow(dead_code)]

use axum::body::Body;
use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use idem_core::store::Deadline;
use idem_core::store::{
    async_trait, Acquire, Capabilities, Claim, Completion, Execution, Lease, Record, Reserved,
    Transactional, TxEnd,
};
use idem_core::{Error, Idempotency, Policy, RecordId, Store, StoreErrorKind, Timestamp};
use idem_ops::{Inspected, ListQuery, ListingOrder, Operator, Page, Stats};
use idem_sqlite::SqliteStore;
use idem_tower::{ConsumerError, Handled};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower::{Service, ServiceExt};

// Consumers.

/// The consumer is the `x-account` header; a request without one is unauthenticated.
pub(crate) fn header_account(req: &http::request::Parts) -> Result<String, ConsumerError> {
    req.headers
        .get("x-account")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(ConsumerError::unauthenticated)
}

/// Every request belongs to one consumer, `acct_1`.
pub(crate) fn fixed_account(_: &http::request::Parts) -> Result<String, ConsumerError> {
    Ok("acct_1".to_owned())
}

/// An engine on `store` with the default policy but for its lease.
pub(crate) fn with_lease<S: Store>(store: S, lease: Duration) -> Idempotency<S> {
    Idempotency::with_policy(store, Policy::default().lease(lease)).expect("policy")
}

// Requests through a service, in process.

/// A request with the `headers` given, in order, then `Idempotency-Key: key` when there is one.
pub(crate) fn build_request<M>(
    method: M,
    uri: &str,
    headers: &[(&str, &str)],
    key: Option<&str>,
    body: &str,
) -> Request<Body>
where
    Method: TryFrom<M>,
    <Method as TryFrom<M>>::Error: Into<http::Error>,
{
    let mut builder = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder
        .body(Body::from(body.to_owned()))
        .expect("a request")
}

/// A whole answer: status, headers, the body as text, and what the layer did.
#[derive(Debug)]
pub(crate) struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
    pub handled: Option<Handled>,
}

/// Sends `request` through (a clone of) `service` and reads the whole answer, however long
/// it takes.
pub(crate) async fn send<S, B, RB>(service: &S, request: Request<B>) -> Reply
where
    S: Service<Request<B>, Response = Response<RB>, Error = Infallible> + Clone,
    RB: http_body::Body,
    RB::Error: std::fmt::Debug,
{
    read(service.clone().oneshot(request).await.expect("infallible")).await
}

/// [`send`], failing the test if the answer has not come within 10 s.
pub(crate) async fn send_in_time<S, B, RB>(service: &S, request: Request<B>) -> Reply
where
    S: Service<Request<B>, Response = Response<RB>, Error = Infallible> + Clone,
    RB: http_body::Body,
    RB::Error: std::fmt::Debug,
{
    send_within(Duration::from_secs(10), service, request).await
}

/// [`send`], failing the test if the answer has not come within `limit`.
pub(crate) async fn send_within<S, B, RB>(
    limit: Duration,
    service: &S,
    request: Request<B>,
) -> Reply
where
    S: Service<Request<B>, Response = Response<RB>, Error = Infallible> + Clone,
    RB: http_body::Body,
    RB::Error: std::fmt::Debug,
{
    let response = tokio::time::timeout(limit, service.clone().oneshot(request))
        .await
        .expect("in time")
        .expect("infallible");
    read(response).await
}

async fn read<RB>(response: Response<RB>) -> Reply
where
    RB: http_body::Body,
    RB::Error: std::fmt::Debug,
{
    let status = response.status();
    let headers = response.headers().clone();
    let handled = response.extensions().get::<Handled>().cloned();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
        handled,
    }
}

/// The header `name` of `reply`, if it is text.
pub(crate) fn header<'a>(reply: &'a Reply, name: &str) -> Option<&'a str> {
    reply.headers.get(name).and_then(|v| v.to_str().ok())
}

/// The `type` of the problem (RFC 9457) `reply` carries.
pub(crate) fn problem_type(reply: &Reply) -> String {
    let value: serde_json::Value = serde_json::from_str(&reply.body).expect("a problem body");
    value["type"].as_str().unwrap_or_default().to_owned()
}

// A real server, and raw HTTP/1.1 over TCP.

/// Serves `app` on a free local port, on a task of its own.
pub(crate) async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// A POST as raw HTTP/1.1: the `headers` given, in order, then `Content-Length` and
/// `Connection: close`, then `body`.
pub(crate) fn raw_post(path: &str, headers: &[(&str, &str)], body: &str) -> String {
    let mut request = format!("POST {path} HTTP/1.1\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    request
}

/// Connects to `addr` and writes `request`; the connection stays open for the caller.
pub(crate) async fn connect_and_write(addr: SocketAddr, request: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    stream
}

/// Sends a raw `request` and reads the whole response (20 s at most): its status (0 when
/// there is none, e.g. the connection was dropped) and its text.
pub(crate) async fn exchange(addr: SocketAddr, request: &str) -> (u16, String) {
    let fut = async {
        let mut s = connect_and_write(addr, request.as_bytes()).await;
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        let text = String::from_utf8_lossy(&out).into_owned();
        (status_of(&text), text)
    };
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .expect("in time")
}

/// Reads from `s` until the status line is in, and returns its status (0 when there is none).
pub(crate) async fn read_status(s: &mut TcpStream) -> u16 {
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    while got.len() < 12 {
        let n = s.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    status_of(&String::from_utf8_lossy(&got))
}

/// The status of a raw HTTP/1.1 response, 0 when it has no status line.
pub(crate) fn status_of(response: &str) -> u16 {
    response
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

// A SQLite shop: the store's records and the application's `charges` in one database.

/// A SQLite store in `dir/shop.db`, with a `charges` table beside its records.
pub(crate) async fn shop_db(dir: &Path) -> SqliteStore {
    let sqlite = SqliteStore::open(dir.join("shop.db")).await.expect("open");
    sqlite
        .try_call(|db| {
            db.execute_batch("CREATE TABLE charges (id INTEGER PRIMARY KEY, cents INTEGER)")
        })
        .await
        .expect("schema");
    sqlite
}

/// How many rows `charges` has.
pub(crate) async fn charge_rows(sqlite: &SqliteStore) -> i64 {
    sqlite
        .try_call(|db| db.query_row("SELECT count(*) FROM charges", [], |r| r.get(0)))
        .await
        .expect("count")
}

// A store decorator.

/// A store that delegates to `inner`, with the twist a test asks for: `complete` slow, the
/// completions counted (always), or the store down altogether.
#[derive(Debug, Clone)]
pub(crate) struct Decorated<S> {
    inner: S,
    complete_delay: Option<Duration>,
    completes: Arc<AtomicUsize>,
    down: bool,
}

/// The store underneath's transactions, for `Reservation::transaction`.
#[async_trait]
impl<S: Transactional> Transactional for Decorated<S> {
    type Effect<E: Send + 'static> = S::Effect<E>;

    fn renews_during_transaction(&self) -> bool {
        self.inner.renews_during_transaction()
    }

    async fn transact<E: Send + 'static>(
        &self,
        request: &idem_core::Request,
        effect: Self::Effect<E>,
        execution: Execution,
    ) -> Result<TxEnd<E, Self::Effect<E>>, Error> {
        self.inner.transact(request, effect, execution).await
    }

    async fn complete_in_transaction<E: Send + 'static>(
        &self,
        lease: &Lease,
        effect: Self::Effect<E>,
        execution: Execution,
    ) -> Result<TxEnd<E>, Error> {
        self.inner
            .complete_in_transaction(lease, effect, execution)
            .await
    }

    async fn settled(&self, id: &RecordId, wait: Duration) -> Result<Option<Record>, Error> {
        self.inner.settled(id, wait).await
    }
}

impl<S> Decorated<S> {
    /// `inner` as it is (its completions counted).
    pub(crate) fn new(inner: S) -> Self {
        Self {
            inner,
            complete_delay: None,
            completes: Arc::new(AtomicUsize::new(0)),
            down: false,
        }
    }

    /// `complete` first waits `delay`: a large response over a slow link, a loaded database,
    /// a SQLite write waiting for the lock; every other operation, `renew` included, is fast.
    pub(crate) fn slow_complete(mut self, delay: Duration) -> Self {
        self.complete_delay = Some(delay);
        self
    }

    /// Counts the completions the engine writes through this store into `completes`.
    pub(crate) fn count_completes(mut self, completes: Arc<AtomicUsize>) -> Self {
        self.completes = completes;
        self
    }

    /// Every operation fails: the store is unavailable.
    pub(crate) fn down(mut self) -> Self {
        self.down = true;
        self
    }

    /// The store decorated.
    pub(crate) fn inner(&self) -> &S {
        &self.inner
    }

    fn up(&self) -> Result<(), Error> {
        if self.down {
            Err(Error::store(
                "test",
                StoreErrorKind::Unavailable,
                "connection refused",
            ))
        } else {
            Ok(())
        }
    }
}

#[async_trait]
impl<S: Store> Store for Decorated<S> {
    async fn reserve(&self, claim: &Claim<'_>, deadline: Deadline) -> Result<Reserved, Error> {
        self.up()?;
        self.inner.reserve(claim, deadline).await
    }
    async fn replace(
        &self,
        claim: &Claim<'_>,
        acquire: Acquire,
        deadline: Deadline,
    ) -> Result<Reserved, Error> {
        self.up()?;
        self.inner.replace(claim, acquire, deadline).await
    }
    async fn complete(&self, completion: &Completion, deadline: Deadline) -> Result<(), Error> {
        self.up()?;
        if let Some(delay) = self.complete_delay {
            tokio::time::sleep(delay).await;
        }
        self.completes.fetch_add(1, Ordering::SeqCst);
        self.inner.complete(completion, deadline).await
    }
    async fn release(&self, lease: &Lease, deadline: Deadline) -> Result<(), Error> {
        self.up()?;
        self.inner.release(lease, deadline).await
    }
    async fn renew(
        &self,
        lease: &Lease,
        lease_for: Duration,
        deadline: Deadline,
    ) -> Result<Timestamp, Error> {
        self.up()?;
        self.inner.renew(lease, lease_for, deadline).await
    }
    async fn purge_expired(&self, limit: usize, deadline: Deadline) -> Result<usize, Error> {
        self.up()?;
        self.inner.purge_expired(limit, deadline).await
    }
    async fn lookup(&self, id: &RecordId, deadline: Deadline) -> Result<Option<Record>, Error> {
        self.up()?;
        self.inner.lookup(id, deadline).await
    }
    async fn resolve(
        &self,
        resolution: &idem_core::store::Resolution,
        deadline: Deadline,
    ) -> Result<bool, Error> {
        self.up()?;
        self.inner.resolve(resolution, deadline).await
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

#[async_trait]
impl<S: Operator> Operator for Decorated<S> {
    async fn list(&self, query: &ListQuery, deadline: Deadline) -> Result<Page, Error> {
        self.up()?;
        self.inner.list(query, deadline).await
    }
    async fn stats(&self, deadline: Deadline) -> Result<Stats, Error> {
        self.up()?;
        self.inner.stats(deadline).await
    }
    async fn reconciliations(
        &self,
        id: &RecordId,
        deadline: Deadline,
    ) -> Result<Vec<idem_core::store::Reconciliation>, Error> {
        self.up()?;
        self.inner.reconciliations(id, deadline).await
    }
    async fn inspect(&self, id: &RecordId, deadline: Deadline) -> Result<Option<Inspected>, Error> {
        self.up()?;
        self.inner.inspect(id, deadline).await
    }
    fn listing_order(&self) -> ListingOrder {
        self.inner.listing_order()
    }
}

// A scripted body.

/// A body that arrives in `frames`, one a poll, without a length. An `Err` frame fails the
/// body, at that poll and every later one.
pub(crate) struct Frames {
    frames: Vec<Result<&'static str, &'static str>>,
    next: usize,
}

impl Frames {
    pub(crate) fn new(
        frames: impl IntoIterator<Item = Result<&'static str, &'static str>>,
    ) -> Self {
        Self {
            frames: frames.into_iter().collect(),
            next: 0,
        }
    }
}

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let frame = match self.frames.get(self.next).copied() {
            None => None,
            Some(Ok(chunk)) => {
                self.next += 1;
                Some(Ok(http_body::Frame::data(Bytes::from_static(
                    chunk.as_bytes(),
                ))))
            }
            Some(Err(error)) => Some(Err(std::io::Error::other(error))),
        };
        std::task::Poll::Ready(frame)
    }
}
