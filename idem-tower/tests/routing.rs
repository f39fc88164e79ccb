//! Scope and fingerprint under axum's routing (C2, C3), and what the router answers itself.
#![cfg(feature = "axum")]

mod support;

use axum::body::Body;
use axum::extract::Path;
use axum::http::{Request, StatusCode};
use axum::routing::{get, post};
use axum::Router;
use idem_core::{Idempotency, MemoryStore};
use idem_tower::IdempotencyLayer;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use support::{build_request, fixed_account, send_in_time, Reply};

fn req(method: &str, uri: &str, key: Option<&str>, body: &str) -> Request<Body> {
    build_request(
        method,
        uri,
        &[("content-type", "application/json")],
        key,
        body,
    )
}

/// A sub-router with the layer, nested under a path with a parameter (a very common way to
/// organise an axum app: `Router::new().nest("/customers/{customer}", customer_routes())`).
/// The same key and body sent for customer A and then for customer B are two different
/// requests (C3: the concrete path is part of the fingerprint, "two resources under one
/// template with the same key and body are a mismatch, never each other's replay").
#[tokio::test]
async fn c03_nested_router_two_resources_never_replay_each_other() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let inner: Router = Router::new()
        .route(
            "/refunds",
            post(move |Path(customer): Path<String>| {
                let c = Arc::clone(&c);
                async move {
                    c.fetch_add(1, Ordering::SeqCst);
                    (StatusCode::CREATED, format!("refunded {customer}"))
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(
            Idempotency::new(MemoryStore::new()),
            fixed_account,
        ));
    let app = Router::new().nest("/customers/{customer}", inner);

    let a = send_in_time(
        &app,
        req(
            "POST",
            "/customers/cus_A/refunds",
            Some("k-1"),
            r#"{"amount":5}"#,
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    assert_eq!(a.body, "refunded cus_A");

    let b = send_in_time(
        &app,
        req(
            "POST",
            "/customers/cus_B/refunds",
            Some("k-1"),
            r#"{"amount":5}"#,
        ),
    )
    .await;
    assert_ne!(
        b.body, "refunded cus_A",
        "customer B's request was answered with customer A's stored response: {b:?}"
    );
    assert_eq!(
        b.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "another concrete path with the same key is a mismatch (C3): {b:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Same, with query strings: under a nested router the query is kept by StripPrefix, so this
/// one holds; it is here to show the difference is the path prefix only.
#[tokio::test]
async fn c03_nested_router_query_is_still_fingerprinted() {
    let inner: Router = Router::new()
        .route("/refunds", post(|| async { (StatusCode::CREATED, "ok") }))
        .route_layer(IdempotencyLayer::new(
            Idempotency::new(MemoryStore::new()),
            fixed_account,
        ));
    let app = Router::new().nest("/customers/{customer}", inner);
    let a = send_in_time(
        &app,
        req("POST", "/customers/cus_A/refunds?x=1", Some("k"), "{}"),
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED);
    let b = send_in_time(
        &app,
        req("POST", "/customers/cus_A/refunds?x=2", Some("k"), "{}"),
    )
    .await;
    assert_eq!(b.status, StatusCode::UNPROCESSABLE_ENTITY);
}

/// A POST to a path that only has GET: the layer checks the key first (400 without one), and
/// with a key the router's 405 passes through unrecorded (docs/http.md).
#[tokio::test]
async fn c01_a_post_to_a_get_only_route_needs_a_key_then_gets_the_405() {
    let app: Router = Router::new()
        .route(
            "/v1/charges",
            post(|| async { (StatusCode::CREATED, "ok") }),
        )
        .route("/v1/listing", get(|| async { "listing" }))
        .route_layer(IdempotencyLayer::new(
            Idempotency::new(MemoryStore::new()),
            fixed_account,
        ));
    let Reply { status, .. } = send_in_time(&app, req("POST", "/v1/listing", None, "{}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let Reply { status, .. } =
        send_in_time(&app, req("POST", "/v1/listing", Some("k"), "{}")).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
}

/// With a key, the router's 405 for a method the route does not have is sent and not recorded:
/// no handler ran.
#[tokio::test]
async fn c08_a_405_from_the_router_is_not_recorded() {
    let app: Router = Router::new()
        .route("/v1/listing", get(|| async { "listing" }))
        .route_layer(IdempotencyLayer::new(
            Idempotency::new(MemoryStore::new()),
            fixed_account,
        ));
    let _ = send_in_time(&app, req("POST", "/v1/listing", Some("k-405"), "{}")).await;
    let Reply {
        status, headers, ..
    } = send_in_time(&app, req("POST", "/v1/listing", Some("k-405"), "{}")).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(
        headers.get("idempotent-replayed").is_none(),
        "a 405 from the router (no route matched) was stored and replayed"
    );
}

/// axum's own extractor rejections happen before the handler body runs and cannot be marked
/// `NothingHappened`. A 415 (wrong Content-Type) is a refusal of the default policy, released,
/// so the client that fixes only its Content-Type and retries with the same key runs.
#[tokio::test]
async fn c08_a_415_extractor_rejection_is_released_and_the_corrected_retry_runs() {
    let app: Router = Router::new()
        .route(
            "/v1/charges",
            post(|axum::Json(v): axum::Json<serde_json::Value>| async move {
                (StatusCode::CREATED, v.to_string())
            }),
        )
        .route_layer(IdempotencyLayer::new(
            Idempotency::new(MemoryStore::new()),
            fixed_account,
        ));
    let mut wrong_type = req("POST", "/v1/charges", Some("k-ct"), r#"{"amount":5}"#);
    wrong_type
        .headers_mut()
        .insert("content-type", http::HeaderValue::from_static("text/plain"));
    let Reply { status: s, .. } = send_in_time(&app, wrong_type).await;
    assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let Reply {
        status: s,
        headers: h,
        body,
        ..
    } = send_in_time(
        &app,
        req("POST", "/v1/charges", Some("k-ct"), r#"{"amount":5}"#),
    )
    .await;
    assert_eq!(
        s,
        StatusCode::CREATED,
        "the corrected request never ran; got {s} replayed={:?}: {body}",
        h.get("idempotent-replayed")
    );
}
