//! What the outbox's tests share: a receiver that verifies, deduplicates through idem-inbox
//! and watches for overlapping deliveries, and fresh databases.
#![allow(dead_code, unreachable_pub)]

// idem-postgres's own: a PgBouncer of the test's own, in front of a database of its own.
#[path = "../../../idem-postgres/tests/support/private_bouncer.rs"]
pub mod bouncer;
#[path = "../../../idem-postgres/tests/support/pg_url.rs"]
mod pg_url;

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use idem_core::{Idempotency, MemoryStore};
use idem_inbox::{Ack, Delivery, Inbox, StandardWebhooks};
use tokio::net::TcpListener;
use tokio::sync::Notify;

pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
pub const OLD_SECRET: &str = "whsec_b2xkLXNlY3JldC1mb3Itcm90YXRpb24h";

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub id: String,
    pub at: Instant,
    pub verified: bool,
    pub signatures: usize,
    pub body: Vec<u8>,
    pub headers: Vec<(String, String)>,
}

/// What the receiver does with its next requests: the status to answer (after processing
/// through the inbox when it is 200) and how long to hold the answer.
#[derive(Debug, Default)]
pub struct Plan {
    pub statuses: VecDeque<u16>,
    pub holds: VecDeque<Duration>,
    pub hold_every: Duration,
    pub extra_headers: Vec<(&'static str, &'static str)>,
    /// The body of the answers that are not 200 (default `not now`).
    pub body: Option<&'static [u8]>,
}

pub struct ReceiverState {
    pub plan: Mutex<Plan>,
    pub log: Mutex<Vec<Received>>,
    pub in_flight: Mutex<HashSet<String>>,
    pub overlaps: AtomicUsize,
    pub effects: Mutex<HashMap<String, usize>>,
    pub arrived: Notify,
    scheme: StandardWebhooks,
    inbox: Inbox<MemoryStore>,
}

/// A webhook receiver on a loopback port.
#[derive(Clone)]
pub struct Receiver {
    pub state: Arc<ReceiverState>,
    pub addr: SocketAddr,
    server: Arc<tokio::task::JoinHandle<()>>,
}

impl Receiver {
    pub async fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        Self::serve(listener)
    }

    /// A receiver on `addr` (a port that was down).
    pub async fn start_on(addr: SocketAddr) -> Receiver {
        let listener = TcpListener::bind(addr).await.expect("the port again");
        Self::serve(listener)
    }

    fn serve(listener: TcpListener) -> Receiver {
        let addr = listener.local_addr().expect("an address");
        let state = Arc::new(ReceiverState {
            plan: Mutex::new(Plan::default()),
            log: Mutex::new(Vec::new()),
            in_flight: Mutex::new(HashSet::new()),
            overlaps: AtomicUsize::new(0),
            effects: Mutex::new(HashMap::new()),
            arrived: Notify::new(),
            scheme: StandardWebhooks::new([SECRET]).expect("a secret"),
            inbox: Inbox::new(Idempotency::new(MemoryStore::new())),
        });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&state));
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver {
            state,
            addr,
            server: Arc::new(server),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/hooks", self.addr)
    }

    pub fn stop(&self) {
        self.server.abort();
    }

    pub fn plan(&self, f: impl FnOnce(&mut Plan)) {
        f(&mut self.state.plan.lock().expect("plan"));
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.log.lock().expect("log").clone()
    }

    pub fn overlaps(&self) -> usize {
        self.state.overlaps.load(Ordering::SeqCst)
    }

    /// How many times the effect ran per id.
    pub fn effects(&self) -> HashMap<String, usize> {
        self.state.effects.lock().expect("effects").clone()
    }

    /// Waits until `n` requests arrived, at most `within`.
    pub async fn wait_for(&self, n: usize, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            let notified = self.state.arrived.notified();
            if self.received().len() >= n {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let _ = tokio::time::timeout(left.min(Duration::from_millis(50)), notified).await;
        }
    }

    /// Waits until `n` distinct ids had their effect, at most `within`.
    pub async fn wait_for_effects(&self, n: usize, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.effects().len() >= n {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.effects().len() >= n
    }
}

