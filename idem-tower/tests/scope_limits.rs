//! The scope's limits at the edge (C2, C12): a path too long to be the key's route is the
//! client's 414, a consumer idem cannot scope a key to is a 401, never a 500 that tells the
//! client the server failed; nothing is recorded and nothing runs.

mod support;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use idem_core::{Idempotency, MemoryStore, Scope};
use idem_tower::{IdempotencyLayer, RequestBody};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use support::{fixed_account, header_account, problem_type, send, Reply};
use tower::Layer;

/// A plain tower service that counts its calls and answers 201.
fn counting(
    calls: &Arc<AtomicUsize>,
) -> impl tower::Service<
    Request<RequestBody>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    let calls = Arc::clone(calls);
    tower::service_fn(move |_request: Request<RequestBody>| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut response = Response::new(Full::new(Bytes::from_static(b"created")));
            *response.status_mut() = StatusCode::CREATED;
            Ok::<_, Infallible>(response)
        }
    })
}

fn post(path: &str, key: &str, account: Option<&str>) -> Request<Full<Bytes>> {
    let mut builder = Request::post(path).header("idempotency-key", key);
    if let Some(account) = account {
        builder = builder.header("x-account", account);
    }
    builder
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("a request")
}

/// A path of `len` bytes, `/` included.
fn path_of(len: usize) -> String {
    format!("/{}", "p".repeat(len - 1))
}

/// The longest path a `POST` may have: its route is `POST <path>`, at most
/// `Scope::MAX_ROUTE_LEN` bytes.
const LONGEST_POST_PATH: usize = Scope::MAX_ROUTE_LEN - "POST ".len();

fn assert_refused(reply: &Reply, status: StatusCode, kind: &str) {
    assert_eq!(reply.status, status, "{}", reply.body);
    assert_eq!(
        problem_type(reply),
        format!("https://idem.rs/problems/{kind}"),
        "{}",
        reply.body
    );
    assert_eq!(
        reply.headers.get("cache-control").map(|v| v.as_bytes()),
        Some(&b"no-store"[..])
    );
}

#[tokio::test]
async fn c12_a_path_too_long_for_the_route_is_a_414_and_runs_nothing() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), fixed_account);
    let service = layer.layer(counting(&calls));
    for len in [LONGEST_POST_PATH + 1, 1021, 8 * 1024] {
        let reply = send(&service, post(&path_of(len), "k-long", None)).await;
        assert_refused(&reply, StatusCode::URI_TOO_LONG, "path-too-long");
        assert!(
            reply.body.contains(&LONGEST_POST_PATH.to_string()),
            "the limit is in the answer: {}",
            reply.body
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // The longest path that fits runs, once, and is replayed.
    let path = path_of(LONGEST_POST_PATH);
    let first = send(&service, post(&path, "k-longest", None)).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    let again = send(&service, post(&path, "k-longest", None)).await;
    assert_eq!(
        again
            .headers
            .get("idempotent-replayed")
            .map(|v| v.as_bytes()),
        Some(&b"true"[..])
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c12_a_consumer_idem_cannot_scope_a_key_to_is_a_401_and_runs_nothing() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), header_account);
    let service = layer.layer(counting(&calls));
    let too_long = "a".repeat(Scope::MAX_CONSUMER_LEN + 1);
    for account in [too_long.as_str(), &"a".repeat(300), "acct\t1"] {
        let reply = send(&service, post("/v1/charges", "k-1", Some(account))).await;
        assert_refused(&reply, StatusCode::UNAUTHORIZED, "consumer-unknown");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let longest = "a".repeat(Scope::MAX_CONSUMER_LEN);
    let reply = send(&service, post("/v1/charges", "k-1", Some(&longest))).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Under axum the key's route is the matched template, which the server chose: a long
/// concrete path is only part of the fingerprint, so it runs.
#[cfg(feature = "axum")]
#[tokio::test]
async fn c12_under_a_route_template_a_long_path_is_only_fingerprinted() {
    use axum::routing::post as axum_post;
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let app = axum::Router::new()
        .route(
            "/v1/items/{id}",
            axum_post(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { (axum::http::StatusCode::CREATED, "created") }
            }),
        )
        .route_layer(IdempotencyLayer::new(
            Idempotency::new(MemoryStore::new()),
            fixed_account,
        ));
    let path = format!("/v1/items/{}", "i".repeat(2 * Scope::MAX_ROUTE_LEN));
    let request = support::build_request("POST", &path, &[], Some("k-1"), "{}");
    let reply = send(&app, request).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
