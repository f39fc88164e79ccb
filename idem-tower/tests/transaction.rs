//! The transactional form in one call (C6, C8), here on SQLite: `Reservation::transaction`
//! runs the handler's effect and writes its completion in one `BEGIN IMMEDIATE` transaction on
//! the store's writer and commits; the layer sends what was stored and never completes twice;
//! an effect that fails rolls back with its completion and the key is released.
#![cfg(feature = "axum")]

mod support;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idem_core::{Idempotency, RunError, StoredResponse};
use idem_sqlite::rusqlite::params;
use idem_sqlite::SqliteStore;
use idem_tower::{IdempotencyLayer, NothingHappened, Reservation};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use support::{build_request, charge_rows, fixed_account, header, send, shop_db, Decorated};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A SQLite store that counts the completions the engine writes itself.
type Counted = Decorated<SqliteStore>;

/// The handler as a user writes it: the charge and its completion in one call, one `match`.
async fn charge(reservation: Reservation<Counted>, fail: bool) -> Response {
    let charged = reservation
        .transaction(Box::new(move |tx, _lease| {
            tx.execute("INSERT INTO charges (cents) VALUES (?1)", params![2500])?;
            if fail {
                return Err(BoxError::from("the card network said no after the insert"));
            }
            Ok(
                StoredResponse::new(201, format!(r#"{{"id":"ch_{}"}}"#, tx.last_insert_rowid()))
                    .with_header("content-type", "application/json")
                    .with_header("set-cookie", "session=never-stored"),
            )
        }))
        .await;
    match charged {
        Ok(completed) => completed.into_response(),
        Err(RunError::Released(_) | RunError::Idem(_)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            NothingHappened,
            "rolled back",
        )
            .into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "in doubt").into_response(),
    }
}

struct Fixture {
    app: Router,
    sqlite: SqliteStore,
    completes: Arc<AtomicUsize>,
    _dir: tempfile::TempDir,
}

async fn fixture(fail: bool) -> Fixture {
    let dir = tempfile::tempdir().expect("a temp dir");
    let sqlite = shop_db(dir.path()).await;
    let completes = Arc::new(AtomicUsize::new(0));
    let idem =
        Idempotency::new(Counted::new(sqlite.clone()).count_completes(Arc::clone(&completes)));
    let app = Router::new()
        .route(
            "/v1/charges",
            post(move |r: Reservation<Counted>| charge(r, fail)),
        )
        .route_layer(IdempotencyLayer::new(idem, fixed_account));
    Fixture {
        app,
        sqlite,
        completes,
        _dir: dir,
    }
}

#[tokio::test]
async fn c06_a_transaction_commits_the_effect_with_its_completion_in_one_call() {
    let f = fixture(false).await;
    let first = send(
        &f.app,
        build_request("POST", "/v1/charges", &[], Some("k-1"), "{}"),
    )
    .await;
    assert_eq!(
        (first.status, first.body.as_str()),
        (StatusCode::CREATED, r#"{"id":"ch_1"}"#)
    );
    assert_eq!(header(&first, "idempotent-replayed"), None);
    assert_eq!(header(&first, "set-cookie"), None, "sent as stored (C7)");
    let again = send(
        &f.app,
        build_request("POST", "/v1/charges", &[], Some("k-1"), "{}"),
    )
    .await;
    assert_eq!(
        (
            again.status,
            header(&again, "idempotent-replayed"),
            again.body.as_str()
        ),
        (StatusCode::CREATED, Some("true"), first.body.as_str())
    );
    assert_eq!(charge_rows(&f.sqlite).await, 1);
    assert_eq!(
        f.completes.load(Ordering::SeqCst),
        0,
        "no second completion by the engine"
    );
}

#[tokio::test]
async fn c08_a_failed_transaction_rolls_back_its_effect_and_releases_the_key() {
    let f = fixture(true).await;
    for attempt in 1..=2 {
        let reply = send(
            &f.app,
            build_request("POST", "/v1/charges", &[], Some("k-1"), "{}"),
        )
        .await;
        assert_eq!(
            (reply.status, reply.body.as_str()),
            (StatusCode::INTERNAL_SERVER_ERROR, "rolled back"),
            "attempt {attempt} ran: the key was released"
        );
    }
    assert_eq!(charge_rows(&f.sqlite).await, 0, "the insert rolled back");
    assert_eq!(f.completes.load(Ordering::SeqCst), 0);
}
