//! The core's own costs, without any store I/O: what idem adds to every request before and
//! after the database.
//!
//! `cargo bench -p idem-benches --bench core` (about a minute and a half on 2 cores; criterion
//! filters work as usual, e.g. `-- http_layer`). Smoke test, each benchmark run once:
//! `cargo test -p idem-benches --bench core`.
//!
//! Groups:
//! - `decide`: the pure decision function `idem::store::decide` for each transition: no record
//!   (`absent_acquire`), a live in-progress record (`in_progress_in_flight`), a completed record
//!   with the same fingerprint (`completed_replay`) or another one (`completed_mismatch`), an
//!   in-progress record whose lease passed (`expired_lease_take_over`). The record's response is
//!   the stored bytes as a store reads them (`Record<&[u8]>`), so nothing is decoded.
//! - `fingerprint`: the same body of 1 KiB, 64 KiB and 1 MiB (a realistic JSON order: nested
//!   objects and arrays, strings with escapes and non-ASCII, integers, decimals) fingerprinted
//!   as raw bytes and as canonical JSON, with `Fingerprint::builder()..finish()`
//!   (`builder_raw`, `builder_json`) and with `Request::builder(..).build()`, which also
//!   validates the key, method and scope (`request_raw`, `request_json`). Throughput in bytes.
//! - `codec`: `StoredResponse::encode` and `StoredResponse::decode` of a response with four
//!   headers and a body of 100 B, 64 KiB and 1 MiB. Throughput in body bytes.
//! - `http_layer`: one axum handler (`POST /v1/charges`, 201 with a small JSON body) called
//!   through `tower::ServiceExt::oneshot`, the response's body read to the end, the calls made
//!   one after the other inside one task of a 2-worker multi-thread Tokio runtime (as a
//!   server's connection task makes them): `plain` without the layer; with `IdempotencyLayer`
//!   over `MemoryStore`, `layer_fresh` (a new key each call: reservation, the handler,
//!   completion) and `layer_replay` (the same key and body each call: the stored
//!   response replayed); and a `GET` on the same route, `plain_get` without the layer and
//!   `layer_passthrough` with it.
//!   The layer's cost per request is `layer_fresh / plain` (and `layer_passthrough / plain_get`
//!   for requests it does not protect). Two references to read it against: `ref_engine_replay`,
//!   `Idempotency::begin` answering a replay from the same kind of store without HTTP or a task,
//!   and `ref_spawn_join`, one Tokio task spawned and joined on the same runtime (what the
//!   engine spends only when a client disconnects mid-execution: the execution is then handed
//!   to a task of its own, so that the disconnect cannot cancel it).