async fn handle(
    State(state): State<Arc<ReceiverState>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, HeaderMap, Vec<u8>) {
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let pairs: Vec<(String, Vec<u8>)> = headers
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect();
    let now = idem_signature::now_unix();
    let verified = Delivery::verify_with(&state.scheme, "outbox", &pairs, &body, now);
    let signatures = headers
        .get("webhook-signature")
        .and_then(|v| v.to_str().ok())
        .map_or(0, |v| v.split(' ').count());
    if !state
        .in_flight
        .lock()
        .expect("in flight")
        .insert(id.clone())
    {
        state.overlaps.fetch_add(1, Ordering::SeqCst);
    }
    state.log.lock().expect("log").push(Received {
        id: id.clone(),
        at: Instant::now(),
        verified: verified.is_ok(),
        signatures,
        body: body.to_vec(),
        headers: headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    v.to_str().unwrap_or_default().to_owned(),
                )
            })
            .collect(),
    });
    state.arrived.notify_waiters();
    let (status, hold, extra, body) = {
        let mut plan = state.plan.lock().expect("plan");
        let status = plan.statuses.pop_front().unwrap_or(200);
        let hold = plan.holds.pop_front().unwrap_or(plan.hold_every);
        (status, hold, plan.extra_headers.clone(), plan.body)
    };
    let mut response_headers = HeaderMap::new();
    for (name, value) in extra {
        response_headers.insert(name, axum::http::HeaderValue::from_static(value));
    }
    let mut answer = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut answer_body = body.unwrap_or(b"not now").to_vec();
    if status == 200 {
        let (code, body) = match verified {
            Ok((delivery, _)) => match state.inbox.event(&delivery, id.as_bytes()) {
                Ok(event) => {
                    let counter = Arc::clone(&state);
                    let key = id.clone();
                    match state
                        .inbox
                        .receive(&event, move |_ctx| async move {
                            *counter
                                .effects
                                .lock()
                                .expect("effects")
                                .entry(key)
                                .or_default() += 1;
                            Ok::<_, std::io::Error>(Ack::Done)
                        })
                        .await
                    {
                        Ok(receipt) => {
                            let http = receipt.to_http();
                            (http.status, http.body)
                        }
                        Err(_) => (500, Vec::new()),
                    }
                }
                Err(_) => (400, Vec::new()),
            },
            Err(_) => (400, Vec::new()),
        };
        answer = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        answer_body = body;
    }
    if !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
    state.in_flight.lock().expect("in flight").remove(&id);
    (answer, response_headers, answer_body)
}

/// A port nothing listens on (bound, then released).
pub async fn free_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    listener.local_addr().expect("an address")
}

/// The PostgreSQL server the tests run against: a missing one is a failure, never a skip.
pub fn pg_url() -> String {
    std::env::var("IDEM_PG_URL")
        .expect("IDEM_PG_URL: start the servers with scripts/services.sh (a missing server fails)")
}

