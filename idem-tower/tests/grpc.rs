//! The gRPC layer (docs/grpc.md), one test per rule, over a service that speaks gRPC's wire
//! format (length-prefixed messages, `grpc-status` in trailers) the way tonic's routes do.
#![cfg(feature = "tonic")]

mod support;

use base64::engine::general_purpose::STANDARD_NO_PAD;
use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use idem_core::{Idempotency, MemoryStore, Policy, Store};
use idem_tower::{
    grpc_happened, grpc_nothing_happened, ConsumerError, GrpcIdempotencyLayer, GrpcMethod, Handled,
    Happened, NothingHappened, DEFAULT_GRPC_REFUSALS,
};
use prost::Message;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use support::Decorated;
use tokio::sync::Notify;
use tonic::Code;
use tower::{Layer, Service, ServiceExt};

const CREATE: &str = "/payments.v1.Charges/CreateCharge";
const KEY: &str = "0b3f4c1e-8d2a-4f5b-9c6d-7e8f9a0b1c2d";

type GrpcBody = tonic::body::Body;

/// A message in its gRPC frame: uncompressed, big-endian length.
fn frame(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// What the handler under test answers: a code (OK with a message echoing the request, or a
/// trailers-only error), and a marker.
#[derive(Clone, Copy)]
struct Script {
    code: Code,
    marker: Marker,
}

#[derive(Clone, Copy, PartialEq)]
enum Marker {
    None,
    Happened,
    NothingHappened,
    /// The error status marked with `grpc_happened`.
    StatusHappened,
    /// The error status marked with `grpc_nothing_happened`.
    StatusNothingHappened,
}

/// A gRPC handler that counts its executions, optionally waits for `gate`, and answers as
/// `script` says: OK with the request's message reversed, initial metadata `x-served-by`, and
/// trailers `grpc-status: 0` and `x-ledger-entry`; an error code trailers-only.
fn handler(
    calls: Arc<AtomicUsize>,
    gate: Option<Arc<Notify>>,
    script: Script,
) -> impl Service<
    Request<GrpcBody>,
    Response = Response<GrpcBody>,
    Error = Infallible,
    Future = impl Send + 'static,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |request: Request<GrpcBody>| {
        let calls = Arc::clone(&calls);
        let gate = gate.clone();
        async move {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            let body = request
                .into_body()
                .collect()
                .await
                .expect("the buffered request body")
                .to_bytes();
            if let Some(gate) = gate {
                gate.notified().await;
            }
            let mut response = if script.code == Code::Ok {
                let mut message: Vec<u8> = body.get(5..).unwrap_or_default().to_vec();
                message.reverse();
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", HeaderValue::from_static("0"));
                trailers.insert(
                    "x-ledger-entry",
                    HeaderValue::from_str(&format!("entry-{n}")).expect("ascii"),
                );
                let body = Full::new(Bytes::from(frame(&message)))
                    .with_trailers(async move { Some(Ok(trailers)) });
                let mut response = Response::new(GrpcBody::new(body));
                response
                    .headers_mut()
                    .insert("content-type", HeaderValue::from_static("application/grpc"));
                response
                    .headers_mut()
                    .insert("x-served-by", HeaderValue::from_static("node-1"));
                response
            } else {
                let status = tonic::Status::new(script.code, format!("answer {n}"));
                let status = match script.marker {
                    Marker::StatusHappened => grpc_happened(status),
                    Marker::StatusNothingHappened => grpc_nothing_happened(status),
                    _ => status,
                };
                status.into_http::<GrpcBody>()
            };
            match script.marker {
                Marker::None | Marker::StatusHappened | Marker::StatusNothingHappened => {}
                Marker::Happened => {
                    response.extensions_mut().insert(Happened);
                }
                Marker::NothingHappened => {
                    response.extensions_mut().insert(NothingHappened);
                }
            }
            Ok::<_, Infallible>(response)
        }
    })
}

fn ok() -> Script {
    Script {
        code: Code::Ok,
        marker: Marker::None,
    }
}

type Consumer = fn(&http::request::Parts) -> Result<String, ConsumerError>;

fn account(_: &http::request::Parts) -> Result<String, ConsumerError> {
    Ok("acct_1".to_owned())
}

fn layer<S: Store>(idem: Idempotency<S>) -> GrpcIdempotencyLayer<S, Consumer> {
    GrpcIdempotencyLayer::new(idem, account as Consumer).method(GrpcMethod::unary(CREATE))
}

