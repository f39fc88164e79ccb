//! The transactional form through the layer (C6): the handler writes its effect and the
//! reservation's completion in one SQLite transaction; the layer sends what was stored and
//! never completes a second time.
#![cfg(feature = "axum")]

use axum::body::{to_bytes, Body};
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idem_core::store::{Capabilities, Completion, Lease, Record};
use idem_core::{
    async_trait, Begin, Error, Idempotency, RecordId, Request as IdemRequest, Store,
    StoredResponse, Timestamp,
};
use idem_sqlite::rusqlite::params;
use idem_sqlite::SqliteStore;
use idem_tower::{Completed, ConsumerError, IdempotencyLayer, NothingHappened, Reservation};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

/// A SQLite store that counts the completions the engine writes itself.
#[derive(Debug, Clone)]
struct Counted {
    sqlite: SqliteStore,
    completes: Arc<AtomicUsize>,
}

#[async_trait]
impl Store for Counted {
    async fn reserve(&self, request: &IdemRequest, lease_for: Duration) -> Result<Begin, Error> {
        self.sqlite.reserve(request, lease_for).await
    }
    async fn complete(&self, completion: &Completion) -> Result<(), Error> {
        self.completes.fetch_add(1, Ordering::SeqCst);
        self.sqlite.complete(completion).await
    }
    async fn release(&self, lease: &Lease) -> Result<(), Error> {
        self.sqlite.release(lease).await
    }
    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<Timestamp, Error> {
        self.sqlite.renew(lease, lease_for).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, Error> {
        self.sqlite.purge_expired(limit).await
    }
    async fn lookup(&self, id: &RecordId) -> Result<Option<Record>, Error> {
        self.sqlite.lookup(id).await
    }
    fn capabilities(&self) -> Capabilities {
        self.sqlite.capabilities()
    }
}

/// What the charge handler does with its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Insert, complete, commit.
    Commit,
    /// Insert, complete, roll back, and still claim it completed (a bug).
    ClaimWithoutCommit,
    /// The insert fails: roll back and say nothing happened.
    FailBeforeCommit,
}

async fn charge(reservation: Reservation<Counted>, mode: Mode) -> Response {
    let store = reservation.idem().store().sqlite.clone();
    let written = store.clone();
    let completion = reservation.completion(
        StoredResponse::new(201, r#"{"id":"ch_1"}"#)
            .with_header("content-type", "application/json"),
    );
    let in_tx = completion.clone();
    let result = store
        .call(
            move |db| -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
                let tx = db.transaction()?;
                let table = if mode == Mode::FailBeforeCommit {
                    "missing_table"
                } else {
                    "charges"
                };
                tx.execute(
                    &format!("INSERT INTO {table} (cents) VALUES (?1)"),
                    params![2500],
                )?;
                written.complete_in(&tx, &in_tx)?;
                if mode == Mode::Commit {
                    tx.commit()?;
                }
                Ok(())
            },
        )
        .await;
    match (result, mode) {
        (Ok(Ok(())), _) => Completed(completion).into_response(),
        _ => (
            StatusCode::INTERNAL_SERVER_ERROR,
            NothingHappened,
            "rolled back",
        )
            .into_response(),
    }
}

struct Fixture {
    app: Router,
    sqlite: SqliteStore,
    completes: Arc<AtomicUsize>,
    _dir: tempfile::TempDir,
}

async fn fixture(mode: Mode) -> Fixture {
    let dir = tempfile::tempdir().expect("a temp dir");
    let sqlite = SqliteStore::open(dir.path().join("shop.db"))
        .await
        .expect("open");
    sqlite
        .try_call(|db| {
            db.execute_batch("CREATE TABLE charges (id INTEGER PRIMARY KEY, cents INTEGER)")
        })
        .await
        .expect("schema");
    let completes = Arc::new(AtomicUsize::new(0));
    let idem = Idempotency::new(Counted {
        sqlite: sqlite.clone(),
        completes: Arc::clone(&completes),
    });
    let app = Router::new()
        .route(
            "/v1/charges",
            post(move |r: Reservation<Counted>| charge(r, mode)),
        )
        .route_layer(IdempotencyLayer::new(idem, |_: &http::request::Parts| {
            Ok::<_, ConsumerError>("acct_1".to_owned())
        }))
        .route(
            "/unprotected",
            post(move |r: Reservation<Counted>| charge(r, mode)),
        );
    Fixture {
        app,
        sqlite,
        completes,
        _dir: dir,
    }
}

async fn post_charge(app: &Router, path: &str) -> (StatusCode, Option<String>, String) {
    let request = Request::post(path)
        .header("idempotency-key", "k-1")
        .body(Body::from("{}"))
        .expect("a request");
    let response = app.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body");
    (
        status,
        replayed,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

async fn rows(sqlite: &SqliteStore) -> i64 {
    sqlite
        .try_call(|db| db.query_row("SELECT count(*) FROM charges", [], |r| r.get(0)))
        .await
        .expect("count")
}

#[tokio::test]
async fn c06_a_completion_written_in_the_handlers_transaction_is_sent_as_stored_and_never_written_twice(
) {
    let f = fixture(Mode::Commit).await;
    let (status, replayed, body) = post_charge(&f.app, "/v1/charges").await;
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::CREATED, None, r#"{"id":"ch_1"}"#)
    );
    let (status, replayed, again) = post_charge(&f.app, "/v1/charges").await;
    assert_eq!(
        (status, replayed.as_deref(), again.as_str()),
        (StatusCode::CREATED, Some("true"), body.as_str())
    );
    assert_eq!(rows(&f.sqlite).await, 1);
    assert_eq!(
        f.completes.load(Ordering::SeqCst),
        0,
        "no second completion by the engine"
    );
}

#[tokio::test]
async fn c06_a_claimed_completion_that_did_not_commit_is_never_answered_as_a_success() {
    let f = fixture(Mode::ClaimWithoutCommit).await;
    let (status, _, body) = post_charge(&f.app, "/v1/charges").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    let (status, replayed, again) = post_charge(&f.app, "/v1/charges").await;
    assert_eq!(
        (status, replayed.as_deref(), again),
        (StatusCode::INTERNAL_SERVER_ERROR, Some("true"), body)
    );
    assert_eq!(rows(&f.sqlite).await, 0);
}

#[tokio::test]
async fn c08_a_rolled_back_transaction_releases_the_key() {
    let f = fixture(Mode::FailBeforeCommit).await;
    let (status, replayed, body) = post_charge(&f.app, "/v1/charges").await;
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::INTERNAL_SERVER_ERROR, None, "rolled back")
    );
    let (status, replayed, _) = post_charge(&f.app, "/v1/charges").await;
    assert_eq!(
        (status, replayed),
        (StatusCode::INTERNAL_SERVER_ERROR, None),
        "ran again: the key was released"
    );
    assert_eq!(f.completes.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_reservation_outside_the_layer_is_refused_before_the_handler_runs() {
    let f = fixture(Mode::Commit).await;
    let (status, _, body) = post_charge(&f.app, "/unprotected").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.contains("idempotency-layer-missing"), "{body}");
    assert_eq!(rows(&f.sqlite).await, 0);
}