/// A new database on the server, for one test: its URL.
pub async fn fresh_database() -> String {
    use idem_postgres::sqlx::{AssertSqlSafe, Connection, Executor, PgConnection};
    let base = pg_url();
    let name = format!(
        "outbox_{}",
        idem_outbox::MessageId::generate().as_str()[4..].replace('-', "")
    );
    let mut conn = PgConnection::connect(&base)
        .await
        .expect("the PostgreSQL server");
    conn.execute(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .await
        .expect("a database");
    let _ = conn.close().await;
    match base.rfind('/') {
        Some(slash) => format!("{}/{name}", &base[..slash]),
        None => panic!("IDEM_PG_URL has no database: {base}"),
    }
}

/// A migrated store and its outbox on the database `url`.
pub async fn pg_outbox(url: &str) -> (idem_postgres::PgStore, idem_outbox::PgOutbox) {
    let store = idem_postgres::PgStore::builder()
        .max_connections(8)
        .connect(url)
        .await
        .expect("a store");
    store.migrate().await.expect("migrated");
    let outbox = idem_outbox::PgOutbox::open(&store)
        .await
        .expect("an outbox");
    (store, outbox)
}

/// A short schedule: `n` retries `every` apart, no jitter.
pub fn quick(n: usize, every: Duration) -> idem_outbox::Schedule {
    idem_outbox::Schedule::new(std::iter::repeat_n(every, n))
        .and_then(|s| s.jitter(0.0))
        .expect("a schedule")
}

/// The endpoint `name` at `receiver`, with a quick schedule.
pub fn endpoint(name: &str, url: &str, schedule: idem_outbox::Schedule) -> idem_outbox::Endpoint {
    idem_outbox::Endpoint::new(name, url, [SECRET])
        .expect("an endpoint")
        .timeout(Duration::from_secs(2))
        .expect("a timeout")
        .schedule(schedule)
}

/// The median of `values`.
pub fn p50(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

/// Enqueues message `n` to `endpoint` in a transaction of its own, committed.
pub async fn enqueue(
    store: &idem_postgres::PgStore,
    outbox: &idem_outbox::PgOutbox,
    endpoint: &str,
    n: usize,
) -> idem_outbox::MessageId {
    let mut tx = store.pool().begin().await.expect("a transaction");
    let message =
        idem_outbox::Message::json(&serde_json::json!({"type": "charge.succeeded", "n": n}))
            .expect("json")
            .to(endpoint);
    let id = outbox.enqueue(&mut tx, &message).await.expect("enqueued");
    tx.commit().await.expect("committed");
    id
}

/// One `dispatch_due` of `dispatcher` while the outbox's endpoints are locked in the database
/// at `url` (a slow moment of the database): the lock is held until the claim waits on it,
/// then `hold` more; returns what the pass returned.
pub async fn dispatch_while_locked(
    url: &str,
    dispatcher: &idem_outbox::Dispatcher,
    hold: Duration,
) -> Result<usize, idem_outbox::OutboxError> {
    use idem_postgres::sqlx::{self, Connection};
    let mut locker = sqlx::PgConnection::connect(url)
        .await
        .expect("a connection");
    sqlx::query("BEGIN")
        .execute(&mut locker)
        .await
        .expect("begun");
    sqlx::query("LOCK TABLE idem_outbox_endpoints IN ACCESS EXCLUSIVE MODE")
        .execute(&mut locker)
        .await
        .expect("locked");
    let claiming = {
        let dispatcher = dispatcher.clone();
        tokio::spawn(async move { dispatcher.dispatch_due().await })
    };
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()",
        )
        .fetch_one(&mut locker)
        .await
        .expect("read");
        if waiting > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::time::sleep(hold).await;
    sqlx::query("COMMIT")
        .execute(&mut locker)
        .await
        .expect("unlocked");
    claiming.await.expect("the claim")
}

/// A SQLite store and outbox in `dir` with endpoint `name` (at `url`, three quick attempts)
/// and one message to it, enqueued in a committed transaction.
pub async fn sqlite_with_one_message(
    dir: &std::path::Path,
    name: &str,
    url: &str,
) -> (
    idem_sqlite::SqliteStore,
    idem_outbox::SqliteOutbox,
    idem_outbox::MessageId,
) {
    use idem_sqlite::rusqlite::TransactionBehavior;
    let store = idem_sqlite::SqliteStore::open(dir.join("shop.db"))
        .await
        .expect("a store");
    let outbox = idem_outbox::SqliteOutbox::open(&store)
        .await
        .expect("an outbox");
    outbox
        .register(&endpoint(name, url, quick(3, Duration::from_millis(50))))
        .await
        .expect("registered");
    let (sender, to) = (outbox.clone(), name.to_owned());
    let id = store
        .call(move |db| {
            let tx = db
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(idem_sqlite::store_error)?;
            let message = idem_outbox::Message::bytes("application/json", "{}").to(&to);
            let id = sender.enqueue(&tx, &message)?;
            tx.commit().map_err(idem_sqlite::store_error)?;
            Ok::<_, idem_outbox::OutboxError>(id)
        })
        .await
        .expect("the writer")
        .expect("enqueued");
    (store, outbox, id)
}

/// A database of its own on `IDEM_PG_URL` with a store, an outbox, a receiver, and endpoint
/// `name` at the receiver (`attempts` quick retries, 50 ms apart).
pub async fn pg_with_endpoint(
    name: &str,
    attempts: usize,
) -> (
    String,
    idem_postgres::PgStore,
    idem_outbox::PgOutbox,
    Receiver,
) {
    let url = fresh_database().await;
    let (store, outbox) = pg_outbox(&url).await;
    let receiver = Receiver::start().await;
    outbox
        .register(&endpoint(
            name,
            &receiver.url(),
            quick(attempts, Duration::from_millis(50)),
        ))
        .await
        .expect("registered");
    (url, store, outbox, receiver)
}
