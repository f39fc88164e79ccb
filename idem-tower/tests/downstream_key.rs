//! `Reservation::downstream_key` (C2): what a handler sends its provider is the record's key,
//! the same on every attempt of the record and another for another consumer, never the raw
//! header a second account may send too.
#![cfg(feature = "axum")]

mod support;

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use idem_core::store::{Acquire, Lease};
use idem_core::{FencingToken, Idempotency, MemoryStore, Request, Timestamp};
use idem_tower::{IdempotencyLayer, NothingHappened, Reservation};
use std::sync::{Arc, Mutex};
use support::{build_request, header_account, send_in_time};

/// Records the key each attempt would send; the first attempt's provider call times out and
/// nothing happened, so the retry runs again.
fn app(seen: &Arc<Mutex<Vec<String>>>) -> Router {
    let seen = Arc::clone(seen);
    Router::new()
        .route(
            "/v1/charges",
            post(move |reservation: Reservation<MemoryStore>| {
                let seen = Arc::clone(&seen);
                async move {
                    let mut seen = seen.lock().expect("not poisoned");
                    seen.push(reservation.downstream_key());
                    if seen.len() == 1 {
                        (
                            StatusCode::BAD_GATEWAY,
                            NothingHappened,
                            "provider timed out",
                        )
                            .into_response()
                    } else {
                        (StatusCode::CREATED, "charged").into_response()
                    }
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(
            Idempotency::new(MemoryStore::new()),
            header_account,
        ))
}

fn charge(account: &str) -> axum::http::Request<axum::body::Body> {
    build_request(
        "POST",
        "/v1/charges",
        &[("x-account", account)],
        Some("k-1"),
        "{}",
    )
}

/// The key as `Lease::downstream_key` derives it for (consumer, `POST /v1/charges`, `k-1`).
fn expected(account: &str) -> String {
    let request = Request::builder(account, "POST", "/v1/charges")
        .key(Some("k-1"))
        .body(b"{}")
        .build()
        .expect("a request");
    Lease::new(
        &request,
        FencingToken::generate(),
        Timestamp::from_millis(0),
        Acquire::FRESH,
    )
    .downstream_key()
}

#[tokio::test]
async fn c02_the_downstream_key_is_the_records_on_every_attempt_and_scoped_by_consumer() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let app = app(&seen);
    let first = send_in_time(&app, charge("acct_1")).await;
    assert_eq!(first.status, StatusCode::BAD_GATEWAY);
    let retried = send_in_time(&app, charge("acct_1")).await;
    assert_eq!(retried.status, StatusCode::CREATED);
    let other = send_in_time(&app, charge("acct_2")).await;
    assert_eq!(other.status, StatusCode::CREATED);
    let seen = seen.lock().expect("not poisoned").clone();
    assert_eq!(
        seen,
        [expected("acct_1"), expected("acct_1"), expected("acct_2")]
    );
    assert_ne!(
        seen[0], seen[2],
        "another account, the same header: another key"
    );
    assert_ne!(seen[0], "k-1");
}
