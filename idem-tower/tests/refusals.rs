//! A request refused before it executed never burns its key (C8), as Stripe saves a result only
//! once the endpoint began executing: an axum extractor's rejection (malformed JSON, a missing
//! field) and a handler's own validation 400 are answered, not stored, and the corrected retry
//! with the same key executes; a 402 decline and a 409 business conflict are stored and
//! replayed; a handler marks a 422 that followed its effect `Happened` to have it stored.
#![cfg(feature = "axum")]

mod support;

use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use idem_core::{Idempotency, MemoryStore};
use idem_tower::{Happened, IdempotencyLayer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use support::{build_request, fixed_account, send_in_time, Reply};

#[derive(serde::Deserialize)]
struct Charge {
    amount: i64,
}

/// `/typed` takes `Json<Charge>`; `/value` takes `Json<Value>` and answers by the `outcome`
/// field the way a payment handler would; every execution is counted.
fn app(executed: &Arc<AtomicUsize>) -> Router {
    let (typed, value) = (Arc::clone(executed), Arc::clone(executed));
    Router::new()
        .route(
            "/typed",
            post(move |Json(charge): Json<Charge>| {
                let executed = Arc::clone(&typed);
                async move {
                    let n = executed.fetch_add(1, Ordering::SeqCst) + 1;
                    (
                        StatusCode::CREATED,
                        format!("charge {n} of {}", charge.amount),
                    )
                }
            }),
        )
        .route(
            "/value",
            post(move |Json(body): Json<serde_json::Value>| {
                let executed = Arc::clone(&value);
                async move {
                    let outcome = body["outcome"].as_str().unwrap_or("ok").to_owned();
                    if outcome == "invalid" {
                        // The handler's own validation, before anything happened.
                        return (
                            StatusCode::BAD_REQUEST,
                            "amount must be positive".to_owned(),
                        )
                            .into_response_parts();
                    }
                    let n = executed.fetch_add(1, Ordering::SeqCst) + 1;
                    match outcome.as_str() {
                        "declined" => (StatusCode::PAYMENT_REQUIRED, format!("declined {n}"))
                            .into_response_parts(),
                        "conflict" => (StatusCode::CONFLICT, format!("order already shipped {n}"))
                            .into_response_parts(),
                        "charged_but_invalid" => (
                            StatusCode::UNPROCESSABLE_ENTITY,
                            Happened,
                            format!("charged {n}, receipt address invalid"),
                        )
                            .into_response(),
                        _ => (StatusCode::CREATED, format!("charge {n}")).into_response_parts(),
                    }
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(
            Idempotency::new(MemoryStore::new()),
            fixed_account,
        ))
}

/// The tuple as a response, so that the arms above share one type.
trait IntoResponseParts {
    fn into_response_parts(self) -> axum::response::Response;
}

impl IntoResponseParts for (StatusCode, String) {
    fn into_response_parts(self) -> axum::response::Response {
        axum::response::IntoResponse::into_response(self)
    }
}

use axum::response::IntoResponse;

fn charge(path: &str, key: &str, body: &str) -> axum::http::Request<axum::body::Body> {
    build_request(
        "POST",
        path,
        &[("content-type", "application/json")],
        Some(key),
        body,
    )
}

async fn twice(
    app: &Router,
    path: &str,
    key: &str,
    first: &str,
    corrected: &str,
) -> (Reply, Reply) {
    let refused = send_in_time(app, charge(path, key, first)).await;
    let retried = send_in_time(app, charge(path, key, corrected)).await;
    (refused, retried)
}

#[tokio::test]
async fn c08_malformed_json_is_a_400_that_the_corrected_retry_gets_past() {
    let executed = Arc::new(AtomicUsize::new(0));
    let app = app(&executed);
    let (refused, retried) = twice(
        &app,
        "/value",
        "k-json",
        r#"{"amount": 5"#,
        r#"{"amount": 5}"#,
    )
    .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{refused:?}");
    assert_eq!(
        retried.status,
        StatusCode::CREATED,
        "the corrected retry: {retried:?}"
    );
    assert_eq!(executed.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c08_a_missing_field_is_a_422_that_the_corrected_retry_gets_past() {
    let executed = Arc::new(AtomicUsize::new(0));
    let app = app(&executed);
    let (refused, retried) = twice(
        &app,
        "/typed",
        "k-field",
        r#"{"amout": 5}"#,
        r#"{"amount": 5}"#,
    )
    .await;
    assert_eq!(
        refused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{refused:?}"
    );
    assert_eq!(
        retried.status,
        StatusCode::CREATED,
        "the corrected retry: {retried:?}"
    );
    assert_eq!(retried.body, "charge 1 of 5");
    // And the executed request is what the key now replays.
    let replay = send_in_time(&app, charge("/typed", "k-field", r#"{"amount": 5}"#)).await;
    assert_eq!(replay.body, "charge 1 of 5");
    assert_eq!(
        replay
            .headers
            .get("idempotent-replayed")
            .map(|v| v.as_bytes()),
        Some(&b"true"[..])
    );
    assert_eq!(executed.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c08_the_handlers_own_validation_400_releases_the_key() {
    let executed = Arc::new(AtomicUsize::new(0));
    let app = app(&executed);
    let (refused, retried) = twice(
        &app,
        "/value",
        "k-own",
        r#"{"amount": -5, "outcome": "invalid"}"#,
        r#"{"amount": 5}"#,
    )
    .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert!(refused.headers.get("idempotent-replayed").is_none());
    assert_eq!(retried.status, StatusCode::CREATED, "{retried:?}");
    assert_eq!(executed.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c08_a_decline_a_business_conflict_and_a_marked_422_are_stored_and_replayed() {
    let executed = Arc::new(AtomicUsize::new(0));
    let app = app(&executed);
    for (key, outcome, status) in [
        ("k-402", "declined", StatusCode::PAYMENT_REQUIRED),
        ("k-409", "conflict", StatusCode::CONFLICT),
        (
            "k-422",
            "charged_but_invalid",
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ] {
        let body = format!(r#"{{"amount": 5, "outcome": "{outcome}"}}"#);
        let first = send_in_time(&app, charge("/value", key, &body)).await;
        let again = send_in_time(&app, charge("/value", key, &body)).await;
        assert_eq!(first.status, status, "{outcome}: {first:?}");
        assert_eq!(again.status, status, "{outcome}: {again:?}");
        assert_eq!(again.body, first.body, "{outcome}: the replay");
        assert_eq!(
            again
                .headers
                .get("idempotent-replayed")
                .map(|v| v.as_bytes()),
            Some(&b"true"[..]),
            "{outcome}"
        );
    }
    assert_eq!(executed.load(Ordering::SeqCst), 3, "each ran once");
}
