//! docs/http.md's first example, as it is written there, against the extractor trap (C8): its
//! `Json<Value>` extractor rejects a malformed body (400), a body that is not JSON (415) and
//! a request without `Content-Type` (415) before the handler runs; each rejection is a refusal
//! (`Policy::refusals`), so it is answered, nothing is stored and the key is released: the
//! corrected retry with the same key executes.
#![cfg(feature = "axum")]

mod support;

use axum::http::StatusCode;
use axum::{routing::post, Json, Router};
use idem_core::{Idempotency, MemoryStore};
use idem_tower::{ConsumerError, IdempotencyLayer};
use support::{build_request, send_in_time};

async fn create_charge(Json(charge): Json<serde_json::Value>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "id": "ch_1", "amount": charge["amount"] }))
}

fn app() -> Router {
    let idem = Idempotency::new(MemoryStore::new());
    Router::new()
        .route("/v1/charges", post(create_charge))
        .route_layer(IdempotencyLayer::new(idem, |req: &http::request::Parts| {
            req.headers
                .get("x-account")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
                .ok_or_else(ConsumerError::unauthenticated)
        }))
}

/// A key, the headers and body of a request the extractor rejects, and the rejection's status.
type Refusal = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static str,
    StatusCode,
);

const JSON: (&str, &str) = ("content-type", "application/json");
const ACCOUNT: (&str, &str) = ("x-account", "acct_42");
const FORM: (&str, &str) = ("content-type", "application/x-www-form-urlencoded");

#[tokio::test]
async fn c08_the_first_example_releases_the_key_when_its_extractor_rejects_the_body() {
    let app = app();
    let refusals: [Refusal; 3] = [
        (
            "k-malformed",
            &[ACCOUNT, JSON],
            r#"{"amount": 5"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            "k-form",
            &[ACCOUNT, FORM],
            "amount=5",
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            "k-no-type",
            &[ACCOUNT],
            r#"{"amount": 5}"#,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
    ];
    for (key, headers, body, status) in refusals {
        let refused = send_in_time(
            &app,
            build_request("POST", "/v1/charges", headers, Some(key), body),
        )
        .await;
        assert_eq!(refused.status, status, "{key}: {refused:?}");
        assert!(refused.headers.get("idempotent-replayed").is_none());
        let corrected = build_request(
            "POST",
            "/v1/charges",
            &[ACCOUNT, JSON],
            Some(key),
            r#"{"amount": 5}"#,
        );
        let retried = send_in_time(&app, corrected).await;
        assert_eq!(
            (retried.status, retried.body.as_str()),
            (StatusCode::OK, r#"{"amount":5,"id":"ch_1"}"#),
            "{key}: the corrected retry with the same key executes"
        );
        assert!(
            retried.headers.get("idempotent-replayed").is_none(),
            "{key}"
        );
    }
}
