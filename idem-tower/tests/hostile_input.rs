//! Hostile input through the layer: headers that must never be stored or replayed, header
//! injection, key header tricks, consumers, fingerprint domains, what a renderer may change.
#![cfg(feature = "axum")]

mod support;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::{any, post};
use axum::Router;
use idem_core::{Idempotency, MemoryStore, Policy, StoredResponse};
use idem_tower::render::Problem;
use idem_tower::{ConsumerError, IdempotencyLayer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::{build_request, header_account, send_in_time, Decorated, Reply};
use tokio::sync::Notify;

fn req(method: &str, key: Option<&str>, content_type: &str, body: &str) -> Request<Body> {
    build_request(
        method,
        "/v1/charges",
        &[("x-account", "acct_1"), ("content-type", content_type)],
        key,
        body,
    )
}

const SECRET_HEADERS: &[&str] = &[
    "set-cookie",
    "Set-Cookie2",
    "authorization",
    "proxy-authorization",
    "www-authenticate",
    "proxy-authenticate",
    "authentication-info",
    "date",
    "retry-after",
    "x-ratelimit-remaining",
    "X-RateLimit-Reset",
    "x-rate-limit-limit",
    "ratelimit",
    "ratelimit-policy",
    "ratelimit-remaining",
    "x-api-key",
    "x-auth-token",
    "idempotent-replayed",
];

/// Every never-stored header, even allow-listed by the policy, in any case: neither on the live
/// answer nor on the replay. `etag` (allow-listed by default) and `content-type` travel.
#[tokio::test]
async fn c07_never_stored_headers_are_neither_sent_live_nor_replayed() {
    let mut policy = Policy::default();
    for h in SECRET_HEADERS {
        policy = policy.store_header(h);
    }
    let idem = Idempotency::with_policy(MemoryStore::new(), policy).expect("policy");
    let app: Router = Router::new()
        .route(
            "/v1/charges",
            post(|| async {
                let mut r = http::Response::new(Body::from("ok"));
                *r.status_mut() = StatusCode::CREATED;
                for h in SECRET_HEADERS {
                    r.headers_mut().append(
                        http::HeaderName::from_bytes(h.as_bytes()).expect("name"),
                        http::HeaderValue::from_static("secret"),
                    );
                }
                r.headers_mut()
                    .insert("etag", http::HeaderValue::from_static("\"v1\""));
                r.headers_mut()
                    .insert("content-type", http::HeaderValue::from_static("text/x"));
                r
            }),
        )
        .route_layer(IdempotencyLayer::new(idem, header_account));
    let live = send_in_time(&app, req("POST", Some("k"), "application/json", "{}")).await;
    let replay = send_in_time(&app, req("POST", Some("k"), "application/json", "{}")).await;
    for (what, r) in [("live", &live), ("replay", &replay)] {
        for h in SECRET_HEADERS {
            if *h == "idempotent-replayed" && what == "replay" {
                assert_eq!(r.headers.get(*h).map(|v| v.as_bytes()), Some(&b"true"[..]));
                continue;
            }
            assert!(
                r.headers.get(*h).is_none(),
                "{what} carries {h}: {:?}",
                r.headers
            );
        }
        assert_eq!(
            r.headers.get("etag").map(|v| v.as_bytes()),
            Some(&b"\"v1\""[..])
        );
        assert_eq!(
            r.headers.get("content-type").map(|v| v.as_bytes()),
            Some(&b"text/x"[..])
        );
    }
}

/// CR/LF through the places an application feeds text into headers: the 202's Location and a
/// custom problem renderer. Dropped, never sent, never a split response.
#[tokio::test]
async fn c07_crlf_in_location_or_renderer_is_dropped() {
    let gate = Arc::new(Notify::new());
    let g = Arc::clone(&gate);
    let idem = Idempotency::new(MemoryStore::new());
    let app: Router = Router::new()
        .route(
            "/v1/charges",
            post(move || {
                let g = Arc::clone(&g);
                async move {
                    g.notified().await;
                    "done"
                }
            }),
        )
        .route_layer(
            IdempotencyLayer::new(idem, header_account)
                .accept_in_flight(|_, key| Some(format!("/status/{key}\r\nSet-Cookie: a=b")))
                .render_problems(|p: &Problem| {
                    StoredResponse::new(p.status, "x").with_header("x-evil", "a\r\nSet-Cookie: b=c")
                }),
        );
    let first = tokio::spawn({
        let app = app.clone();
        async move { send_in_time(&app, req("POST", Some("k"), "application/json", "{}")).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let dup = send_in_time(&app, req("POST", Some("k"), "application/json", "{}")).await;
    assert_eq!(dup.status, StatusCode::ACCEPTED);
    assert!(dup.headers.get("location").is_none() && dup.headers.get("set-cookie").is_none());
    let missing = send_in_time(&app, req("POST", None, "application/json", "{}")).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert!(missing.headers.get("x-evil").is_none() && missing.headers.get("set-cookie").is_none());
    gate.notify_one();
    let _ = first.await;
}

/// Key header tricks: twice, parameters, too long, huge, empty, only spaces: all 400, nothing
/// runs. A quoted key is the bare one (documented).
#[tokio::test]
async fn c01_key_header_tricks_are_400() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let app: Router = Router::new()
        .route(
            "/v1/charges",
            post(move || {
                let c = Arc::clone(&c);
                async move {
                    c.fetch_add(1, Ordering::SeqCst);
                    "ok"
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(
            Idempotency::new(MemoryStore::new()),
            header_account,
        ));
    let long = "k".repeat(256);
    let huge = "k".repeat(64 * 1024);
    for bad in [
        &["a", "b"][..],
        &["a", "a"],
        &["\"a\";p=1"],
        &["\"a"],
        &[long.as_str()],
        &[huge.as_str()],
        &[""],
        &["\"\""],
        &["\"a b\""],
    ] {
        let mut r = req("POST", None, "application/json", "{}");
        for v in bad {
            r.headers_mut().append(
                "idempotency-key",
                http::HeaderValue::from_str(v).expect("v"),
            );
        }
        let Reply { status, body, .. } = send_in_time(&app, r).await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{:?}: {body}",
            &bad[0][..bad[0].len().min(20)]
        );
    }
    // PATCH without a key too; PUT with an invalid one.
    let Reply { status: s, .. } =
        send_in_time(&app, req("PATCH", None, "application/json", "{}")).await;
    assert_ne!(s, StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// The consumer function returns an id longer than the scope allows (255 bytes). The consumer
/// comes from the request's credentials, so one no record can belong to names credentials the
/// server never issued: a 401 `consumer-unknown` (docs/http.md), never a 500 that tells the
/// client to retry, nor a 400 that calls its request malformed; the handler never runs.
#[tokio::test]
async fn c02_a_consumer_no_record_can_belong_to_is_a_401() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let app: Router = Router::new()
        .route(
            "/v1/charges",
            post(move || {
                c.fetch_add(1, Ordering::SeqCst);
                async { "ok" }
            }),
        )
        .route_layer(IdempotencyLayer::new(
            Idempotency::new(MemoryStore::new()),
            |_: &http::request::Parts| Ok::<_, ConsumerError>("c".repeat(300)),
        ));
    let Reply { status, body, .. } =
        send_in_time(&app, req("POST", Some("k"), "application/json", "{}")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(body.contains("consumer-unknown"), "{body}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// `POST /v1/charges`: each execution counted in `calls`, answered 201 with the body it got.
fn echoing_charges(calls: &Arc<AtomicUsize>) -> Router {
    let c = Arc::clone(calls);
    Router::new().route(
        "/v1/charges",
        post(move |body: String| {
            let c = Arc::clone(&c);
            async move {
                c.fetch_add(1, Ordering::SeqCst);
                (StatusCode::CREATED, body)
            }
        }),
    )
}

/// With `canonical_json`, a JSON body is fingerprinted in canonical form and any other body as
/// its raw bytes, in separate domains: a `text/plain` body whose bytes are the canonical form of
/// an earlier JSON body is another request (422), never its replay.
#[tokio::test]
async fn c03_canonical_and_raw_bodies_do_not_share_a_fingerprint_domain() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = echoing_charges(&calls).route_layer(
        IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), header_account)
            .canonical_json(&["sent_at"]),
    );
    let a = send_in_time(
        &app,
        req(
            "POST",
            Some("k"),
            "application/json",
            r#"{"b":1, "a":2, "sent_at":7}"#,
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED);
    let b = send_in_time(
        &app,
        req("POST", Some("k"), "text/plain", r#"{"a":2,"b":1}"#),
    )
    .await;
    assert_eq!(
        b.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "another body (bytes and type) with the same key is a mismatch: {b:?}"
    );
}

/// A Content-Type a handler cannot read as text (a byte beyond visible ASCII: obs-text), or
/// one sent twice, is refused (400, C12) before anything is recorded: the layer took the media
/// type before `;` while a handler's `to_str()` failed and chose its parser by a default, so one
/// key and body read as a 5 000 charge under `application/json; x=\xff` were replayed to the
/// same JSON meaning 100 under `application/json` (C3). Nothing runs, and the key stays free
/// for the request sent as it should be.
#[tokio::test]
async fn c12_a_content_type_beyond_ascii_or_sent_twice_is_refused() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = echoing_charges(&calls).route_layer(IdempotencyLayer::new(
        Idempotency::new(MemoryStore::new()),
        header_account,
    ));
    let typed = |key: &str, content_types: &[&[u8]]| {
        let mut request = req("POST", Some(key), "text/plain", "amount=100");
        request.headers_mut().remove("content-type");
        for content_type in content_types {
            request.headers_mut().append(
                "content-type",
                http::HeaderValue::from_bytes(content_type).expect("obs-text is a valid value"),
            );
        }
        request
    };
    let refused: [&[&[u8]]; 5] = [
        &[b"text/csv\xe9"],
        &[b"application/x-www-form-urlencoded; charset=\xff"],
        &[b"application/json; x=\xff"],
        &[b"application/json", b"application/x-www-form-urlencoded"],
        &[b"application/json", b"application/json"],
    ];
    for (round, content_types) in refused.into_iter().enumerate() {
        let key = format!("content-type-{round}");
        let answer = send_in_time(&app, typed(&key, content_types)).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "round {round}: {answer:?}"
        );
        assert!(
            answer.body.contains("Content-Type"),
            "round {round}: the problem names the header: {answer:?}"
        );
        let sent_right = send_in_time(&app, typed(&key, &[b"application/json"])).await;
        assert_eq!(
            (
                sent_right.status,
                sent_right.headers.get("idempotent-replayed")
            ),
            (StatusCode::CREATED, None),
            "round {round}: nothing was recorded, the key is free: {sent_right:?}"
        );
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        5,
        "only the requests sent right ran"
    );
}

/// `render_problems` may change the shape, not the status: a renderer that answers every
/// problem with 200 (an "errors in the body" API style) cannot turn "store down, nothing ran"
/// into a success. The layer pins the status as it pins `Cache-Control` and `Retry-After`.
#[tokio::test]
async fn c13_render_problems_cannot_turn_a_503_into_a_2xx() {
    let down = Decorated::new(MemoryStore::new()).down();
    let app: Router = Router::new()
        .route("/v1/charges", post(|| async { "ok" }))
        .route_layer(
            IdempotencyLayer::new(Idempotency::new(down), header_account).render_problems(
                |p: &Problem| {
                    StoredResponse::new(200, format!(r#"{{"ok":false,"code":"{}"}}"#, p.kind))
                },
            ),
        );
    let Reply { status, body, .. } =
        send_in_time(&app, req("POST", Some("k"), "application/json", "{}")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
}

/// Methods are case-sensitive, so `post` is not `POST` to HTTP; but on an `any()` route the
/// lowercase method reaches the same handler, so the layer compares methods without case and
/// requires the key.
#[tokio::test]
async fn c01_a_lowercase_post_does_not_bypass_the_key() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let app: Router = Router::new()
        .route(
            "/v1/charges",
            any(move || {
                let c = Arc::clone(&c);
                async move {
                    c.fetch_add(1, Ordering::SeqCst);
                    "charged"
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(
            Idempotency::new(MemoryStore::new()),
            header_account,
        ));
    let Reply { status, .. } =
        send_in_time(&app, req("post", None, "application/json", "{}")).await;
    assert_eq!(
        (status, calls.load(Ordering::SeqCst)),
        (StatusCode::BAD_REQUEST, 0),
        "an unsafe method outside the configured lists ran unprotected"
    );
}
