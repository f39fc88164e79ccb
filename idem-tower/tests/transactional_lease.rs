//! The transactional form on SQLite with a transaction longer than the lease:
//! the heartbeat cannot renew (it queues behind the writer the handler holds), the lease
//! passes, duplicates decide to take over.
#![cfg(feature = "axum")]

mod support;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idem_core::StoredResponse;
use idem_sqlite::rusqlite::params;
use idem_sqlite::SqliteStore;
use idem_tower::{Completed, IdempotencyLayer, NothingHappened, Reservation};
use std::time::Duration;
use support::{build_request, charge_rows, fixed_account, send_within, shop_db, with_lease};

async fn charge(reservation: Reservation<SqliteStore>) -> Response {
    let store = reservation.idem().store().clone();
    let written = store.clone();
    let completion = reservation.completion(StoredResponse::new(201, "charged"));
    let in_tx = completion.clone();
    let result = store
        .call(
            move |db| -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
                let tx = db.transaction()?;
                tx.execute("INSERT INTO charges (cents) VALUES (?1)", params![100])?;
                std::thread::sleep(Duration::from_millis(1000)); // 3+ leases
                written.complete_in(&tx, &in_tx)?;
                tx.commit()?;
                Ok(())
            },
        )
        .await;
    match result {
        Ok(Ok(())) => Completed(completion).into_response(),
        _ => (
            StatusCode::INTERNAL_SERVER_ERROR,
            NothingHappened,
            "rolled back",
        )
            .into_response(),
    }
}

async fn post_charge(app: &Router) -> (StatusCode, String) {
    let request = build_request("POST", "/v1/charges", &[], Some("k-1"), "{}");
    let reply = send_within(Duration::from_secs(20), app, request).await;
    (reply.status, reply.body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c09_a_transaction_longer_than_the_lease_runs_once() {
    let dir = tempfile::tempdir().expect("dir");
    let sqlite = shop_db(dir.path()).await;
    let idem = with_lease(sqlite.clone(), Duration::from_millis(300));
    let app: Router = Router::new()
        .route("/v1/charges", post(charge))
        .route_layer(IdempotencyLayer::new(idem, fixed_account));
    let first = tokio::spawn({
        let app = app.clone();
        async move { post_charge(&app).await }
    });
    let mut dups = Vec::new();
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let app = app.clone();
        dups.push(tokio::spawn(async move { post_charge(&app).await }));
    }
    let first = first.await.expect("task");
    let mut seen = Vec::new();
    for d in dups {
        seen.push(d.await.expect("task"));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let rows = charge_rows(&sqlite).await;
    assert_eq!(rows, 1, "first: {first:?}; duplicates: {seen:?}");
    assert_eq!(first.0, StatusCode::CREATED, "{first:?}");
}
