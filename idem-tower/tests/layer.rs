//! The layer's HTTP mapping (docs/http.md), one test per rule, through an axum router.
#![cfg(feature = "axum")]

mod support;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post, put};
use axum::Router;
use idem_core::{Idempotency, MemoryStore, Policy, Store, StoredResponse};
use idem_tower::render::Problem;
use idem_tower::{ConsumerError, IdempotencyLayer, NothingHappened, ServerErrors};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{build_request, header, header_account, problem_type, send, Decorated, Frames};
use tokio::sync::Notify;

const KEY: &str = "8e03978e-40d5-43e8-bc93-6894a57f9324";

type Layer<S> = IdempotencyLayer<S, fn(&http::request::Parts) -> Result<String, ConsumerError>>;

fn layer<S: Store + 'static>(idem: Idempotency<S>) -> Layer<S> {
    IdempotencyLayer::new(
        idem,
        header_account as fn(&http::request::Parts) -> Result<String, ConsumerError>,
    )
}

/// A charges endpoint that counts its executions and answers with what it was sent.
fn charges(calls: Arc<AtomicUsize>) -> Router {
    Router::new().route(
        "/v1/charges",
        post(move |body: String| {
            let calls = Arc::clone(&calls);
            async move {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                (
                    StatusCode::CREATED,
                    [
                        ("content-type", "application/json"),
                        ("set-cookie", "session=secret"),
                        ("x-request-id", "req_1"),
                    ],
                    format!(r#"{{"charge":{n},"body":{body:?}}}"#),
                )
            }
        })
        .get(|| async { "listing" }),
    )
}

fn request(method: Method, uri: &str, key: Option<&str>, body: &str) -> Request<Body> {
    build_request(
        method,
        uri,
        &[
            ("x-account", "acct_1"),
            ("content-type", "application/json"),
        ],
        key,
        body,
    )
}

#[tokio::test]
async fn c07_a_replay_is_the_stored_response_byte_for_byte_and_marked() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = charges(Arc::clone(&calls)).route_layer(layer(Idempotency::new(MemoryStore::new())));

    let first = send(
        &app,
        request(Method::POST, "/v1/charges", Some(KEY), r#"{"amount":100}"#),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(header(&first, "idempotency-key"), Some(KEY));
    assert_eq!(
        header(&first, "idempotent-replayed"),
        None,
        "the live answer is not a replay"
    );
    assert_eq!(header(&first, "content-type"), Some("application/json"));
    assert_eq!(
        header(&first, "set-cookie"),
        None,
        "never stored, never sent by the layer"
    );
    assert_eq!(
        first.handled.as_ref().map(|h| h.disposition),
        Some(idem_core::EventKind::Executed)
    );

    let replay = send(
        &app,
        request(Method::POST, "/v1/charges", Some(KEY), r#"{"amount":100}"#),
    )
    .await;
    assert_eq!(replay.status, first.status);
    assert_eq!(replay.body, first.body);
    assert_eq!(header(&replay, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&replay, "idempotency-key"), Some(KEY));
    assert_eq!(header(&replay, "content-type"), Some("application/json"));
    assert_eq!(header(&replay, "set-cookie"), None);
    assert_eq!(header(&replay, "x-request-id"), None, "not allow-listed");
    assert_eq!(
        replay.handled.map(|h| h.disposition),
        Some(idem_core::EventKind::Replayed)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c01_a_missing_or_invalid_key_is_a_400_problem_and_nothing_runs() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = charges(Arc::clone(&calls)).route_layer(layer(Idempotency::new(MemoryStore::new())));
    let missing = send(&app, request(Method::POST, "/v1/charges", None, "{}")).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        problem_type(&missing),
        "https://idem.rs/problems/idempotency-key-missing"
    );
    assert_eq!(
        header(&missing, "content-type"),
        Some("application/problem+json")
    );
    assert_eq!(header(&missing, "cache-control"), Some("no-store"));
    assert_eq!(header(&missing, "idempotency-key"), None);

    let long = "k".repeat(256);
    for bad in ["\"with space\"", "\"unterminated", long.as_str(), "\"\""] {
        let invalid = send(&app, request(Method::POST, "/v1/charges", Some(bad), "{}")).await;
        assert_eq!(invalid.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(
            problem_type(&invalid),
            "https://idem.rs/problems/idempotency-key-invalid"
        );
    }
    let twice = Request::builder()
        .method(Method::POST)
        .uri("/v1/charges")
        .header("x-account", "acct_1")
        .header("idempotency-key", "a")
        .header("idempotency-key", "b")
        .body(Body::empty())
        .expect("a request");
    assert_eq!(send(&app, twice).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn c01_a_quoted_key_is_the_same_key_as_the_bare_one() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = charges(Arc::clone(&calls)).route_layer(layer(Idempotency::new(MemoryStore::new())));
    send(
        &app,
        request(Method::POST, "/v1/charges", Some("abc-123"), "{}"),
    )
    .await;
    let quoted = send(
        &app,
        request(Method::POST, "/v1/charges", Some("\"abc-123\""), "{}"),
    )
    .await;
    assert_eq!(header(&quoted, "idempotent-replayed"), Some("true"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c03_another_body_path_or_query_is_a_422_and_the_original_still_replays() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = charges(Arc::clone(&calls)).route_layer(layer(Idempotency::new(MemoryStore::new())));
    let first = send(
        &app,
        request(Method::POST, "/v1/charges", Some(KEY), r#"{"amount":100}"#),
    )
    .await;
    for (uri, body) in [
        ("/v1/charges", r#"{"amount":999}"#),
        ("/v1/charges?expand=customer", r#"{"amount":100}"#),
    ] {
        let reused = send(&app, request(Method::POST, uri, Some(KEY), body)).await;
        assert_eq!(
            reused.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{uri} {body}"
        );
        assert_eq!(
            problem_type(&reused),
            "https://idem.rs/problems/idempotency-key-reused"
        );
        assert_eq!(header(&reused, "cache-control"), Some("no-store"));
        assert_eq!(
            reused.handled.map(|h| h.disposition),
            Some(idem_core::EventKind::Mismatch)
        );
    }
    let again = send(
        &app,
        request(Method::POST, "/v1/charges", Some(KEY), r#"{"amount":100}"#),
    )
    .await;
    assert_eq!((again.status, again.body), (first.status, first.body));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c03_volatile_headers_are_not_fingerprinted_and_named_ones_are() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = charges(Arc::clone(&calls)).route_layer(
        layer(Idempotency::new(MemoryStore::new()))
            .fingerprint_header(http::HeaderName::from_static("api-version")),
    );
    let with = |ua: &str, version: &str| {
        let mut r = request(Method::POST, "/v1/charges", Some(KEY), "{}");
        r.headers_mut()
            .insert("user-agent", ua.parse().expect("value"));
        r.headers_mut()
            .insert("traceparent", format!("00-{ua}-01").parse().expect("value"));
        r.headers_mut()
            .insert("api-version", version.parse().expect("value"));
        r
    };
    send(&app, with("curl/8", "2024-01-01")).await;
    let retry = send(&app, with("python-requests/2", "2024-01-01")).await;
    assert_eq!(header(&retry, "idempotent-replayed"), Some("true"));
    let other_version = send(&app, with("curl/8", "2025-06-30")).await;
    assert_eq!(other_version.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c03_canonical_json_makes_a_reencoded_body_the_same_request() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = charges(Arc::clone(&calls))
        .route_layer(layer(Idempotency::new(MemoryStore::new())).canonical_json(&["sent_at"]));
    send(
        &app,
        request(
            Method::POST,
            "/v1/charges",
            Some(KEY),
            r#"{"amount":100,"currency":"usd","sent_at":1}"#,
        ),
    )
    .await;
    let reencoded = send(
        &app,
        request(
            Method::POST,
            "/v1/charges",
            Some(KEY),
            "{ \"currency\": \"usd\", \"sent_at\": 2, \"amount\": 100 }",
        ),
    )
    .await;
    assert_eq!(header(&reencoded, "idempotent-replayed"), Some("true"));
    let other = send(
        &app,
        request(
            Method::POST,
            "/v1/charges",
            Some(KEY),
            r#"{"amount":100.0,"currency":"usd"}"#,
        ),
    )
    .await;
    assert_eq!(
        other.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "100.0 is not 100: numbers keep their text"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c05_a_duplicate_in_flight_gets_a_409_at_once_then_the_replay() {
    let release = Arc::new(Notify::new());
    let started = Arc::new(Notify::new());
    let (r, s) = (Arc::clone(&release), Arc::clone(&started));
    let app = Router::new()
        .route(
            "/v1/charges",
            post(move || {
                let (release, started) = (Arc::clone(&r), Arc::clone(&s));
                async move {
                    started.notify_one();
                    release.notified().await;
                    (StatusCode::OK, "charged")
                }
            }),
        )
        .route_layer(layer(Idempotency::new(MemoryStore::new())));
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, request(Method::POST, "/v1/charges", Some(KEY), "{}")).await }
    });
    started.notified().await;
    let asked = Instant::now();
    let busy = send(&app, request(Method::POST, "/v1/charges", Some(KEY), "{}")).await;
    assert!(
        asked.elapsed() < Duration::from_millis(500),
        "never waits for the first request"
    );
    assert_eq!(busy.status, StatusCode::CONFLICT);
    assert_eq!(
        problem_type(&busy),
        "https://idem.rs/problems/request-in-progress"
    );
    let retry_after: u64 = header(&busy, "retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert_eq!(
        retry_after, 1,
        "the lease's minute left, capped at max_retry_after"
    );
    assert_eq!(header(&busy, "cache-control"), Some("no-store"));
    let body: serde_json::Value = serde_json::from_str(&busy.body).expect("json");
    assert_eq!(body["retryable"], true);

    release.notify_one();
    let first = first.await.expect("the first request");
    assert_eq!(first.status, StatusCode::OK);
    let replay = send(&app, request(Method::POST, "/v1/charges", Some(KEY), "{}")).await;
    assert_eq!(
        (replay.status, replay.body.as_str()),
        (StatusCode::OK, "charged")
    );
}

#[tokio::test]
async fn c05_an_asynchronous_endpoint_answers_202_with_the_status_location() {
    let release = Arc::new(Notify::new());
    let started = Arc::new(Notify::new());
    let (r, s) = (Arc::clone(&release), Arc::clone(&started));
    let idem = Idempotency::new(MemoryStore::new());
    let app = Router::new()
        .route(
            "/v1/exports",
            post(move || {
                let (release, started) = (Arc::clone(&r), Arc::clone(&s));
                async move {
                    started.notify_one();
                    release.notified().await;
                    "done"
                }
            }),
        )
        .route_layer(layer(idem).accept_in_flight(|_, key| Some(format!("/v1/operations/{key}"))));
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, request(Method::POST, "/v1/exports", Some(KEY), "{}")).await }
    });
    started.notified().await;
    let accepted = send(&app, request(Method::POST, "/v1/exports", Some(KEY), "{}")).await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED);
    assert_eq!(
        header(&accepted, "location"),
        Some(format!("/v1/operations/{KEY}").as_str())
    );
    assert_eq!(
        header(&accepted, "retry-after"),
        Some("1"),
        "a 202's Retry-After is capped like a 409's"
    );
    release.notify_one();
    first.await.expect("the first request");
}

#[tokio::test]
async fn c12_a_body_over_the_limit_is_a_413_and_nothing_is_recorded() {
    let calls = Arc::new(AtomicUsize::new(0));
    let idem = Idempotency::with_policy(MemoryStore::new(), Policy::default().max_body_bytes(16))
        .expect("policy");
    let app = charges(Arc::clone(&calls)).route_layer(layer(idem));
    let big = "x".repeat(17);
    let too_large = send(&app, request(Method::POST, "/v1/charges", Some(KEY), &big)).await;
    assert_eq!(too_large.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        problem_type(&too_large),
        "https://idem.rs/problems/body-too-large"
    );
    // Streamed, without Content-Length: refused when it crosses the limit.
    let stream = Body::new(Frames::new([Ok("0123456789"), Ok("0123456789")]));
    let mut streamed = request(Method::POST, "/v1/charges", Some(KEY), "");
    *streamed.body_mut() = stream;
    assert_eq!(
        send(&app, streamed).await.status,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    // Nothing was recorded: the same key with a small body executes.
    let small = send(&app, request(Method::POST, "/v1/charges", Some(KEY), "{}")).await;
    assert_eq!(small.status, StatusCode::CREATED);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c13_the_store_down_is_a_503_and_the_handler_never_runs_unprotected() {
    let calls = Arc::new(AtomicUsize::new(0));
    let down = Decorated::new(MemoryStore::new()).down();
    let app = charges(Arc::clone(&calls)).route_layer(layer(Idempotency::new(down)));
    let reply = send(&app, request(Method::POST, "/v1/charges", Some(KEY), "{}")).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        problem_type(&reply),
        "https://idem.rs/problems/store-unavailable"
    );
    assert_eq!(header(&reply, "retry-after"), Some("1"));
    assert_eq!(header(&reply, "cache-control"), Some("no-store"));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn c08_any_status_the_handler_chose_is_stored_and_replayed() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let app = Router::new()
        .route(
            "/v1/charges",
            post(move || {
                c.fetch_add(1, Ordering::SeqCst);
                async { (StatusCode::PAYMENT_REQUIRED, r#"{"error":"card_declined"}"#) }
            }),
        )
        .route_layer(layer(Idempotency::new(MemoryStore::new())));
    let first = send(&app, request(Method::POST, "/v1/charges", Some(KEY), "{}")).await;
    let replay = send(&app, request(Method::POST, "/v1/charges", Some(KEY), "{}")).await;
    assert_eq!(
        (first.status, replay.status),
        (StatusCode::PAYMENT_REQUIRED, StatusCode::PAYMENT_REQUIRED)
    );
    assert_eq!(replay.body, first.body);
    assert_eq!(header(&replay, "idempotent-replayed"), Some("true"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A handler that fails `failures` times with `status` (marked or not), then succeeds.
fn flaky(calls: Arc<AtomicUsize>, failures: usize, status: StatusCode, marked: bool) -> Router {
    Router::new().route(
        "/v1/charges",
        post(move || {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                match (n < failures, marked) {
                    (true, true) => (status, NothingHappened, "rolled back").into_response(),
                    (true, false) => (status, "upstream timed out").into_response(),
                    (false, _) => (StatusCode::CREATED, "charged").into_response(),
                }
            }
        }),
    )
}

#[tokio::test]
async fn c08_nothing_happened_releases_the_key_so_the_retry_runs() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = flaky(Arc::clone(&calls), 1, StatusCode::SERVICE_UNAVAILABLE, true)
        .route_layer(layer(Idempotency::new(MemoryStore::new())));
    let failed = send(&app, request(Method::POST, "/v1/charges", Some(KEY), "{}")).await;
    assert_eq!(
        (failed.status, failed.body.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "rolled back")
    );
    assert_eq!(
        failed.handled.map(|h| h.disposition),
        Some(idem_core::EventKind::Released)
    );
    let retry = send(&app, request(Method::POST, "/v1/charges", Some(KEY), "{}")).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(header(&retry, "idempotent-replayed"), None);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn c08_an_unmarked_5xx_is_stored_unless_the_rule_releases_it() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = flaky(Arc::clone(&calls), 1, StatusCode::BAD_GATEWAY, false)
        .route_layer(layer(Idempotency::new(MemoryStore::new())));
    send(&app, request(Method::POST, "/v1/charges", Some(KEY), "{}")).await;
    let retry = send(&app, request(Method::POST, "/v1/charges", Some(KEY), "{}")).await;
    assert_eq!(
        (retry.status, retry.body.as_str()),
        (StatusCode::BAD_GATEWAY, "upstream timed out")
    );
    assert_eq!(header(&retry, "idempotent-replayed"), Some("true"));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "an ambiguous 5xx is never run again"
    );

    let calls = Arc::new(AtomicUsize::new(0));
    let app = flaky(Arc::clone(&calls), 1, StatusCode::BAD_GATEWAY, false).route_layer(
        layer(Idempotency::new(MemoryStore::new())).server_errors(ServerErrors::Release),
    );
    send(&app, request(Method::POST, "/v1/charges", Some(KEY), "{}")).await;
    let retry = send(&app, request(Method::POST, "/v1/charges", Some(KEY), "{}")).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn c08_a_response_too_large_to_store_becomes_a_stored_500() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = charges(Arc::clone(&calls))
        .route_layer(layer(Idempotency::new(MemoryStore::new())).max_response_bytes(8));
    let first = send(&app, request(Method::POST, "/v1/charges", Some(KEY), "{}")).await;
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        problem_type(&first),
        "https://idem.rs/problems/response-too-large"
    );
    let retry = send(&app, request(Method::POST, "/v1/charges", Some(KEY), "{}")).await;
    assert_eq!((retry.status, retry.body), (first.status, first.body));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the effect ran: never again for this key"
    );
}

#[tokio::test]
async fn c02_keys_belong_to_their_consumer_and_a_request_without_one_is_refused() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = charges(Arc::clone(&calls)).route_layer(layer(Idempotency::new(MemoryStore::new())));
    send(&app, request(Method::POST, "/v1/charges", Some(KEY), "{}")).await;
    let mut other = request(Method::POST, "/v1/charges", Some(KEY), "{}");
    other
        .headers_mut()
        .insert("x-account", "acct_2".parse().expect("value"));
    let other = send(&app, other).await;
    assert_eq!(other.status, StatusCode::CREATED);
    assert_eq!(
        header(&other, "idempotent-replayed"),
        None,
        "another consumer's key is unrelated"
    );

    let mut anonymous = request(Method::POST, "/v1/charges", Some(KEY), "{}");
    anonymous.headers_mut().remove("x-account");
    let anonymous = send(&app, anonymous).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        problem_type(&anonymous),
        "https://idem.rs/problems/consumer-unknown"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn safe_methods_pass_through_and_put_is_protected_when_it_carries_a_key() {
    let puts = Arc::new(AtomicUsize::new(0));
    let p = Arc::clone(&puts);
    let app = charges(Arc::new(AtomicUsize::new(0)))
        .route(
            "/v1/customers/{id}",
            put(move || {
                let n = p.fetch_add(1, Ordering::SeqCst);
                async move { format!("put {n}") }
            }),
        )
        .route("/health", get(|| async { "ok" }))
        .route_layer(layer(Idempotency::new(MemoryStore::new())));
    let listing = send(&app, request(Method::GET, "/v1/charges", None, "")).await;
    assert_eq!(
        (listing.status, listing.body.as_str()),
        (StatusCode::OK, "listing")
    );
    assert!(listing.handled.is_none());
    assert_eq!(
        send(
            &app,
            request(Method::PUT, "/v1/customers/cus_1", None, "{}")
        )
        .await
        .body,
        "put 0"
    );
    assert_eq!(
        send(
            &app,
            request(Method::PUT, "/v1/customers/cus_1", None, "{}")
        )
        .await
        .body,
        "put 1"
    );
    let keyed = send(
        &app,
        request(Method::PUT, "/v1/customers/cus_1", Some(KEY), "{}"),
    )
    .await;
    let again = send(
        &app,
        request(Method::PUT, "/v1/customers/cus_1", Some(KEY), "{}"),
    )
    .await;
    assert_eq!(
        (keyed.body.as_str(), again.body.as_str()),
        ("put 2", "put 2")
    );
    // The scope is the route template; the fingerprint the concrete path (C3).
    let other_customer = send(
        &app,
        request(Method::PUT, "/v1/customers/cus_2", Some(KEY), "{}"),
    )
    .await;
    assert_eq!(other_customer.status, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn problems_can_be_rendered_in_the_applications_own_shape() {
    let app = charges(Arc::new(AtomicUsize::new(0))).route_layer(
        layer(Idempotency::new(MemoryStore::new())).render_problems(|p: &Problem| {
            StoredResponse::new(
                p.status,
                format!(
                    r#"{{"error":{{"type":"idempotency_error","code":"{}"}}}}"#,
                    p.kind
                ),
            )
            .with_header("content-type", "application/json")
        }),
    );
    let missing = send(&app, request(Method::POST, "/v1/charges", None, "{}")).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.body,
        r#"{"error":{"type":"idempotency_error","code":"idempotency-key-missing"}}"#
    );
    assert_eq!(header(&missing, "content-type"), Some("application/json"));
    assert_eq!(header(&missing, "cache-control"), Some("no-store"));
}

/// The key is echoed under the header the layer reads it from, when that is not the default.
#[tokio::test]
async fn a_key_in_a_custom_header_is_echoed_in_that_header() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = charges(Arc::clone(&calls)).route_layer(
        layer(Idempotency::new(MemoryStore::new()))
            .key_header(http::HeaderName::from_static("x-request-key")),
    );
    let keyed = || {
        let mut request = request(Method::POST, "/v1/charges", None, "{}");
        request
            .headers_mut()
            .insert("x-request-key", http::HeaderValue::from_static(KEY));
        request
    };
    let first = send(&app, keyed()).await;
    let again = send(&app, keyed()).await;
    for reply in [&first, &again] {
        assert_eq!(header(reply, "x-request-key"), Some(KEY));
        assert_eq!(header(reply, "idempotency-key"), None);
    }
    assert_eq!(header(&again, "idempotent-replayed"), Some("true"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