use axum::body::Body;
use axum::http::{Method, Request as HttpRequest, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use criterion::{
    criterion_group, criterion_main, BatchSize, Bencher, BenchmarkId, Criterion, SamplingMode,
    Throughput,
};
use idem::store::{decide, Acquire, Decision, Record, RecordState};
use idem::store::{FencingToken, Fingerprint, Timestamp};
use idem::tower::canonical::canonical_json;
use idem::tower::{ConsumerError, IdempotencyLayer};
use idem::{Answer, Begin, Idempotency, MemoryStore, Request, StoredResponse};
use std::future::Future;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tower::ServiceExt;

/// Body sizes of the fingerprint group.
const FINGERPRINT_SIZES: [(&str, usize); 3] =
    [("1KiB", 1024), ("64KiB", 64 * 1024), ("1MiB", 1024 * 1024)];
/// Stored body sizes of the codec group.
const CODEC_SIZES: [(&str, usize); 3] =
    [("100B", 100), ("64KiB", 64 * 1024), ("1MiB", 1024 * 1024)];
/// Fewer samples for the 1 MiB cases, so that the whole run stays short.
const LARGE_SAMPLES: usize = 30;

const CONSUMER: &str = "acct_bench";
const ROUTE: &str = "/v1/charges";

// ---------------------------------------------------------------------------------------------
// decide

fn bench_decide(c: &mut Criterion) {
    let mut group = c.benchmark_group("decide");
    let now = Timestamp::from_millis(1_764_470_000_000);
    let live = Timestamp::from_millis(now.as_millis() + 30_000);
    let past = Timestamp::from_millis(now.as_millis() - 1);
    let mine = Fingerprint::builder()
        .method("POST")
        .path(ROUTE)
        .body(br#"{"amount":2500,"currency":"eur"}"#)
        .finish();
    let other = Fingerprint::builder()
        .method("POST")
        .path(ROUTE)
        .body(br#"{"amount":9900,"currency":"eur"}"#)
        .finish();
    let token = FencingToken::generate();
    let stored = StoredResponse::new(201, vec![b'x'; 100])
        .with_header("content-type", "application/json")
        .encode()
        .expect("a small response encodes");
    let in_progress = |lease_until| Record::<&[u8]> {
        fingerprint: mine,
        token,
        state: RecordState::InProgress { lease_until },
    };
    let completed = Record::<&[u8]> {
        fingerprint: mine,
        token,
        state: RecordState::Completed {
            response: &stored,
            expires_at: live,
        },
    };

    /// A transition: its name, the stored record, the incoming fingerprint, what is decided.
    type Case<'a> = (
        &'static str,
        Option<Record<&'a [u8]>>,
        &'a Fingerprint,
        Decision<&'a [u8]>,
    );
    let cases: [Case<'_>; 5] = [
        (
            "absent_acquire",
            None,
            &mine,
            Decision::Acquired(Acquire::FRESH),
        ),
        (
            "in_progress_in_flight",
            Some(in_progress(live)),
            &mine,
            Decision::Answered(Answer::InFlight {
                retry_after: Duration::from_secs(30),
            }),
        ),
        (
            "completed_replay",
            Some(completed.clone()),
            &mine,
            Decision::Answered(Answer::Replay(&stored[..])),
        ),
        (
            "completed_mismatch",
            Some(completed.clone()),
            &other,
            Decision::Answered(Answer::Mismatch),
        ),
        (
            "expired_lease_take_over",
            Some(in_progress(past)),
            &mine,
            Decision::Acquired(Acquire::take_over(token)),
        ),
    ];
    for (name, record, fingerprint, expected) in cases {
        assert_eq!(
            decide(record.clone(), fingerprint, now),
            expected,
            "{name} decides as documented"
        );
        group.bench_function(name, |b| {
            b.iter_batched(
                || record.clone(),
                |record| decide(black_box(record), black_box(fingerprint), black_box(now)),
                BatchSize::SmallInput,
            );
        });
    }
    group.finish();
}

// ---------------------------------------------------------------------------------------------
// fingerprint

/// A JSON order of exactly `size` bytes, keys deliberately unsorted: a customer object, an
/// array of line items (nested objects and arrays, strings with escapes and non-ASCII,
/// integers, decimals, booleans, null), a total and a memo that pads it to the exact size.
fn json_document(size: usize) -> Vec<u8> {
    let mut out = String::with_capacity(size);
    out.push_str(
        r#"{"object":"order","id":"ord_8f3a2c91d0e7","livemode":false,"created":1764470000,"#,
    );
    out.push_str(r#""customer":{"name":"Ada Lovelace","email":"ada@example.com","vat_id":null,"#);
    out.push_str(r#""address":{"line1":"12 Analytical Street","city":"London","postcode":"N1 9GU","country":"GB"}},"#);
    out.push_str(r#""currency":"eur","items":["#);
    let tail = r#"],"total":1234.56,"memo":""#;
    let end = r#""}"#;
    let mut i = 0usize;
    loop {
        let item = format!(
            concat!(
                r#"{}{{"sku":"sku_{:05}","name":"Widget \"{}\" \u00e9dition sp\u00e9ciale","#,
                r#""quantity":{},"unit_price":{}.{:02},"discount":0.{:02},"taxable":{},"#,
                r#""tags":["blue","large","promo-{}"],"#,
                r#""dims":{{"w":12.5,"h":3.25,"d":{}.75,"unit":"cm"}}}}"#
            ),
            if i == 0 { "" } else { "," },
            i,
            i,
            1 + i % 7,
            10 + i % 90,
            i % 100,
            i % 50,
            i.is_multiple_of(2),
            i % 13,
            i % 9,
        );
        if out.len() + item.len() + tail.len() + end.len() > size {
            break;
        }
        out.push_str(&item);
        i += 1;
    }
    out.push_str(tail);
    let filler = b"Please deliver to the back door. ";
    let pad = size.saturating_sub(out.len() + end.len());
    out.extend(filler.iter().cycle().take(pad).map(|&b| char::from(b)));
    out.push_str(end);
    assert_eq!(out.len(), size, "the document has the size asked for");
    let bytes = out.into_bytes();
    serde_json::from_slice::<serde_json::Value>(&bytes).expect("the document is valid JSON");
    bytes
}

fn bench_fingerprint(c: &mut Criterion) {
    let mut group = c.benchmark_group("fingerprint");
    for (label, size) in FINGERPRINT_SIZES {
        let body = json_document(size);
        let body = body.as_slice();
        group.throughput(Throughput::Bytes(size as u64));
        if size >= 1024 * 1024 {
            group.sample_size(LARGE_SAMPLES);
            group.sampling_mode(SamplingMode::Flat);
        }
        group.bench_with_input(BenchmarkId::new("builder_raw", label), body, |b, body| {
            b.iter(|| {
                Fingerprint::builder()
                    .method("POST")
                    .path(ROUTE)
                    .body(black_box(body))
                    .finish()
            });
        });
        group.bench_with_input(BenchmarkId::new("builder_json", label), body, |b, body| {
            b.iter(|| {
                let canonical =
                    canonical_json(black_box(body), &[]).expect("the document is valid JSON");
                Fingerprint::builder()
                    .method("POST")
                    .path(ROUTE)
                    .canonical_json(&canonical)
                    .finish()
            });
        });
        group.bench_with_input(BenchmarkId::new("request_raw", label), body, |b, body| {
            b.iter(|| {
                Request::builder(CONSUMER, "POST", ROUTE)
                    .key(Some("k-0001"))
                    .body(black_box(body))
                    .build()
                    .expect("a valid request")
            });
        });
        group.bench_with_input(BenchmarkId::new("request_json", label), body, |b, body| {
            b.iter(|| {
                let canonical =
                    canonical_json(black_box(body), &[]).expect("the document is valid JSON");
                Request::builder(CONSUMER, "POST", ROUTE)
                    .key(Some("k-0001"))
                    .body(body)
                    .canonical_json(&canonical)
                    .build()
                    .expect("a valid request")
            });
        });
    }
    group.finish();
}

// ---------------------------------------------------------------------------------------------
// codec

fn bench_codec(c: &mut Criterion) {
    let mut group = c.benchmark_group("codec");
    for (label, size) in CODEC_SIZES {
        let response = StoredResponse::new(201, vec![b'x'; size])
            .with_header("content-type", "application/json")
            .with_header("location", "/v1/charges/ch_3PqR8sT1uVwXyZ")
            .with_header("x-request-id", "req_5f0c1e9a7b2d4c68")
            .with_header("etag", "\"33a64df551425fcc55e4d42a148795d9f25f89d4\"");
        let encoded = response.encode().expect("the response encodes");
        assert_eq!(
            StoredResponse::decode(&encoded).expect("the encoding decodes"),
            response
        );
        group.throughput(Throughput::Bytes(size as u64));
        if size >= 1024 * 1024 {
            group.sample_size(LARGE_SAMPLES);
            group.sampling_mode(SamplingMode::Flat);
        }
        group.bench_with_input(BenchmarkId::new("encode", label), &response, |b, r| {
            b.iter(|| black_box(r).encode().expect("the response encodes"));
        });
        group.bench_with_input(BenchmarkId::new("decode", label), &encoded, |b, e| {
            b.iter(|| StoredResponse::decode(black_box(e)).expect("the encoding decodes"));
        });
    }
    group.finish();
}

// ---------------------------------------------------------------------------------------------
// http_layer

const CHARGE_BODY: &str = r#"{"amount":2500,"currency":"eur","customer":"cus_A"}"#;

async fn create_charge() -> (StatusCode, Json<serde_json::Value>) {
    (
        StatusCode::CREATED,
        Json(serde_json::json!({
            "id": "ch_3PqR8sT1uVwXyZ",
            "object": "charge",
            "amount": 2500,
            "currency": "eur",
            "status": "succeeded"
        })),
    )
}

async fn list_charges() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "object": "list", "data": [], "has_more": false }))
}

fn plain_router() -> Router {
    Router::new().route(ROUTE, get(list_charges).post(create_charge))
}

fn layered_router() -> Router {
    plain_router().route_layer(IdempotencyLayer::new(
        Idempotency::new(MemoryStore::new()),
        |_parts: &axum::http::request::Parts| Ok::<_, ConsumerError>("acct_1".to_owned()),
    ))
}

fn post(key: Option<&str>) -> HttpRequest<Body> {
    let mut request = HttpRequest::builder()
        .method(Method::POST)
        .uri(ROUTE)
        .header("content-type", "application/json");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request
        .body(Body::from(CHARGE_BODY))
        .expect("a valid request")
}

fn get_request() -> HttpRequest<Body> {
    HttpRequest::builder()
        .method(Method::GET)
        .uri(ROUTE)
        .body(Body::empty())
        .expect("a valid request")
}

/// One call through the router, the response's body read to the end as a server would send it.
async fn call(app: Router, request: HttpRequest<Body>) -> (StatusCode, bool, usize) {
    let response = app.oneshot(request).await.expect("a router is infallible");
    let status = response.status();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("the body is read");
    (status, replayed, body.len())
}

/// Times `iters` calls of `op`, one after the other, inside one task of the runtime, the way a
/// server's connection task makes them (hyper serves each connection on a task of its own): the
/// measured loop runs on a worker thread, so that a task the call spawns is scheduled as it
/// would be in a server, not woken across from the benchmark's own thread.
fn on_worker<F, Fut>(b: &mut Bencher<'_>, rt: &Runtime, op: F)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future + Send + 'static,
{
    b.to_async(rt).iter_custom(|iters| {
        let op = op.clone();
        async move {
            tokio::spawn(async move {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(op().await);
                }
                start.elapsed()
            })
            .await
            .expect("the measuring task completes")
        }
    });
}

fn bench_http_layer(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let plain = plain_router();
    let layered = layered_router();
    let keys = Arc::new(AtomicU64::new(0));
    let fresh_key = {
        let keys = Arc::clone(&keys);
        move || format!("k-{}", keys.fetch_add(1, Ordering::Relaxed))
    };

    // What each side answers, checked once before measuring.
    rt.block_on(async {
        let (status, replayed, _) = call(plain.clone(), post(None)).await;
        assert_eq!((status, replayed), (StatusCode::CREATED, false), "plain");
        let (status, replayed, _) = call(layered.clone(), post(Some(&fresh_key()))).await;
        assert_eq!((status, replayed), (StatusCode::CREATED, false), "fresh");
        let (status, replayed, _) = call(layered.clone(), post(Some("replayed-key"))).await;
        assert_eq!((status, replayed), (StatusCode::CREATED, false), "first");
        let (status, replayed, _) = call(layered.clone(), post(Some("replayed-key"))).await;
        assert_eq!((status, replayed), (StatusCode::CREATED, true), "replay");
        let (status, replayed, _) = call(layered.clone(), get_request()).await;
        assert_eq!((status, replayed), (StatusCode::OK, false), "passthrough");
    });

    let mut group = c.benchmark_group("http_layer");
    group.bench_function("plain", |b| {
        let app = plain.clone();
        on_worker(b, &rt, move || call(app.clone(), post(None)));
    });
    group.bench_function("layer_fresh", |b| {
        let (app, fresh_key) = (layered.clone(), fresh_key.clone());
        on_worker(b, &rt, move || call(app.clone(), post(Some(&fresh_key()))));
    });
    group.bench_function("layer_replay", |b| {
        let app = layered.clone();
        on_worker(b, &rt, move || {
            call(app.clone(), post(Some("replayed-key")))
        });
    });
    group.bench_function("plain_get", |b| {
        let app = plain.clone();
        on_worker(b, &rt, move || call(app.clone(), get_request()));
    });
    group.bench_function("layer_passthrough", |b| {
        let app = layered.clone();
        on_worker(b, &rt, move || call(app.clone(), get_request()));
    });

    // References, to read the layer's cost against: the engine's own replay on the same kind of
    // store (no HTTP, no task), and one task spawned and joined (the layer runs the engine on
    // a task of its own, C8).
    let idem = Idempotency::new(MemoryStore::new());
    let request = idem
        .request(CONSUMER, "POST", ROUTE)
        .key(Some("replayed-key"))
        .body(CHARGE_BODY.as_bytes())
        .build()
        .expect("a valid request");
    rt.block_on(async {
        match idem
            .begin(&request)
            .await
            .expect("the memory store answers")
        {
            Begin::Acquired(lease) => {
                idem.complete(lease, StoredResponse::new(201, "charged"))
                    .await
                    .expect("the lease is held");
            }
            Begin::Answered(answer) => panic!("a new key is acquired, not {answer:?}"),
        }
    });
    let engine = Arc::new((idem, request));
    group.bench_function("ref_engine_replay", |b| {
        let engine = Arc::clone(&engine);
        on_worker(b, &rt, move || {
            let engine = Arc::clone(&engine);
            async move {
                let (idem, request) = &*engine;
                match idem.begin(request).await {
                    Ok(Begin::Answered(Answer::Replay(response))) => response,
                    other => panic!("a replay, not {other:?}"),
                }
            }
        });
    });
    group.bench_function("ref_spawn_join", |b| {
        on_worker(b, &rt, || async {
            tokio::spawn(async { black_box(1u64) })
                .await
                .expect("the task completes")
        });
    });
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500))
}

criterion_group! {
    name = core;
    config = config();
    targets = bench_decide, bench_fingerprint, bench_codec, bench_http_layer
}
criterion_main!(core);
