//! One stream of events on every path (C16): the closure (`run`), the transactional closure
//! (`run_in_transaction`), the guard (`begin`/`complete`) and the HTTP layer each emit the same
//! events for the same outcomes, and tracing and metrics both derive from them: one tracing
//! event and one count per executed, replayed, in-flight, mismatched and taken-over request,
//! with no extra store call.
#![cfg(feature = "axum")]

mod support;

use axum::body::Body;
use axum::http::{HeaderMap, Request as HttpRequest, StatusCode};
use axum::routing::post;
use axum::Router;
use idem_core::{
    Begin, Event, EventKind, Failure, Idempotency, Observer, Outcome, Policy, Request,
    StoredResponse,
};
use idem_metrics::Metrics;
use idem_sqlite::{SqliteIdempotency, SqliteStore};
use idem_tower::IdempotencyLayer;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use support::fixed_account;
use tokio::sync::Notify;
use tower::ServiceExt;

const LEASE: Duration = Duration::from_millis(300);
const PATHS: [&str; 4] = ["/run", "/transact", "/guard", "/layer"];
/// What every path must show, by event name.
const EXPECTED: [(&str, u64); 6] = [
    ("acquired", 2),
    ("taken_over", 1),
    ("executed", 3),
    ("replayed", 1),
    ("in_flight", 1),
    ("mismatch", 1),
];

