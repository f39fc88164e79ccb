//! The rule of fingerprints for JSON bodies (C3): canonical by default, byte for byte where a
//! route opts out, and records stored under the raw form (before JSON was canonical by
//! default) kept replaying for their retries.
#![cfg(feature = "axum")]

mod support;

use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use idem_core::{Idempotency, MemoryStore, Store};
use idem_sqlite::SqliteStore;
use idem_tower::{ConsumerError, IdempotencyLayer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use support::{build_request, header, header_account, send_in_time, Reply};
use tokio::sync::Notify;

type Consumer = fn(&http::request::Parts) -> Result<String, ConsumerError>;

/// A layer with the defaults over an engine on `store`.
fn layer<S: Store + 'static>(store: S) -> IdempotencyLayer<S, Consumer> {
    IdempotencyLayer::new(Idempotency::new(store), header_account as Consumer)
}

/// A charges endpoint that counts its executions and answers with the count.
fn charges<S: Store + 'static>(
    calls: &Arc<AtomicUsize>,
    layer: IdempotencyLayer<S, Consumer>,
) -> Router {
    let calls = Arc::clone(calls);
    Router::new()
        .route(
            "/v1/charges",
            post(move || {
                let calls = Arc::clone(&calls);
                async move {
                    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    (
                        StatusCode::CREATED,
                        [("content-type", "application/json")],
                        format!(r#"{{"charge":"ch_{n}"}}"#),
                    )
                }
            }),
        )
        .route_layer(layer)
}

async fn post_json(app: &Router, content_type: &str, key: &str, body: &str) -> Reply {
    let headers = [("x-account", "acct_1"), ("content-type", content_type)];
    let request = build_request("POST", "/v1/charges", &headers, Some(key), body);
    send_in_time(app, request).await
}

fn replayed(reply: &Reply) -> bool {
    header(reply, "idempotent-replayed") == Some("true")
}

const SENT: &str = r#"{"amount":1000,"currency":"eur","metadata":{"order":7,"tags":["a","b"]}}"#;
const REENCODED: &str =
    "{ \"metadata\" : { \"tags\" : [ \"a\", \"b\" ], \"order\" : 7 },\n\t\"currency\": \"eur\", \"amount\": 1000 }";

#[tokio::test]
async fn c03_a_json_retry_with_reordered_keys_and_other_whitespace_replays_by_default() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = charges(&calls, layer(MemoryStore::new()));
    for (key, first_type, retry_type) in [
        (
            "k-json",
            "application/json",
            "application/json; charset=utf-8",
        ),
        (
            "k-suffix",
            "application/vnd.api+json",
            "Application/Vnd.API+JSON",
        ),
    ] {
        let first = post_json(&app, first_type, key, SENT).await;
        assert_eq!(first.status, StatusCode::CREATED, "{key}: {first:?}");
        let retry = post_json(&app, retry_type, key, REENCODED).await;
        assert_eq!(retry.status, first.status, "{key}: {retry:?}");
        assert_eq!(retry.body, first.body, "{key}");
        assert!(replayed(&retry), "{key}: {retry:?}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2, "one execution per key");
    let other = post_json(
        &app,
        "application/json",
        "k-json",
        &SENT.replace("1000", "1001"),
    )
    .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY, "{other:?}");
}

#[tokio::test]
async fn c03_a_route_with_raw_json_answers_a_reencoded_retry_with_422() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = charges(&calls, layer(MemoryStore::new()).raw_json());
    let first = post_json(&app, "application/json", "k", SENT).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let reencoded = post_json(&app, "application/json", "k", REENCODED).await;
    assert_eq!(
        reencoded.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{reencoded:?}"
    );
    let same = post_json(&app, "application/json", "k", SENT).await;
    assert!(replayed(&same), "the same bytes replay: {same:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A record an earlier release stored (raw JSON fingerprint, here a route with `raw_json`) is
/// replayed by a layer with the defaults on the same store for the same bytes, whatever the
/// parameters of the media type. A raw record knows only the hash of the bytes sent, so a
/// re-encoded retry is a 422 on it, as it was on the earlier release; another body too.
async fn a_raw_record_replays_on_a_default_layer<S: Store + Clone + 'static>(store: S) {
    let calls = Arc::new(AtomicUsize::new(0));
    let old = charges(&calls, layer(store.clone()).raw_json());
    let new = charges(&calls, layer(store));
    let first = post_json(&old, "application/json", "k", SENT).await;
    assert_eq!(first.status, StatusCode::CREATED);
    for content_type in ["application/json", "application/json; charset=utf-8"] {
        let retry = post_json(&new, content_type, "k", SENT).await;
        assert_eq!(retry.status, first.status, "{retry:?}");
        assert_eq!(retry.body, first.body);
        assert!(replayed(&retry), "{retry:?}");
    }
    for body in [REENCODED.to_owned(), SENT.replace("eur", "usd")] {
        let other = post_json(&new, "application/json", "k", &body).await;
        assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY, "{other:?}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c03_a_record_stored_under_the_raw_fingerprint_replays_on_a_default_layer() {
    a_raw_record_replays_on_a_default_layer(Arc::new(MemoryStore::new())).await;
}

/// SQLite reads a stored response only for the fingerprint it is asked with: the reservation
/// asks again under the raw one.
#[tokio::test]
async fn c03_a_record_stored_under_the_raw_fingerprint_replays_on_sqlite() {
    let dir = tempfile::tempdir().expect("a directory");
    let sqlite = SqliteStore::open(dir.path().join("idem.db"))
        .await
        .expect("open");
    a_raw_record_replays_on_a_default_layer(Arc::new(sqlite)).await;
}

#[tokio::test]
async fn c03_a_raw_record_in_flight_is_in_flight_for_a_default_layer() {
    let store = Arc::new(MemoryStore::new());
    let (release, started) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (r, s) = (Arc::clone(&release), Arc::clone(&started));
    let old = Router::new()
        .route(
            "/v1/charges",
            post(move || {
                let (release, started) = (Arc::clone(&r), Arc::clone(&s));
                async move {
                    started.notify_one();
                    release.notified().await;
                    (StatusCode::CREATED, "charged")
                }
            }),
        )
        .route_layer(layer(Arc::clone(&store)).raw_json());
    let calls = Arc::new(AtomicUsize::new(0));
    let new = charges(&calls, layer(store));
    let first = tokio::spawn(async move { post_json(&old, "application/json", "k", SENT).await });
    started.notified().await;
    let retry = post_json(&new, "application/json; charset=utf-8", "k", SENT).await;
    assert_eq!(retry.status, StatusCode::CONFLICT, "{retry:?}");
    release.notify_one();
    let first = first.await.expect("the first request");
    assert_eq!(first.status, StatusCode::CREATED);
    let retry = post_json(&new, "application/json", "k", SENT).await;
    assert_eq!(retry.body, "charged");
    assert!(replayed(&retry), "{retry:?}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "never run by the new layer"
    );
}

/// The other direction of an upgrade: a record a default layer wrote carries the canonical
/// fingerprint, which a process of the earlier release (raw only) does not know: its retry
/// with the same bytes is a 422 there. `raw_json_records` (the upgrade's first step) writes the
/// raw form and accepts the canonical one, so that every record replays on every process.
#[tokio::test]
async fn c03_raw_json_records_keep_both_releases_replaying() {
    let store = Arc::new(MemoryStore::new());
    let calls = Arc::new(AtomicUsize::new(0));
    let old = charges(&calls, layer(Arc::clone(&store)).raw_json());
    // In either order with the exclusions.
    let step = layer(Arc::clone(&store))
        .raw_json_records()
        .canonical_json(&[]);
    let step = charges(&calls, step);
    let new = charges(&calls, layer(store));

    let by_new = post_json(&new, "application/json", "k-new", SENT).await;
    assert_eq!(by_new.status, StatusCode::CREATED);
    let on_old = post_json(&old, "application/json", "k-new", SENT).await;
    assert_eq!(
        on_old.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "without the first step: {on_old:?}"
    );
    for body in [SENT, REENCODED] {
        let on_step = post_json(&step, "application/json", "k-new", body).await;
        assert_eq!(on_step.body, by_new.body);
        assert!(replayed(&on_step), "{on_step:?}");
    }

    let by_step = post_json(&step, "application/json", "k-step", SENT).await;
    assert_eq!(by_step.status, StatusCode::CREATED);
    let on_old = post_json(&old, "application/json", "k-step", SENT).await;
    assert!(replayed(&on_old), "written raw: {on_old:?}");
    let on_new = post_json(&new, "application/json", "k-step", SENT).await;
    assert!(replayed(&on_new), "{on_new:?}");
    assert_eq!(on_new.body, by_step.body);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn c03_a_body_that_is_not_json_under_a_json_type_is_fingerprinted_raw() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = charges(&calls, layer(MemoryStore::new()));
    let broken = r#"{"amount": 1000,"#;
    let first = post_json(&app, "application/json", "k", broken).await;
    assert_eq!(first.status, StatusCode::CREATED, "not a 500: {first:?}");
    let same = post_json(&app, "application/json", "k", broken).await;
    assert!(replayed(&same), "{same:?}");
    let respaced = post_json(&app, "application/json", "k", r#"{"amount":1000,"#).await;
    assert_eq!(
        respaced.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "raw bytes: {respaced:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// `depth` arrays around `{"a":1,"b":2}`, its keys in that order or `reversed`.
fn nested(depth: usize, reversed: bool) -> String {
    let inner = if reversed {
        r#"{"b":2,"a":1}"#
    } else {
        r#"{"a":1,"b":2}"#
    };
    "[".repeat(depth) + inner + &"]".repeat(depth)
}

/// Hostile JSON is answered, never a crash or a 500: nesting past the canonical form's limit
/// (128 arrays and objects) and duplicate keys are fingerprinted raw (a re-encoding is then
/// another request), numbers of any size stay text. The parser makes one pass over a body the
/// body limit bounds, and recurses no deeper than the limit.
#[tokio::test]
async fn c12_hostile_json_is_answered_and_the_depth_limit_holds() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = charges(&calls, layer(MemoryStore::new()));
    let send_twice = |key: &'static str, first: String, retry: String| {
        let app = app.clone();
        async move {
            let one = post_json(&app, "application/json", key, &first).await;
            assert_eq!(one.status, StatusCode::CREATED, "{key}: {one:?}");
            post_json(&app, "application/json", key, &retry).await
        }
    };
    // 127 arrays and the object: 128 levels, canonical.
    let retry = send_twice("deep-128", nested(127, false), nested(127, true)).await;
    assert!(replayed(&retry), "{retry:?}");
    // One level more: raw.
    let retry = send_twice("deep-129", nested(128, false), nested(128, true)).await;
    assert_eq!(retry.status, StatusCode::UNPROCESSABLE_ENTITY, "{retry:?}");
    // Far deeper than any stack would take recursively.
    let deep = "[".repeat(200_000) + &"]".repeat(200_000);
    let retry = send_twice("deep-200000", deep.clone(), deep).await;
    assert!(replayed(&retry), "{retry:?}");
    // Duplicate keys: raw.
    let retry = send_twice(
        "duplicates",
        r#"{"a":1,"a":2}"#.to_owned(),
        r#"{ "a":1, "a":2 }"#.to_owned(),
    )
    .await;
    assert_eq!(retry.status, StatusCode::UNPROCESSABLE_ENTITY, "{retry:?}");
    // Numbers of 100 000 digits and a huge exponent: canonical, digit for digit.
    let huge = "9".repeat(100_000);
    let body = |a: &str, e: &str| format!(r#"{{"amount":{a},"rate":1e{e}}}"#);
    let retry = send_twice(
        "huge",
        body(&huge, "999999999999"),
        format!(r#"{{ "rate": 1E+999999999999, "amount": {huge} }}"#),
    )
    .await;
    assert!(replayed(&retry), "{retry:?}");
    let mut other = huge.clone();
    other.replace_range(99_999.., "8");
    let differs = post_json(
        &app,
        "application/json",
        "huge",
        &body(&other, "999999999999"),
    )
    .await;
    assert_eq!(
        differs.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{differs:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 5);
}

/// `Idempotency::transact` on SQLite answers a duplicate on a reader while the writer is busy
/// (C5), from a read under the request's own fingerprint: the engine asks again under the
/// alternative, so a record stored raw replays there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c03_a_transaction_on_sqlite_replays_a_raw_record_while_the_writer_is_busy() {
    use idem_core::{Answer, Begin, Outcome, StoredResponse};
    use idem_sqlite::rusqlite;
    use std::time::Duration;

    let dir = tempfile::tempdir().expect("a directory");
    let sqlite = SqliteStore::open(dir.path().join("idem.db"))
        .await
        .expect("open");
    let idem = Idempotency::new(sqlite.clone());
    let canonical = idem_tower::canonical::canonical_json(REENCODED.as_bytes(), &[]).expect("JSON");
    let build = |body: &'static str| {
        idem.request("acct_1", "POST", "/v1/charges")
            .key(Some("k"))
            .content_type("application/json")
            .body(body.as_bytes())
    };
    let raw = build(SENT).build().expect("a request");
    let Begin::Acquired(lease) = idem.begin(&raw).await.expect("begin") else {
        panic!("a fresh key")
    };
    let earlier = StoredResponse::new(201, "earlier");
    idem.complete(lease, earlier.clone())
        .await
        .expect("complete");

    let (started, busy) = tokio::sync::oneshot::channel();
    let writer = tokio::spawn({
        let sqlite = sqlite.clone();
        async move {
            sqlite
                .call(move |_| {
                    let _ = started.send(());
                    std::thread::sleep(Duration::from_millis(500));
                })
                .await
        }
    });
    busy.await.expect("the writer is busy");
    let retry = build(SENT)
        .canonical_json(&canonical)
        .build()
        .expect("a request")
        .with_alternative_fingerprint(*raw.fingerprint());
    let effect: idem_sqlite::SqliteEffect<rusqlite::Error> =
        Box::new(|_, _| Ok(StoredResponse::new(201, "again")));
    let outcome = idem.transact(&retry, effect).await.expect("an outcome");
    assert!(
        matches!(&outcome, Outcome::Answered(Answer::Replay(r)) if r.body == earlier.body),
        "{outcome:?}"
    );
    writer.await.expect("joined").expect("the writer's call");
}
