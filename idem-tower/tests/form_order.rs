//! C3 on form bodies: an `application/x-www-form-urlencoded` body is an ordered list of
//! name-value pairs (WHATWG URL Standard, §5), and form parsers that group fields by position
//! (Rack's and PHP's `items[][name]=..&items[][note]=..`, a handler reading the pairs in order)
//! give the interleaving of *different* names a meaning. A form that repeats a name keeps its
//! order in the canonical form, so two bodies that differ only in how different names
//! interleave are two requests: the second under the first's key is a 422, never the first's
//! stored response.
#![cfg(feature = "axum")]

mod support;

use axum::http::StatusCode;
use axum::{routing::post, Form, Router};
use idem_core::{Idempotency, MemoryStore};
use idem_tower::{ConsumerError, IdempotencyLayer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use support::{build_request, header, send_in_time};

const ACCOUNT: (&str, &str) = ("x-account", "acct_42");
const FORM: (&str, &str) = ("content-type", "application/x-www-form-urlencoded");

/// An order endpoint that reads its form as the list it is: each `note` goes to the item sent
/// just before it (as `items[][name]` / `items[][note]` do in Rack and PHP).
fn app(calls: Arc<AtomicUsize>) -> Router {
    let idem = Idempotency::new(MemoryStore::new());
    Router::new()
        .route(
            "/v1/orders",
            post(move |Form(pairs): Form<Vec<(String, String)>>| {
                let calls = Arc::clone(&calls);
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    let mut items: Vec<(String, Option<String>)> = Vec::new();
                    for (name, value) in pairs {
                        match name.as_str() {
                            "item" => items.push((value, None)),
                            "note" => {
                                if let Some(last) = items.last_mut() {
                                    last.1 = Some(value);
                                }
                            }
                            _ => {}
                        }
                    }
                    let lines: Vec<String> = items
                        .iter()
                        .map(|(item, note)| format!("{item}:{}", note.as_deref().unwrap_or("-")))
                        .collect();
                    (StatusCode::CREATED, lines.join(","))
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(idem, |req: &http::request::Parts| {
            req.headers
                .get("x-account")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
                .ok_or_else(ConsumerError::unauthenticated)
        }))
}

#[tokio::test]
async fn c03_form_fields_of_different_names_reordered_are_another_request() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(Arc::clone(&calls));
    let key = "order-1";
    // The gift note on the tea...
    let first = send_in_time(
        &app,
        build_request(
            "POST",
            "/v1/orders",
            &[ACCOUNT, FORM],
            Some(key),
            "item=tea&note=gift&item=cake",
        ),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(first.body, "tea:gift,cake:-");
    // ...then, under the same key, the gift note on the cake: another request (C3: 422).
    let second = send_in_time(
        &app,
        build_request(
            "POST",
            "/v1/orders",
            &[ACCOUNT, FORM],
            Some(key),
            "item=tea&item=cake&note=gift",
        ),
    )
    .await;
    assert_eq!(
        second.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "another body under the key must be a 422, not the first body's answer: got {} {:?} \
         (idempotent-replayed: {:?})",
        second.status,
        second.body,
        header(&second, "idempotent-replayed"),
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
