//! The transactional form through the layer (C6): the handler writes its effect and the
//! reservation's completion in one SQLite transaction; the layer sends what was stored and
//! never completes a second time.
#![cfg(feature = "axum")]

mod support;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idem_core::{Idempotency, StoredResponse};
use idem_sqlite::rusqlite::params;
use idem_sqlite::SqliteStore;
use idem_tower::{Completed, IdempotencyLayer, NothingHappened, Reservation};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use support::{build_request, charge_rows, fixed_account, header, send, shop_db, Decorated};

/// A SQLite store that counts the completions the engine writes itself.
type Counted = Decorated<SqliteStore>;

/// What the charge handler does with its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Insert, complete, commit.
    Commit,
    /// Insert, complete, commit, then answer a plain response instead of `Completed`.
    CommitThenAnswerPlainly,
    /// Insert, complete, roll back, and still claim it completed (a bug).
    ClaimWithoutCommit,
    /// The insert fails: roll back and say nothing happened.
    FailBeforeCommit,
}

async fn charge(reservation: Reservation<Counted>, mode: Mode) -> Response {
    let store = reservation.idem().store().inner().clone();
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
                if matches!(mode, Mode::Commit | Mode::CommitThenAnswerPlainly) {
                    tx.commit()?;
                }
                Ok(())
            },
        )
        .await;
    match (result, mode) {
        (Ok(Ok(())), Mode::CommitThenAnswerPlainly) => {
            (StatusCode::OK, "a plain answer").into_response()
        }
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
    let sqlite = shop_db(dir.path()).await;
    let completes = Arc::new(AtomicUsize::new(0));
    let idem =
        Idempotency::new(Counted::new(sqlite.clone()).count_completes(Arc::clone(&completes)));
    let app = Router::new()
        .route(
            "/v1/charges",
            post(move |r: Reservation<Counted>| charge(r, mode)),
        )
        // A handler asking for the reservation of another store type than the layer's.
        .route(
            "/v1/wrong-store",
            post(|_: Reservation<SqliteStore>| async { "never runs" }),
        )
        .route_layer(IdempotencyLayer::new(idem, fixed_account))
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
    let reply = send(app, build_request("POST", path, &[], Some("k-1"), "{}")).await;
    let replayed = header(&reply, "idempotent-replayed").map(str::to_owned);
    (reply.status, replayed, reply.body)
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
    assert_eq!(charge_rows(&f.sqlite).await, 1);
    assert_eq!(
        f.completes.load(Ordering::SeqCst),
        0,
        "no second completion by the engine"
    );
}

/// C7: a handler that committed the completion in its transaction but answered a plain
/// response: the live answer is what was stored (what every replay sends), never a 500 that
/// contradicts the replay.
#[tokio::test]
async fn c07_a_committed_completion_is_the_answer_even_when_the_handler_answers_plainly() {
    let f = fixture(Mode::CommitThenAnswerPlainly).await;
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
    assert_eq!(charge_rows(&f.sqlite).await, 1);
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
    assert_eq!(charge_rows(&f.sqlite).await, 0);
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
    assert_eq!(charge_rows(&f.sqlite).await, 0);
}

/// C8: a reservation refused under the layer (asked for another store type) means the handler
/// never ran, so the key is given back: the 500 is not stored and replayed for the retention.
#[tokio::test]
async fn a_reservation_of_another_store_type_is_refused_and_the_key_given_back() {
    let f = fixture(Mode::Commit).await;
    for attempt in 0..2 {
        let (status, replayed, body) = post_charge(&f.app, "/v1/wrong-store").await;
        assert_eq!(
            status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "attempt {attempt}"
        );
        assert!(body.contains("idempotency-layer-missing"), "{body}");
        assert_eq!(
            replayed, None,
            "attempt {attempt}: nothing ran, nothing is replayed"
        );
    }
    assert_eq!(f.completes.load(Ordering::SeqCst), 0);
}
