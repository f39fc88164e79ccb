//! C3 on named headers (`fingerprint_header`): the field lines of one header name are a list
//! whose order is part of its meaning (RFC 9110 §5.3: "the order in which field lines with the
//! same name are received is significant"). The fingerprint keeps them in that order, so a
//! request whose named header lists its values in another order is another request: a 422
//! under the first one's key, never its stored response.
#![cfg(feature = "axum")]

mod support;

use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::{routing::post, Router};
use idem_core::{Idempotency, MemoryStore};
use idem_tower::{ConsumerError, IdempotencyLayer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use support::{header, send_in_time};

/// A shipping endpoint: the warehouses to ship from, in order of preference, one field line
/// each (`X-Warehouse`, named in the fingerprint: it changes what the request means).
fn app(calls: Arc<AtomicUsize>) -> Router {
    let idem = Idempotency::new(MemoryStore::new());
    Router::new()
        .route(
            "/v1/shipments",
            post(move |headers: HeaderMap| {
                let calls = Arc::clone(&calls);
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    let from = headers
                        .get_all("x-warehouse")
                        .iter()
                        .next()
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-")
                        .to_owned();
                    (StatusCode::CREATED, format!("shipped from {from}"))
                }
            }),
        )
        .route_layer(
            IdempotencyLayer::new(idem, |req: &http::request::Parts| {
                req.headers
                    .get("x-account")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
                    .ok_or_else(ConsumerError::unauthenticated)
            })
            .fingerprint_header(HeaderName::from_static("x-warehouse")),
        )
}

fn request(warehouses: &[&str]) -> http::Request<axum::body::Body> {
    let mut builder = http::Request::builder()
        .method("POST")
        .uri("/v1/shipments")
        .header("x-account", "acct_42")
        .header("idempotency-key", "ship-1");
    for w in warehouses {
        builder = builder.header("x-warehouse", *w);
    }
    builder
        .body(axum::body::Body::from("{}"))
        .expect("a request")
}

#[tokio::test]
async fn c03_a_named_header_with_its_lines_in_another_order_is_another_request() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(Arc::clone(&calls));
    let first = send_in_time(&app, request(&["berlin", "paris"])).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(first.body, "shipped from berlin");
    let second = send_in_time(&app, request(&["paris", "berlin"])).await;
    assert_eq!(
        second.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "paris first is another request under the key (C3: 422), not the berlin shipment's \
         answer: got {} {:?} (idempotent-replayed: {:?})",
        second.status,
        second.body,
        header(&second, "idempotent-replayed"),
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
