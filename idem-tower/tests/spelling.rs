//! One record per request whatever its spelling, and another record for another meaning (C1,
//! C3): a method in any case is one request; the same bytes under another media type are
//! another; a form sent with its fields in another order is the same; every key form but an
//! sf-string and a bare token is a 400 that writes nothing.
#![cfg(feature = "axum")]

mod support;

use axum::http::StatusCode;
use axum::routing::any;
use axum::Router;
use idem_core::{Idempotency, MemoryStore};
use idem_tower::IdempotencyLayer;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use support::{build_request, header_account, send_in_time};

/// A charge endpoint on `any()` that counts its executions, behind the layer's defaults.
fn app(calls: &Arc<AtomicUsize>) -> Router {
    let calls = Arc::clone(calls);
    Router::new()
        .route(
            "/v1/charges",
            any(move |body: String| {
                let calls = Arc::clone(&calls);
                async move {
                    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    (StatusCode::CREATED, format!("charge {n}: {body}"))
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(
            Idempotency::new(MemoryStore::new()),
            header_account,
        ))
}

fn charge(
    method: &str,
    key: &str,
    content_type: &str,
    body: &str,
) -> axum::http::Request<axum::body::Body> {
    build_request(
        method,
        "/v1/charges",
        &[("x-account", "acct_1"), ("content-type", content_type)],
        Some(key),
        body,
    )
}

#[tokio::test]
async fn c03_post_in_any_case_is_one_request_and_runs_once() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(&calls);
    let mut bodies = Vec::new();
    for method in ["POST", "post", "Post"] {
        let reply = send_in_time(&app, charge(method, "k-1", "application/json", "{}")).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{method}: {reply:?}");
        bodies.push(reply.body);
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "one charge for one request"
    );
    assert!(bodies.iter().all(|b| b == &bodies[0]), "{bodies:?}");
}

#[tokio::test]
async fn c03_the_same_bytes_as_json_and_as_a_form_are_a_mismatch() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(&calls);
    // Bytes a lenient server reads either way, by Content-Type.
    let body = "amount=100&currency=usd";
    let first = send_in_time(&app, charge("POST", "k-2", "application/json", body)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let other = send_in_time(
        &app,
        charge("POST", "k-2", "application/x-www-form-urlencoded", body),
    )
    .await;
    assert_eq!(
        other.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "another media type is another request: {other:?}"
    );
    // The media type's spelling and parameters are not meaning.
    let same = send_in_time(
        &app,
        charge("POST", "k-2", "Application/JSON; charset=utf-8", body),
    )
    .await;
    assert_eq!(same.status, StatusCode::CREATED, "{same:?}");
    assert_eq!(same.body, first.body, "the replay");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c03_a_form_with_its_fields_reordered_is_replayed() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(&calls);
    let form = "application/x-www-form-urlencoded";
    let first = send_in_time(
        &app,
        charge(
            "POST",
            "k-3",
            form,
            "amount=100&currency=usd&note=caf%C3%A9+au+lait",
        ),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let reordered = send_in_time(
        &app,
        charge(
            "POST",
            "k-3",
            form,
            "note=caf%c3%a9%20au%20lait&currency=usd&amount=100",
        ),
    )
    .await;
    assert_eq!(reordered.status, StatusCode::CREATED, "{reordered:?}");
    assert_eq!(reordered.body, first.body, "the replay");
    let changed = send_in_time(&app, charge("POST", "k-3", form, "amount=999&currency=usd")).await;
    assert_eq!(changed.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c01_every_invalid_key_form_is_a_400_and_writes_nothing() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(&calls);
    for key in [
        "a,b",
        "a, b",
        "k;p=1",
        "\"k\";p=1",
        "k(x)",
        "k=v",
        "mid\"quote",
        "\"open",
        "k@x",
    ] {
        let reply = send_in_time(&app, charge("POST", key, "application/json", "{}")).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{key:?}: {reply:?}");
        assert!(
            reply.body.contains("key"),
            "the problem says what is wrong: {}",
            reply.body
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0, "nothing ran");
    // A bare UUID and the same key quoted are one key.
    let uuid = "8e03978e-40d5-43e8-bc93-6894a57f9324";
    let bare = send_in_time(&app, charge("POST", uuid, "application/json", "{}")).await;
    let quoted = send_in_time(
        &app,
        charge("POST", &format!("\"{uuid}\""), "application/json", "{}"),
    )
    .await;
    assert_eq!(bare.status, StatusCode::CREATED);
    assert_eq!(quoted.body, bare.body);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