/// Everything the tracing subscriber writes, as text.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The events the engine emitted, by (route, name).
#[derive(Default)]
struct Seen(Mutex<HashMap<(String, &'static str), u64>>);

impl Observer for Seen {
    fn observe(&self, event: &Event<'_>) {
        if let Some(id) = event.id() {
            *self
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry((id.route().to_owned(), event.kind().name()))
                .or_insert(0) += 1;
        }
    }
}

impl Seen {
    fn count(&self, route: &str, name: &'static str) -> u64 {
        let seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        seen.get(&(route.to_owned(), name)).copied().unwrap_or(0)
    }
}

fn request(idem: &Idempotency<SqliteStore>, route: &str, key: &str, body: &str) -> Request {
    idem.request("acct_1", "POST", route)
        .key(Some(key))
        .body(body.as_bytes())
        .build()
        .expect("a valid request")
}

fn charged() -> StoredResponse {
    StoredResponse::new(201, "charged")
}

/// The HTTP path: an axum route behind the layer; a request with `x-hold` waits for `hold`.
fn app(idem: Idempotency<SqliteStore>, hold: Arc<Notify>) -> Router {
    Router::new()
        .route(
            "/layer",
            post(move |headers: HeaderMap| {
                let hold = Arc::clone(&hold);
                async move {
                    if headers.contains_key("x-hold") {
                        hold.notified().await;
                    }
                    (StatusCode::CREATED, "charged")
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(idem, fixed_account))
}

async fn post_layer(app: &Router, key: &str, body: &str, hold: bool) -> StatusCode {
    let mut request = HttpRequest::post("/layer").header("idempotency-key", key);
    if hold {
        request = request.header("x-hold", "1");
    }
    let request = request
        .body(Body::from(body.to_owned()))
        .expect("a request");
    app.clone()
        .oneshot(request)
        .await
        .expect("infallible")
        .status()
}

/// One request on `path`: executed, replayed or refused as the engine decides.
async fn once(
    idem: &Idempotency<SqliteStore>,
    app: &Router,
    path: &str,
    key: &str,
    body: &str,
) -> String {
    if path == "/layer" {
        return post_layer(app, key, body, false).await.as_str().to_owned();
    }
    let request = request(idem, path, key, body);
    let outcome = match path {
        "/run" => idem
            .run(&request, |_| async {
                Ok::<_, Failure<std::io::Error>>(charged())
            })
            .await
            .map_err(|e| e.kind()),
        "/transact" => idem
            .run_in_transaction(&request, |_, _| {
                Ok::<_, idem_sqlite::rusqlite::Error>(charged())
            })
            .await
            .map_err(|e| e.kind()),
        _ => match idem.begin(&request).await.expect("begin") {
            Begin::Acquired(lease) => idem
                .complete(lease, charged())
                .await
                .map(Outcome::Executed)
                .map_err(|_| EventKind::OutcomeUnknown),
            Begin::Answered(answer) => Ok(Outcome::Answered(answer)),
        },
    };
    match outcome {
        Ok(outcome) => outcome.kind().name().to_owned(),
        Err(kind) => kind.name().to_owned(),
    }
}

/// A held execution on `path` and a duplicate of it while it runs: in flight. Then the held
/// one is let go and completes.
async fn held_and_duplicate(
    idem: &Idempotency<SqliteStore>,
    app: &Router,
    hold: &Arc<Notify>,
    path: &str,
) {
    let key = format!("{path}-held");
    let duplicate = |idem: &Idempotency<SqliteStore>, app: &Router| {
        let (idem, app, key) = (idem.clone(), app.clone(), key.clone());
        let path = path.to_owned();
        async move { once(&idem, &app, &path, &key, "{}").await }
    };
    match path {
        "/guard" => {
            let request = request(idem, path, &key, "{}");
            let Begin::Acquired(lease) = idem.begin(&request).await.expect("begin") else {
                panic!("a fresh key is acquired")
            };
            assert_eq!(duplicate(idem, app).await, "in_flight");
            idem.complete(lease, charged()).await.expect("complete");
        }
        "/layer" => {
            let held = {
                let (app, key) = (app.clone(), key.clone());
                tokio::spawn(async move { post_layer(&app, &key, "{}", true).await })
            };
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert_eq!(
                post_layer(app, &key, "{}", false).await,
                StatusCode::CONFLICT
            );
            hold.notify_one();
            assert_eq!(held.await.expect("joined"), StatusCode::CREATED);
        }
        _ => {
            let (sent, received) = std::sync::mpsc::channel::<()>();
            let request = request(idem, path, &key, "{}");
            let held = {
                let idem = idem.clone();
                let transactional = path == "/transact";
                tokio::spawn(async move {
                    if transactional {
                        idem.run_in_transaction(&request, move |_, _| {
                            let _ = received.recv_timeout(Duration::from_secs(5));
                            Ok::<_, idem_sqlite::rusqlite::Error>(charged())
                        })
                        .await
                        .is_ok()
                    } else {
                        idem.run(&request, move |_| async move {
                            let _ = tokio::task::spawn_blocking(move || {
                                received.recv_timeout(Duration::from_secs(5))
                            })
                            .await;
                            Ok::<_, Failure<std::io::Error>>(charged())
                        })
                        .await
                        .is_ok()
                    }
                })
            };
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert_eq!(duplicate(idem, app).await, "in_flight");
            let _ = sent.send(());
            assert!(held.await.expect("joined"));
        }
    }
}

#[test]
fn c16_every_path_emits_the_same_events_traced_and_metered() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish(),
    )
    .expect("the only subscriber of this test binary");
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).expect("the only recorder of this test binary");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let seen = Arc::new(Seen::default());
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("a directory");
        let store = support::shop_db(dir.path()).await;
        let policy = Policy::default().lease(LEASE);
        let idem = Idempotency::builder(store.clone())
            .policy(policy.clone())
            .observer(Metrics::new("sqlite"))
            .observer(Arc::clone(&seen))
            .build()
            .expect("a valid policy");
        // Another process over the same file: it leaves the orphans the paths take over.
        let crashed = Idempotency::builder(store)
            .policy(policy)
            .without_tracing()
            .build()
            .expect("a valid policy");
        let hold = Arc::new(Notify::new());
        let app = app(idem.clone(), Arc::clone(&hold));
        for path in PATHS {
            let fresh = format!("{path}-fresh");
            assert_eq!(once(&idem, &app, path, &fresh, "{}").await, executed(path));
            assert_eq!(once(&idem, &app, path, &fresh, "{}").await, replayed(path));
            assert_eq!(
                once(&idem, &app, path, &fresh, "{\"other\":1}").await,
                mismatch(path)
            );
            held_and_duplicate(&idem, &app, &hold, path).await;
            let orphan = format!("{path}-orphan");
            let left = crashed
                .begin(&request(&crashed, path, &orphan, "{}"))
                .await
                .expect("begin");
            assert!(matches!(left, Begin::Acquired(_)));
            tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
            assert_eq!(once(&idem, &app, path, &orphan, "{}").await, executed(path));
        }
    });
    let text = String::from_utf8_lossy(&captured.0.lock().unwrap_or_else(PoisonError::into_inner))
        .into_owned();
    let metered = requests_total(&snapshotter);
    for path in PATHS {
        // The record's route is the method and the route (its scope).
        let route = format!("POST {path}");
        for (name, count) in EXPECTED {
            assert_eq!(seen.count(&route, name), count, "{path}: {name} events");
            assert_eq!(
                traced(&text, &route, name),
                count,
                "{path}: tracing events idem.{name}"
            );
            assert_eq!(
                metered.get(&(route.clone(), name.to_owned())).copied(),
                Some(count),
                "{path}: idem_requests_total{{outcome=\"{name}\"}}"
            );
        }
        assert_eq!(seen.count(&route, "rejected"), 0, "{path}");
        assert_eq!(seen.count(&route, "lease_lost"), 0, "{path}");
    }
}

fn executed(path: &str) -> String {
    answer(path, "executed", "201")
}
fn replayed(path: &str) -> String {
    answer(path, "replayed", "201")
}
fn mismatch(path: &str) -> String {
    answer(path, "mismatch", "422")
}
fn answer(path: &str, name: &str, status: &str) -> String {
    if path == "/layer" { status } else { name }.to_owned()
}

/// How many tracing events named `idem.<name>` the engine logged for `route`.
fn traced(text: &str, route: &str, name: &str) -> u64 {
    let message = format!("idem.{name} ");
    let route = format!("route=\"{route}\"");
    text.lines()
        .filter_map(|line| line.rsplit_once(" idem: ").map(|(_, event)| event))
        .filter(|event| event.starts_with(&message) && event.contains(&route))
        .count() as u64
}

/// `idem_requests_total` by (route, outcome).
fn requests_total(
    snapshotter: &metrics_util::debugging::Snapshotter,
) -> HashMap<(String, String), u64> {
    let mut totals = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let (_, key) = key.into_parts();
        if key.name() != idem_metrics::REQUESTS_TOTAL {
            continue;
        }
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
                .unwrap_or_default()
        };
        if let DebugValue::Counter(count) = value {
            *totals
                .entry((label("route"), label("outcome")))
                .or_insert(0) += count;
        }
    }
    totals
}
