//! Problems that are stored and replayed (C7, C8) keep `Cache-Control: no-store` (the HTTP
//! mapping: every problem carries it), on the first answer and on every replay.
#![cfg(feature = "axum")]

mod support;

use axum::body::Body;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idem_core::{Idempotency, MemoryStore};
use idem_tower::IdempotencyLayer;
use support::{build_request, header, header_account, problem_type, send, Frames};

/// Sends the same charge under `key` twice: the first answer and its replay.
async fn twice(app: &Router, key: &str) -> [support::Reply; 2] {
    let request = || {
        build_request(
            Method::POST,
            "/v1/charges",
            &[
                ("x-account", "acct_1"),
                ("content-type", "application/json"),
            ],
            Some(key),
            "{}",
        )
    };
    let first = send(app, request()).await;
    let replay = send(app, request()).await;
    assert_eq!(header(&replay, "idempotent-replayed"), Some("true"));
    [first, replay]
}

fn protected(app: Router) -> Router {
    app.route_layer(IdempotencyLayer::new(
        Idempotency::new(MemoryStore::new()),
        header_account,
    ))
}

/// A response body that fails half way is a stored 500 `outcome-unknown` (C8): a problem, sent
/// and replayed with `Cache-Control: no-store`.
#[tokio::test]
async fn c08_a_stored_outcome_unknown_problem_is_never_cacheable() {
    let app = protected(Router::new().route(
        "/v1/charges",
        post(|| async {
            Response::builder()
                .status(201)
                .body(Body::new(Frames::new([
                    Ok("{\"partial\":"),
                    Err("upstream broke"),
                ])))
                .expect("response")
                .into_response()
        }),
    ));
    for reply in twice(&app, "unknown-1").await {
        assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            problem_type(&reply),
            "https://idem.rs/problems/outcome-unknown"
        );
        assert_eq!(
            header(&reply, "cache-control"),
            Some("no-store"),
            "{reply:?}"
        );
    }
}

/// A response over `max_response_bytes` is a stored 500 `response-too-large` (C8): a problem,
/// sent and replayed with `Cache-Control: no-store`.
#[tokio::test]
async fn c08_a_stored_response_too_large_problem_is_never_cacheable() {
    let app = Router::new()
        .route("/v1/charges", post(|| async { "x".repeat(64) }))
        .route_layer(
            IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), header_account)
                .max_response_bytes(16),
        );
    for reply in twice(&app, "too-large-1").await {
        assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            problem_type(&reply),
            "https://idem.rs/problems/response-too-large"
        );
        assert_eq!(
            header(&reply, "cache-control"),
            Some("no-store"),
            "{reply:?}"
        );
    }
}

/// A problem the handler answered with `Cache-Control: no-store` (a 402 decline) is replayed
/// with it, as the first client got it (C7).
#[tokio::test]
async fn c07_a_handlers_no_store_problem_is_replayed_with_it() {
    let app = protected(Router::new().route(
        "/v1/charges",
        post(|| async {
            (
                StatusCode::PAYMENT_REQUIRED,
                [
                    ("content-type", "application/problem+json"),
                    ("cache-control", "no-store"),
                ],
                r#"{"type":"https://example.com/declined","status":402}"#,
            )
        }),
    ));
    for reply in twice(&app, "declined-1").await {
        assert_eq!(reply.status, StatusCode::PAYMENT_REQUIRED);
        assert_eq!(
            header(&reply, "cache-control"),
            Some("no-store"),
            "{reply:?}"
        );
    }
}