/// A unary call to `path` with `body` (already framed) and the key in metadata.
fn call(path: &str, key: Option<&str>, body: Vec<u8>) -> Request<Full<Bytes>> {
    let mut builder = Request::post(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder
        .body(Full::new(Bytes::from(body)))
        .expect("a request")
}

/// An answer as received: head, body bytes, trailers.
#[derive(Debug)]
struct Received {
    head: HeaderMap,
    body: Bytes,
    trailers: HeaderMap,
    handled: Option<Handled>,
}

impl Received {
    /// The `grpc-status` from the trailers, or from the head of a trailers-only answer.
    fn code(&self) -> Code {
        let status = self
            .trailers
            .get("grpc-status")
            .or_else(|| self.head.get("grpc-status"))
            .expect("a grpc-status");
        Code::from_bytes(status.as_bytes())
    }

    fn entry(&self, name: &str) -> Option<&str> {
        self.trailers
            .get(name)
            .or_else(|| self.head.get(name))
            .and_then(|v| v.to_str().ok())
    }
}

async fn send<S>(service: &S, request: Request<Full<Bytes>>) -> Received
where
    S: Service<Request<Full<Bytes>>, Response = Response<GrpcBody>> + Clone,
    S::Error: std::fmt::Debug,
{
    let response = service
        .clone()
        .oneshot(request)
        .await
        .expect("the layer answers");
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.expect("the answer's body");
    let trailers = collected.trailers().cloned().unwrap_or_default();
    Received {
        head: parts.headers,
        body: collected.to_bytes(),
        trailers,
        handled: parts.extensions.get::<Handled>().cloned(),
    }
}

#[tokio::test]
async fn c07_a_replay_has_the_same_body_bytes_and_trailers_and_is_marked() {
    let calls = Arc::new(AtomicUsize::new(0));
    let idem = Idempotency::builder(MemoryStore::new())
        .policy(Policy::default().store_header("x-ledger-entry"))
        .build()
        .expect("a valid policy");
    let service = layer(idem).layer(handler(Arc::clone(&calls), None, ok()));
    let first = send(&service, call(CREATE, Some(KEY), frame(b"amount=2500"))).await;
    let replay = send(&service, call(CREATE, Some(KEY), frame(b"amount=2500"))).await;
    assert_eq!(first.code(), Code::Ok);
    assert_eq!(first.body, Bytes::from(frame(b"0052=tnuoma")));
    assert_eq!(replay.body, first.body, "byte for byte");
    assert_eq!(replay.trailers, first.trailers, "the same trailers");
    assert_eq!(replay.entry("x-ledger-entry"), Some("entry-1"));
    assert_eq!(replay.entry("idempotent-replayed"), Some("true"));
    assert_eq!(first.entry("idempotent-replayed"), None);
    assert_eq!(
        replay.entry("idempotency-key"),
        Some(KEY),
        "the key is echoed"
    );
    assert_eq!(replay.entry("content-type"), Some("application/grpc"));
    assert_eq!(
        replay.entry("x-served-by"),
        None,
        "initial metadata off the policy's allow-list is not stored"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        replay.handled.map(|h| h.disposition),
        Some(idem_core::EventKind::Replayed)
    );
}

#[tokio::test]
async fn c07_initial_metadata_on_the_allow_list_is_stored_and_replayed() {
    let calls = Arc::new(AtomicUsize::new(0));
    let idem = Idempotency::builder(MemoryStore::new())
        .policy(Policy::default().store_header("x-served-by"))
        .build()
        .expect("a valid policy");
    let service = layer(idem).layer(handler(Arc::clone(&calls), None, ok()));
    let first = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    let replay = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    assert_eq!(first.entry("x-served-by"), Some("node-1"));
    assert_eq!(replay.entry("x-served-by"), Some("node-1"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c01_a_missing_or_invalid_key_is_invalid_argument_and_nothing_runs() {
    let calls = Arc::new(AtomicUsize::new(0));
    let service =
        layer(Idempotency::new(MemoryStore::new())).layer(handler(Arc::clone(&calls), None, ok()));
    let missing = send(&service, call(CREATE, None, frame(b"m"))).await;
    assert_eq!(missing.code(), Code::InvalidArgument);
    assert!(missing
        .entry("grpc-message")
        .expect("a message")
        .contains("idempotency key"));
    for bad in ["a b", "k1, k2", "k;p=1", &"x".repeat(256)] {
        let invalid = send(&service, call(CREATE, Some(bad), frame(b"m"))).await;
        assert_eq!(invalid.code(), Code::InvalidArgument, "{bad:?}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// AIP-155's `CreateChargeRequest { int64 amount = 1; string request_id = 2; }`.
#[derive(Clone, PartialEq, Message)]
struct CreateChargeRequest {
    #[prost(int64, tag = "1")]
    amount: i64,
    #[prost(string, tag = "2")]
    request_id: String,
}

fn request_id(bytes: &[u8]) -> Option<String> {
    let request = CreateChargeRequest::decode(bytes).ok()?;
    (!request.request_id.is_empty()).then_some(request.request_id)
}

#[tokio::test]
async fn c01_the_key_can_come_from_a_field_of_the_message() {
    let calls = Arc::new(AtomicUsize::new(0));
    let service = GrpcIdempotencyLayer::new(Idempotency::new(MemoryStore::new()), account)
        .method(GrpcMethod::unary(CREATE).key_from_message(request_id))
        .layer(handler(Arc::clone(&calls), None, ok()));
    let message = |amount, id: &str| {
        frame(
            &CreateChargeRequest {
                amount,
                request_id: id.to_owned(),
            }
            .encode_to_vec(),
        )
    };
    let first = send(&service, call(CREATE, None, message(2500, "req-1"))).await;
    let again = send(&service, call(CREATE, None, message(2500, "req-1"))).await;
    assert_eq!((first.code(), again.code()), (Code::Ok, Code::Ok));
    assert_eq!(again.entry("idempotent-replayed"), Some("true"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let other = send(&service, call(CREATE, None, message(2500, "req-2"))).await;
    assert_eq!(other.entry("idempotent-replayed"), None);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let reused = send(&service, call(CREATE, None, message(9900, "req-1"))).await;
    assert_eq!(reused.code(), Code::FailedPrecondition);
    let without = send(&service, call(CREATE, None, message(2500, ""))).await;
    assert_eq!(
        without.code(),
        Code::InvalidArgument,
        "required, none given"
    );
    let invalid = send(&service, call(CREATE, None, message(2500, "has space"))).await;
    assert_eq!(
        invalid.code(),
        Code::InvalidArgument,
        "C1 holds for fields too"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn c01_an_optional_method_without_a_key_runs_unprotected() {
    let calls = Arc::new(AtomicUsize::new(0));
    let service = GrpcIdempotencyLayer::new(Idempotency::new(MemoryStore::new()), account)
        .method(
            GrpcMethod::unary(CREATE)
                .key_from_message(request_id)
                .optional(),
        )
        .layer(handler(Arc::clone(&calls), None, ok()));
    let bare = frame(
        &CreateChargeRequest {
            amount: 1,
            request_id: String::new(),
        }
        .encode_to_vec(),
    );
    let a = send(&service, call(CREATE, None, bare.clone())).await;
    let b = send(&service, call(CREATE, None, bare)).await;
    assert_eq!((a.code(), b.code()), (Code::Ok, Code::Ok));
    assert_eq!(b.entry("idempotent-replayed"), None);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn c03_a_key_reused_with_another_message_is_failed_precondition_and_nothing_runs() {
    let calls = Arc::new(AtomicUsize::new(0));
    let service =
        layer(Idempotency::new(MemoryStore::new())).layer(handler(Arc::clone(&calls), None, ok()));
    let first = send(&service, call(CREATE, Some(KEY), frame(b"amount=2500"))).await;
    let reused = send(&service, call(CREATE, Some(KEY), frame(b"amount=9900"))).await;
    assert_eq!(first.code(), Code::Ok);
    assert_eq!(reused.code(), Code::FailedPrecondition);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The stored record is untouched: the original message still replays.
    let replay = send(&service, call(CREATE, Some(KEY), frame(b"amount=2500"))).await;
    assert_eq!(replay.body, first.body);
}

/// The `google.rpc.RetryInfo` delay in a `grpc-status-details-bin` value, decoded with
/// messages written here from google/rpc/status.proto and error_details.proto.
fn retry_delay(details: &str) -> Duration {
    #[derive(Clone, PartialEq, Message)]
    struct RpcStatus {
        #[prost(int32, tag = "1")]
        code: i32,
        #[prost(message, repeated, tag = "3")]
        details: Vec<Any>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct Any {
        #[prost(string, tag = "1")]
        type_url: String,
        #[prost(bytes = "vec", tag = "2")]
        value: Vec<u8>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct RetryInfo {
        #[prost(message, optional, tag = "1")]
        retry_delay: Option<ProtoDuration>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct ProtoDuration {
        #[prost(int64, tag = "1")]
        seconds: i64,
        #[prost(int32, tag = "2")]
        nanos: i32,
    }
    let bytes = STANDARD_NO_PAD
        .decode(details.trim_end_matches('='))
        .expect("base64");
    let status = RpcStatus::decode(bytes.as_slice()).expect("a google.rpc.Status");
    let any = status
        .details
        .iter()
        .find(|a| a.type_url == "type.googleapis.com/google.rpc.RetryInfo")
        .expect("a RetryInfo");
    let delay = RetryInfo::decode(any.value.as_slice())
        .expect("RetryInfo")
        .retry_delay
        .expect("a delay");
    Duration::new(
        u64::try_from(delay.seconds).expect("positive"),
        u32::try_from(delay.nanos).expect("positive"),
    )
}

/// C5: gRPC's own retry policies (gRFC A6: grpc-core, grpc-java, grpc-go) ignore
/// `google.rpc.RetryInfo` and `retry-after`; the one delay they honour is the
/// `grpc-retry-pushback-ms` trailer. Without it a Python `grpcio` client whose policy retries
/// `ABORTED` spends all its attempts within its own backoff (0.1 s, 0.2 s...) while the first
/// call runs, and gives up with `ABORTED` although the server asked it to wait 1 s.
#[tokio::test]
async fn c05_a_duplicate_in_flight_carries_grpc_retry_pushback_ms() {
    let calls = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Notify::new());
    let service = layer(Idempotency::new(MemoryStore::new())).layer(handler(
        Arc::clone(&calls),
        Some(Arc::clone(&gate)),
        ok(),
    ));
    let first = tokio::spawn({
        let service = service.clone();
        async move { send(&service, call(CREATE, Some(KEY), frame(b"m"))).await }
    });
    while calls.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let duplicate = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    assert_eq!(duplicate.code(), Code::Aborted);
    let delay = retry_delay(
        duplicate
            .entry("grpc-status-details-bin")
            .expect("status details"),
    );
    let pushback = duplicate
        .entry("grpc-retry-pushback-ms")
        .and_then(|ms| ms.parse::<u64>().ok())
        .map(Duration::from_millis);
    assert_eq!(
        pushback,
        Some(Duration::from_millis(
            u64::try_from(delay.as_millis()).expect("ms")
        )),
        "the RetryInfo delay, in the form gRPC's retry policies read: {duplicate:?}"
    );
    gate.notify_one();
    assert_eq!(first.await.expect("the first call").code(), Code::Ok);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c05_a_duplicate_in_flight_is_aborted_at_once_with_a_retry_delay() {
    let calls = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Notify::new());
    let service = layer(Idempotency::new(MemoryStore::new())).layer(handler(
        Arc::clone(&calls),
        Some(Arc::clone(&gate)),
        ok(),
    ));
    let first = tokio::spawn({
        let service = service.clone();
        async move { send(&service, call(CREATE, Some(KEY), frame(b"m"))).await }
    });
    while calls.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let duplicate = tokio::time::timeout(
        Duration::from_secs(5),
        send(&service, call(CREATE, Some(KEY), frame(b"m"))),
    )
    .await
    .expect("answered at once, never waiting for the first call");
    assert_eq!(duplicate.code(), Code::Aborted);
    assert_eq!(duplicate.entry("retry-after"), Some("1"));
    let delay = retry_delay(
        duplicate
            .entry("grpc-status-details-bin")
            .expect("status details"),
    );
    assert!(
        delay > Duration::ZERO && delay <= Duration::from_secs(1),
        "{delay:?}"
    );
    gate.notify_one();
    let first = first.await.expect("the first call");
    assert_eq!(first.code(), Code::Ok);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c08_the_status_table_refusals_are_released_and_every_other_code_is_stored() {
    let all = [
        Code::Ok,
        Code::Cancelled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];
    for code in all {
        let calls = Arc::new(AtomicUsize::new(0));
        let script = Script {
            code,
            marker: Marker::None,
        };
        let service = layer(Idempotency::new(MemoryStore::new())).layer(handler(
            Arc::clone(&calls),
            None,
            script,
        ));
        let first = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
        let second = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
        assert_eq!((first.code(), second.code()), (code, code));
        let refused = DEFAULT_GRPC_REFUSALS.contains(&code);
        let runs = if refused { 2 } else { 1 };
        assert_eq!(calls.load(Ordering::SeqCst), runs, "{code:?}");
        assert_eq!(
            second.entry("idempotent-replayed").is_some(),
            !refused,
            "{code:?}"
        );
        if !refused {
            // Trailers-only answers replay trailers-only, message and all.
            assert_eq!(
                second.head,
                {
                    let mut head = first.head.clone();
                    head.insert("idempotent-replayed", HeaderValue::from_static("true"));
                    head.insert("idempotency-key", HeaderValue::from_static(KEY));
                    head
                },
                "{code:?}"
            );
            assert_eq!(second.trailers, first.trailers, "{code:?}");
        }
    }
}

#[tokio::test]
async fn c08_markers_override_the_table() {
    for (code, marker, runs) in [
        (Code::NotFound, Marker::Happened, 1),
        (Code::Ok, Marker::NothingHappened, 2),
        (Code::Internal, Marker::NothingHappened, 2),
        (Code::NotFound, Marker::StatusHappened, 1),
        (Code::Internal, Marker::StatusNothingHappened, 2),
        (Code::Unavailable, Marker::StatusNothingHappened, 2),
    ] {
        let calls = Arc::new(AtomicUsize::new(0));
        let service = layer(Idempotency::new(MemoryStore::new())).layer(handler(
            Arc::clone(&calls),
            None,
            Script { code, marker },
        ));
        send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
        send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
        assert_eq!(calls.load(Ordering::SeqCst), runs, "{code:?}");
    }
}

#[tokio::test]
async fn c08_the_refusal_table_is_configurable() {
    let calls = Arc::new(AtomicUsize::new(0));
    let script = Script {
        code: Code::NotFound,
        marker: Marker::None,
    };
    let service = layer(Idempotency::new(MemoryStore::new()))
        .refusals([Code::InvalidArgument])
        .layer(handler(Arc::clone(&calls), None, script));
    send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    let second = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    assert_eq!(second.code(), Code::NotFound);
    assert_eq!(second.entry("idempotent-replayed"), Some("true"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c08_a_call_dropped_while_it_runs_does_not_cancel_the_execution() {
    let calls = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Notify::new());
    let service = layer(Idempotency::new(MemoryStore::new())).layer(handler(
        Arc::clone(&calls),
        Some(Arc::clone(&gate)),
        ok(),
    ));
    let dropped = tokio::spawn({
        let service = service.clone();
        async move { send(&service, call(CREATE, Some(KEY), frame(b"m"))).await }
    });
    while calls.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The client's deadline passes: tonic drops the call's future.
    dropped.abort();
    assert!(dropped.await.expect_err("aborted").is_cancelled());
    gate.notify_one();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let retry = loop {
        let retry = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
        if retry.code() != Code::Aborted || tokio::time::Instant::now() > deadline {
            break retry;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(retry.code(), Code::Ok);
    assert_eq!(retry.entry("idempotent-replayed"), Some("true"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c12_a_message_over_the_limit_is_resource_exhausted_and_nothing_is_recorded() {
    let calls = Arc::new(AtomicUsize::new(0));
    let idem = Idempotency::builder(MemoryStore::new())
        .policy(Policy::default().max_body_bytes(16))
        .build()
        .expect("a valid policy");
    let service = layer(idem).layer(handler(Arc::clone(&calls), None, ok()));
    let big = send(&service, call(CREATE, Some(KEY), frame(&[7; 17]))).await;
    assert_eq!(big.code(), Code::ResourceExhausted);
    let message = big.entry("grpc-message").expect("a message");
    assert!(
        message.contains("of 16 bytes"),
        "the policy's limit on the message, not the frame's: {message}"
    );
    // A declared content-length over the limit: a gRPC answer, before anything is read.
    let mut declared = call(CREATE, Some(KEY), frame(&[7; 16]));
    declared
        .headers_mut()
        .insert("content-length", HeaderValue::from_static("100000"));
    let declared = send(&service, declared).await;
    assert_eq!(declared.code(), Code::ResourceExhausted);
    assert!(declared
        .entry("grpc-message")
        .is_some_and(|m| m.contains("of 16 bytes")));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let small = send(&service, call(CREATE, Some(KEY), frame(&[7; 16]))).await;
    assert_eq!(small.code(), Code::Ok);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c03_a_compressed_message_is_unimplemented_and_nothing_runs() {
    let calls = Arc::new(AtomicUsize::new(0));
    let service =
        layer(Idempotency::new(MemoryStore::new())).layer(handler(Arc::clone(&calls), None, ok()));
    let mut compressed = frame(b"gzip bytes");
    compressed[0] = 1;
    let answer = send(&service, call(CREATE, Some(KEY), compressed)).await;
    assert_eq!(answer.code(), Code::Unimplemented);
    assert_eq!(answer.entry("grpc-accept-encoding"), Some("identity"));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn c13_the_store_down_is_unavailable_and_the_handler_never_runs() {
    let calls = Arc::new(AtomicUsize::new(0));
    let down = Decorated::new(MemoryStore::new()).down();
    let service = layer(Idempotency::new(down)).layer(handler(Arc::clone(&calls), None, ok()));
    let answer = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    assert_eq!(answer.code(), Code::Unavailable);
    assert!(answer.entry("grpc-status-details-bin").is_some());
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn c02_no_consumer_is_unauthenticated_and_nothing_runs() {
    let calls = Arc::new(AtomicUsize::new(0));
    let service = GrpcIdempotencyLayer::new(
        Idempotency::new(MemoryStore::new()),
        |_: &http::request::Parts| Err::<String, _>(ConsumerError::unauthenticated()),
    )
    .method(GrpcMethod::unary(CREATE))
    .layer(handler(Arc::clone(&calls), None, ok()));
    let answer = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    assert_eq!(answer.code(), Code::Unauthenticated);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn streaming_a_listed_method_called_with_two_messages_is_invalid_argument_and_not_recorded() {
    let calls = Arc::new(AtomicUsize::new(0));
    let service =
        layer(Idempotency::new(MemoryStore::new())).layer(handler(Arc::clone(&calls), None, ok()));
    let mut two = frame(b"a");
    two.extend(frame(b"b"));
    let answer = send(&service, call(CREATE, Some(KEY), two)).await;
    assert_eq!(answer.code(), Code::InvalidArgument);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let one = send(&service, call(CREATE, Some(KEY), frame(b"a"))).await;
    assert_eq!(one.code(), Code::Ok, "nothing was recorded for the key");
}

/// A response body that sends one message, then never ends: a server stream.
struct Endless(Option<Bytes>);

impl Body for Endless {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.0.take() {
            Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
            None => Poll::Pending,
        }
    }
}

#[tokio::test]
async fn streaming_methods_not_listed_pass_through_untouched_even_with_a_key() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let stream = tower::service_fn(move |request: Request<GrpcBody>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move {
            assert!(request
                .extensions()
                .get::<idem_tower::Reservation<MemoryStore>>()
                .is_none());
            Ok::<_, Infallible>(Response::new(GrpcBody::new(Endless(Some(Bytes::from(
                frame(b"tick"),
            ))))))
        }
    });
    let service = layer(Idempotency::new(MemoryStore::new())).layer(stream);
    for _ in 0..2 {
        let response = service
            .clone()
            .oneshot(call(
                "/payments.v1.Charges/WatchCharges",
                Some(KEY),
                frame(b"w"),
            ))
            .await
            .expect("an answer");
        let mut body = response.into_body();
        // The first message arrives while the stream is still open: nothing was buffered.
        let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("streamed, not buffered")
            .expect("a frame")
            .expect("data");
        assert_eq!(
            first.into_data().expect("data"),
            Bytes::from(frame(b"tick"))
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// The engine's events by name.
#[derive(Default)]
struct Seen(std::sync::Mutex<std::collections::HashMap<&'static str, u64>>);

impl idem_core::Observer for Seen {
    fn observe(&self, event: &idem_core::Event<'_>) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(event.kind().name())
            .or_insert(0) += 1;
    }
}

impl Seen {
    fn counts(&self) -> std::collections::HashMap<&'static str, u64> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

fn observed(seen: &Arc<Seen>) -> Idempotency<MemoryStore> {
    Idempotency::builder(MemoryStore::new())
        .observer(Arc::clone(seen))
        .build()
        .expect("an engine")
}

#[tokio::test]
async fn c16_the_grpc_layer_emits_the_events_of_the_closure_style() {
    // Through the layer: executed, replayed, mismatch, a refusal released, in flight.
    let through_layer = Arc::new(Seen::default());
    let gate = Arc::new(Notify::new());
    let calls = Arc::new(AtomicUsize::new(0));
    let idem = observed(&through_layer);
    let service = layer(idem.clone()).layer(handler(Arc::clone(&calls), None, ok()));
    send(&service, call(CREATE, Some("k1"), frame(b"a"))).await;
    send(&service, call(CREATE, Some("k1"), frame(b"a"))).await;
    send(&service, call(CREATE, Some("k1"), frame(b"b"))).await;
    let refusing = layer(idem.clone()).layer(handler(
        Arc::clone(&calls),
        None,
        Script {
            code: Code::InvalidArgument,
            marker: Marker::None,
        },
    ));
    send(&refusing, call(CREATE, Some("k2"), frame(b"a"))).await;
    let slow = layer(idem).layer(handler(Arc::clone(&calls), Some(Arc::clone(&gate)), ok()));
    let first = tokio::spawn({
        let slow = slow.clone();
        async move { send(&slow, call(CREATE, Some("k3"), frame(b"a"))).await }
    });
    while calls.load(Ordering::SeqCst) < 3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        send(&slow, call(CREATE, Some("k3"), frame(b"a")))
            .await
            .code(),
        Code::Aborted
    );
    gate.notify_one();
    first.await.expect("the first call");

    // The same outcomes through `Idempotency::run`.
    let through_run = Arc::new(Seen::default());
    let idem = observed(&through_run);
    let request = |key: &'static str, body: &'static [u8]| {
        idem.request("acct_1", "POST", CREATE)
            .path(CREATE)
            .content_type("application/grpc")
            .body(body)
            .key(Some(key))
            .build()
            .expect("a request")
    };
    let executed = |_ctx| async {
        Ok::<_, idem_core::Failure<()>>(idem_core::Reply::Executed(idem_core::StoredResponse::new(
            200, "ok",
        )))
    };
    for (key, body) in [("k1", &b"a"[..]), ("k1", b"a"), ("k1", b"b")] {
        let _ = idem.run(&request(key, body), executed).await;
    }
    let _ = idem
        .run(&request("k2", b"a"), |_ctx| async {
            Ok::<_, idem_core::Failure<()>>(idem_core::Reply::Refused(
                idem_core::StoredResponse::new(400, "no"),
            ))
        })
        .await;
    let gate = Arc::new(Notify::new());
    let started = Arc::new(Notify::new());
    let first = tokio::spawn({
        let (idem, gate, started, k3) = (
            idem.clone(),
            Arc::clone(&gate),
            Arc::clone(&started),
            request("k3", b"a"),
        );
        async move {
            let _ = idem
                .run(&k3, move |_ctx| async move {
                    started.notify_one();
                    gate.notified().await;
                    Ok::<_, idem_core::Failure<()>>(idem_core::Reply::Executed(
                        idem_core::StoredResponse::new(200, "ok"),
                    ))
                })
                .await;
        }
    });
    started.notified().await;
    let outcome = idem
        .run(&request("k3", b"a"), |_ctx| async {
            Ok::<_, idem_core::Failure<()>>(idem_core::Reply::Executed(
                idem_core::StoredResponse::new(200, "second run"),
            ))
        })
        .await;
    let in_flight = matches!(
        outcome,
        Ok(idem_core::Outcome::Answered(
            idem_core::Answer::InFlight { .. }
        ))
    );
    assert!(in_flight, "the duplicate met the first run in flight");
    gate.notify_one();
    first.await.expect("the first run");

    assert_eq!(through_layer.counts(), through_run.counts());
    for name in ["executed", "replayed", "mismatch", "released", "in_flight"] {
        assert!(
            through_layer.counts().get(name).copied().unwrap_or(0) >= 1,
            "{name}: {:?}",
            through_layer.counts()
        );
    }
}

#[tokio::test]
async fn c08_a_failing_service_is_an_outcome_unknown_stored_as_internal() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let failing = tower::service_fn(move |_request: Request<GrpcBody>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Err::<Response<GrpcBody>, _>("the upstream timed out") }
    });
    let service = layer(Idempotency::new(MemoryStore::new())).layer(failing);
    let first = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    let again = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    assert_eq!(
        (first.code(), again.code()),
        (Code::Internal, Code::Internal)
    );
    assert_eq!(again.entry("idempotent-replayed"), Some("true"));
    assert_eq!(calls.load(Ordering::SeqCst), 1, "never re-run blind");
}

/// C7, C8: a handler that panics may have run its effect: the key keeps a gRPC `INTERNAL`
/// outcome unknown, sent to the caller and replayed to the retry (marked), never an
/// undecodable record nor a second run.
#[tokio::test]
async fn c08_a_panicking_handler_is_an_outcome_unknown_stored_as_internal_and_replayed() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let panicking = tower::service_fn(move |_request: Request<GrpcBody>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async {
            if true {
                panic!("the handler panicked after its effect");
            }
            Ok::<Response<GrpcBody>, Infallible>(Response::new(GrpcBody::empty()))
        }
    });
    let service = layer(Idempotency::new(MemoryStore::new())).layer(panicking);
    let first = tokio::spawn({
        let service = service.clone();
        async move { send(&service, call(CREATE, Some(KEY), frame(b"m"))).await }
    })
    .await;
    let again = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "never re-run blind");
    assert_eq!(again.code(), Code::Internal);
    assert_eq!(
        again.entry("idempotent-replayed"),
        Some("true"),
        "the stored answer, replayed: {again:?}"
    );
    let unknown = idem_tower::render::Problem::OUTCOME_UNKNOWN;
    // Printable ASCII: its gRPC percent-encoding is itself.
    assert_eq!(again.entry("grpc-message"), Some(unknown), "{again:?}");
    let first = first.expect("the caller gets an answer, not a reset stream");
    assert_eq!(
        (first.code(), first.entry("grpc-message")),
        (again.code(), again.entry("grpc-message")),
        "the caller and the retry see one answer"
    );
}

#[tokio::test]
async fn c08_an_answer_too_large_to_store_becomes_a_stored_internal() {
    let calls = Arc::new(AtomicUsize::new(0));
    let service = layer(Idempotency::new(MemoryStore::new()))
        .max_response_bytes(8)
        .layer(handler(Arc::clone(&calls), None, ok()));
    let first = send(
        &service,
        call(CREATE, Some(KEY), frame(b"a long enough message")),
    )
    .await;
    let again = send(
        &service,
        call(CREATE, Some(KEY), frame(b"a long enough message")),
    )
    .await;
    assert_eq!(
        (first.code(), again.code()),
        (Code::Internal, Code::Internal)
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "its effect ran: never a second run"
    );
}

/// C12: the limit on a stored answer counts its metadata and trailers, not only its messages:
/// an error status whose details are over `max_response_bytes` becomes the stored `INTERNAL`
/// an oversized message becomes, never a record of any size.
#[tokio::test]
async fn c12_status_details_over_the_response_limit_become_a_stored_internal() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let detailed = tower::service_fn(move |_request: Request<GrpcBody>| {
        counted.fetch_add(1, Ordering::SeqCst);
        let details = Bytes::from(vec![b'd'; 64 * 1024]);
        let status = tonic::Status::with_details(Code::Aborted, "declined", details);
        async move { Ok::<_, Infallible>(status.into_http::<GrpcBody>()) }
    });
    let service = layer(Idempotency::new(MemoryStore::new()))
        .max_response_bytes(1024)
        .layer(detailed);
    let first = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    let again = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    assert_eq!(
        (first.code(), again.code()),
        (Code::Internal, Code::Internal),
        "{:?}",
        first.entry("grpc-message")
    );
    assert!(first.entry("grpc-status-details-bin").is_none());
    assert_eq!(calls.load(Ordering::SeqCst), 1, "its effect ran: once");
}

/// C8: a handler's refusal (trailers-only `INVALID_ARGUMENT`, nothing happened) is sent and
/// its key released whatever the size of its status: the limit is on what is stored, and a
/// refusal stores nothing. Rich error details over `max_response_bytes` never burn the key
/// with a stored `INTERNAL` that the corrected retry would be answered.
#[tokio::test]
async fn c08_a_refusal_with_details_over_the_response_limit_is_sent_and_released() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let refusing = tower::service_fn(move |_request: Request<GrpcBody>| {
        counted.fetch_add(1, Ordering::SeqCst);
        let details = Bytes::from(vec![b'd'; 4 * 1024]);
        let status = tonic::Status::with_details(Code::InvalidArgument, "bad field", details);
        async move { Ok::<_, Infallible>(status.into_http::<GrpcBody>()) }
    });
    let service = layer(Idempotency::new(MemoryStore::new()))
        .max_response_bytes(1024)
        .layer(refusing);
    let first = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    let again = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    assert_eq!(
        (first.code(), again.code()),
        (Code::InvalidArgument, Code::InvalidArgument),
        "the handler's refusal, as it sent it: {:?}",
        first.entry("grpc-message")
    );
    assert!(again.entry("idempotent-replayed").is_none(), "{again:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 2, "released: the retry runs");
}

/// C7, C12: the limit counts what is stored. Initial metadata the policy never stores (a
/// large debugging header) is sent, not stored, and never turns the handler's `OK` into a
/// stored `INTERNAL`.
#[tokio::test]
async fn c12_metadata_that_is_not_stored_does_not_count_against_the_limit() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let verbose = tower::service_fn(move |_request: Request<GrpcBody>| {
        counted.fetch_add(1, Ordering::SeqCst);
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let body =
            Full::new(Bytes::from(frame(b"ok"))).with_trailers(async move { Some(Ok(trailers)) });
        let mut response = Response::new(GrpcBody::new(body));
        let headers = response.headers_mut();
        headers.insert("content-type", HeaderValue::from_static("application/grpc"));
        let debug = HeaderValue::from_str(&"d".repeat(4 * 1024)).expect("a value");
        headers.insert("x-debug", debug);
        async move { Ok::<_, Infallible>(response) }
    });
    let service = layer(Idempotency::new(MemoryStore::new()))
        .max_response_bytes(1024)
        .layer(verbose);
    let first = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    let again = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    assert_eq!(
        (first.code(), again.code()),
        (Code::Ok, Code::Ok),
        "{:?}",
        first.entry("grpc-message")
    );
    assert_eq!(again.entry("idempotent-replayed"), Some("true"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c12_a_stored_answer_that_is_not_a_grpc_one_is_internal_and_nothing_runs() {
    let calls = Arc::new(AtomicUsize::new(0));
    let idem = Idempotency::new(MemoryStore::new());
    // The same record completed with an HTTP response (another program on the same scope).
    let request = idem
        .request("acct_1", "POST", CREATE)
        .path(CREATE)
        .content_type("application/grpc")
        .body(b"m")
        .key(Some(KEY))
        .build()
        .expect("a request");
    let completed = idem
        .run(&request, |_ctx| async {
            Ok::<_, idem_core::Failure<()>>(idem_core::Reply::Executed(
                idem_core::StoredResponse::new(201, r#"{"id":"ch_1"}"#),
            ))
        })
        .await
        .expect("completed");
    assert!(matches!(completed, idem_core::Outcome::Executed(_)));
    let service = layer(idem).layer(handler(Arc::clone(&calls), None, ok()));
    let answer = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    assert_eq!(answer.code(), Code::Internal);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// A layer whose `CREATE` method declares its message type (`CreateChargeRequest`).
fn typed_layer<S: Store>(idem: Idempotency<S>) -> GrpcIdempotencyLayer<S, Consumer> {
    GrpcIdempotencyLayer::new(idem, account as Consumer)
        .method(GrpcMethod::unary(CREATE).message::<CreateChargeRequest>())
}

fn charge(amount: i64, id: &str) -> Vec<u8> {
    frame(
        &CreateChargeRequest {
            amount,
            request_id: id.to_owned(),
        }
        .encode_to_vec(),
    )
}

#[tokio::test]
async fn c08_a_message_that_does_not_decode_is_invalid_argument_and_the_corrected_retry_runs() {
    let calls = Arc::new(AtomicUsize::new(0));
    let service = typed_layer(Idempotency::new(MemoryStore::new())).layer(handler(
        Arc::clone(&calls),
        None,
        ok(),
    ));
    // A field header with wire type 7 (none): not a protobuf message.
    let malformed = send(&service, call(CREATE, Some("kbad"), frame(b"\xff\xff\xff"))).await;
    assert_eq!(malformed.code(), Code::InvalidArgument);
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the handler never ran");
    let corrected = send(&service, call(CREATE, Some("kbad"), charge(2500, ""))).await;
    assert_eq!(
        corrected.code(),
        Code::Ok,
        "nothing was recorded for the key"
    );
    assert_eq!(corrected.entry("idempotent-replayed"), None);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c08_a_validator_refusal_is_sent_as_it_is_and_nothing_is_recorded() {
    let calls = Arc::new(AtomicUsize::new(0));
    let service = GrpcIdempotencyLayer::new(Idempotency::new(MemoryStore::new()), account)
        .method(GrpcMethod::unary(CREATE).validate(|bytes| {
            if bytes == b"bad" {
                Err(tonic::Status::out_of_range("no"))
            } else {
                Ok(())
            }
        }))
        .layer(handler(Arc::clone(&calls), None, ok()));
    let refused = send(&service, call(CREATE, Some(KEY), frame(b"bad"))).await;
    assert_eq!(refused.code(), Code::OutOfRange);
    assert_eq!(refused.entry("grpc-message"), Some("no"));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let good = send(&service, call(CREATE, Some(KEY), frame(b"good"))).await;
    assert_eq!(good.code(), Code::Ok, "the key was not burnt");
}

#[tokio::test]
async fn c01_a_field_and_a_metadata_entry_that_disagree_are_invalid_argument() {
    let calls = Arc::new(AtomicUsize::new(0));
    let service = GrpcIdempotencyLayer::new(Idempotency::new(MemoryStore::new()), account)
        .method(GrpcMethod::unary(CREATE).key_from_message(request_id))
        .layer(handler(Arc::clone(&calls), None, ok()));
    let both = send(&service, call(CREATE, Some("req-2"), charge(2500, "req-1"))).await;
    assert_eq!(both.code(), Code::InvalidArgument);
    assert!(both
        .entry("grpc-message")
        .is_some_and(|m| m.contains("two different idempotency keys")));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // Nothing was recorded under either key.
    let equal = send(&service, call(CREATE, Some("req-1"), charge(2500, "req-1"))).await;
    assert_eq!(equal.code(), Code::Ok, "equal keys are one key");
    let field_only = send(&service, call(CREATE, None, charge(2500, "req-1"))).await;
    assert_eq!(field_only.entry("idempotent-replayed"), Some("true"));
    let other = send(&service, call(CREATE, Some("req-2"), charge(2500, ""))).await;
    assert_eq!(other.entry("idempotent-replayed"), None, "req-2 is fresh");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A response body that sends a message on every poll and never ends: a server stream.
struct Streaming(Arc<AtomicUsize>);

impl Body for Streaming {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(frame(b"tick"))))))
    }
}

/// The body tonic 0.14 sends when the handler's answer fails to encode (over
/// `max_encoding_message_size`): the error status in a trailers frame, then, if polled on, the
/// unsent bytes of the message it could not finish (a frame whose length was never written).
#[derive(Default)]
struct FailedEncoding {
    polls: usize,
}

impl Body for FailedEncoding {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.polls += 1;
        Poll::Ready(match self.polls {
            1 => {
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", HeaderValue::from_static("11"));
                trailers.insert("grpc-message", HeaderValue::from_static("too%20large"));
                Some(Ok(Frame::trailers(trailers)))
            }
            2 => Some(Ok(Frame::data(Bytes::from_static(b"\0\0\0\0\0leftover")))),
            _ => None,
        })
    }
}

/// C8: a handler that returned its answer (an `OK` head) has run: a refusal code that comes
/// after it, in the trailers (tonic's `OUT_OF_RANGE` for an answer it could not encode), is
/// stored and replayed like any answer, never a release that runs the effect again. The
/// answer ends at its trailers: nothing polled after them is read as a message.
#[tokio::test]
async fn c08_a_refusal_code_in_the_trailers_after_the_handler_answered_is_stored() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let encoder_failed = tower::service_fn(move |_request: Request<GrpcBody>| {
        counted.fetch_add(1, Ordering::SeqCst);
        let mut response = Response::new(GrpcBody::new(FailedEncoding::default()));
        response
            .headers_mut()
            .insert("content-type", HeaderValue::from_static("application/grpc"));
        async move { Ok::<_, Infallible>(response) }
    });
    let service = layer(Idempotency::new(MemoryStore::new())).layer(encoder_failed);
    let first = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    let again = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the effect ran: once");
    assert_eq!(
        (first.code(), first.entry("grpc-message")),
        (Code::OutOfRange, Some("too%20large")),
        "the status tonic sent, not a second message read after the trailers: {first:?}"
    );
    assert_eq!(
        (again.code(), again.entry("idempotent-replayed")),
        (Code::OutOfRange, Some("true"))
    );
    assert!(first.body.is_empty() && again.body.is_empty());
}

#[tokio::test]
async fn c08_a_server_stream_listed_as_unary_stops_at_its_second_message_and_stores_internal() {
    let calls = Arc::new(AtomicUsize::new(0));
    let polled = Arc::new(AtomicUsize::new(0));
    let (counted, sent) = (Arc::clone(&calls), Arc::clone(&polled));
    let stream = tower::service_fn(move |_request: Request<GrpcBody>| {
        counted.fetch_add(1, Ordering::SeqCst);
        let mut response = Response::new(GrpcBody::new(Streaming(Arc::clone(&sent))));
        response
            .headers_mut()
            .insert("content-type", HeaderValue::from_static("application/grpc"));
        async move { Ok::<_, Infallible>(response) }
    });
    let service = layer(Idempotency::new(MemoryStore::new())).layer(stream);
    let first = tokio::time::timeout(
        Duration::from_secs(10),
        send(&service, call(CREATE, Some(KEY), frame(b"m"))),
    )
    .await
    .expect("the stream is not read forever");
    assert_eq!(first.code(), Code::Internal);
    assert!(first
        .entry("grpc-message")
        .is_some_and(|m| m.contains("not a unary answer")));
    assert_eq!(
        polled.load(Ordering::SeqCst),
        2,
        "read up to its second message"
    );
    let again = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    assert_eq!(again.code(), Code::Internal);
    assert_eq!(again.entry("idempotent-replayed"), Some("true"));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "it ran: stored, never re-run"
    );
}

/// A handler whose answer is `status` (trailers-only), with trailing metadata `x-ledger-entry`.
fn aborting(
    calls: Arc<AtomicUsize>,
) -> impl Service<
    Request<GrpcBody>,
    Response = Response<GrpcBody>,
    Error = Infallible,
    Future = impl Send + 'static,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |_request: Request<GrpcBody>| {
        calls.fetch_add(1, Ordering::SeqCst);
        let mut status = tonic::Status::new(Code::Aborted, "the ledger moved on");
        status
            .metadata_mut()
            .insert("x-ledger-entry", "entry-1".parse().expect("ascii"));
        async move { Ok::<_, Infallible>(status.into_http::<GrpcBody>()) }
    })
}

#[tokio::test]
async fn c07_trailers_follow_the_allow_list_in_both_forms_and_the_status_always_travels() {
    for allowed in [false, true] {
        let policy = if allowed {
            Policy::default().store_header("x-ledger-entry")
        } else {
            Policy::default()
        };
        let idem = || {
            Idempotency::builder(MemoryStore::new())
                .policy(policy.clone())
                .build()
                .expect("a valid policy")
        };
        let calls = Arc::new(AtomicUsize::new(0));
        let normal = layer(idem()).layer(handler(Arc::clone(&calls), None, ok()));
        let only = layer(idem()).layer(aborting(Arc::clone(&calls)));
        for service_answer in [
            send(&normal, call(CREATE, Some(KEY), frame(b"m"))).await,
            send(&normal, call(CREATE, Some(KEY), frame(b"m"))).await,
            send(&only, call(CREATE, Some(KEY), frame(b"m"))).await,
            send(&only, call(CREATE, Some(KEY), frame(b"m"))).await,
        ] {
            assert!(service_answer.entry("grpc-status").is_some());
            assert_eq!(
                service_answer.entry("x-ledger-entry").is_some(),
                allowed,
                "allowed: {allowed}"
            );
        }
        let replay = send(&only, call(CREATE, Some(KEY), frame(b"m"))).await;
        assert_eq!(replay.code(), Code::Aborted);
        assert!(replay
            .entry("grpc-message")
            .is_some_and(|m| m.contains("ledger")));
        assert_eq!(replay.entry("idempotent-replayed"), Some("true"));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}

#[tokio::test]
async fn c07_a_replayed_answer_declares_no_exact_length_before_its_trailers() {
    let calls = Arc::new(AtomicUsize::new(0));
    let service =
        layer(Idempotency::new(MemoryStore::new())).layer(handler(Arc::clone(&calls), None, ok()));
    let _ = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    let replay = service
        .clone()
        .oneshot(call(CREATE, Some(KEY), frame(b"m")))
        .await
        .expect("the layer answers");
    assert!(replay.headers().get("content-length").is_none());
    assert_eq!(
        replay.body().size_hint().exact(),
        None,
        "hyper would send content-length"
    );
}

/// A request body that never ends.
struct Never;

impl Body for Never {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Pending
    }
}

#[tokio::test]
async fn c01_a_required_metadata_key_is_checked_before_the_body_is_read() {
    let calls = Arc::new(AtomicUsize::new(0));
    let service =
        layer(Idempotency::new(MemoryStore::new())).layer(handler(Arc::clone(&calls), None, ok()));
    let request = Request::post(format!("http://localhost{CREATE}"))
        .header("content-type", "application/grpc")
        .body(Never)
        .expect("a request");
    let answer = tokio::time::timeout(Duration::from_secs(5), service.clone().oneshot(request))
        .await
        .expect("answered without reading the body")
        .expect("the layer answers");
    let code = answer
        .headers()
        .get("grpc-status")
        .map(|v| Code::from_bytes(v.as_bytes()));
    assert_eq!(code, Some(Code::InvalidArgument));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn c07_the_handler_is_not_offered_compression_so_every_client_reads_the_stored_answer() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let recorded = Arc::clone(&seen);
    let inner = tower::service_fn(move |request: Request<GrpcBody>| {
        recorded
            .lock()
            .expect("not poisoned")
            .push(request.headers().get("grpc-accept-encoding").cloned());
        async { Ok::<_, Infallible>(tonic::Status::ok("").into_http::<GrpcBody>()) }
    });
    let service = layer(Idempotency::new(MemoryStore::new())).layer(inner);
    let mut request = call(CREATE, Some(KEY), frame(b"m"));
    request
        .headers_mut()
        .insert("grpc-accept-encoding", HeaderValue::from_static("gzip"));
    let answer = send(&service, request).await;
    assert_eq!(answer.code(), Code::Ok);
    assert_eq!(*seen.lock().expect("not poisoned"), vec![None]);
}

#[tokio::test]
async fn c03_only_grpc_protobuf_content_types_are_protected_others_refused_unrun() {
    let calls = Arc::new(AtomicUsize::new(0));
    let service =
        layer(Idempotency::new(MemoryStore::new())).layer(handler(Arc::clone(&calls), None, ok()));
    for content_type in [
        "application/json",
        "application/grpc-web",
        "application/grpc-web+proto",
        "application/grpc+json",
        "text/plain",
    ] {
        let mut request = call(CREATE, Some(KEY), frame(b"m"));
        request
            .headers_mut()
            .insert("content-type", HeaderValue::from_static(content_type));
        let answer = send(&service, request).await;
        assert_eq!(answer.code(), Code::InvalidArgument, "{content_type}");
    }
    let mut missing = call(CREATE, Some(KEY), frame(b"m"));
    missing.headers_mut().remove("content-type");
    assert_eq!(send(&service, missing).await.code(), Code::InvalidArgument);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let mut proto = call(CREATE, Some(KEY), frame(b"m"));
    proto.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("application/grpc+proto"),
    );
    assert_eq!(send(&service, proto).await.code(), Code::Ok);
    let plain = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    assert_eq!(
        plain.entry("idempotent-replayed"),
        Some("true"),
        "+proto is the same call"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A response body that sends one message and then waits forever, and says when it is dropped.
struct Stalled {
    message: Option<Bytes>,
    dropped: Arc<AtomicUsize>,
}

impl Body for Stalled {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.message.take() {
            Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
            None => Poll::Pending,
        }
    }
}

impl Drop for Stalled {
    fn drop(&mut self) {
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn c08_an_answer_that_never_ends_is_an_outcome_unknown_at_the_answer_timeout() {
    let calls = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicUsize::new(0));
    let (counted, gone) = (Arc::clone(&calls), Arc::clone(&dropped));
    let stalled = tower::service_fn(move |_request: Request<GrpcBody>| {
        counted.fetch_add(1, Ordering::SeqCst);
        let body = Stalled {
            message: Some(Bytes::from(frame(b"first"))),
            dropped: Arc::clone(&gone),
        };
        let mut response = Response::new(GrpcBody::new(body));
        response
            .headers_mut()
            .insert("content-type", HeaderValue::from_static("application/grpc"));
        async move { Ok::<_, Infallible>(response) }
    });
    let service = layer(Idempotency::new(MemoryStore::new()))
        .answer_timeout(Duration::from_millis(200))
        .layer(stalled);
    let first = tokio::time::timeout(
        Duration::from_secs(10),
        send(&service, call(CREATE, Some(KEY), frame(b"m"))),
    )
    .await
    .expect("the execution ends at the answer timeout");
    assert_eq!(first.code(), Code::Internal);
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "the stream is let go");
    let again = send(&service, call(CREATE, Some(KEY), frame(b"m"))).await;
    assert_eq!(again.code(), Code::Internal, "stored: the handler ran");
    assert_eq!(again.entry("idempotent-replayed"), Some("true"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
