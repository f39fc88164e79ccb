//! The gRPC layer as third-party clients hit it: an in-process tonic server whose handler
//! misbehaves on demand (panics, error statuses with details, slow answers), behind the
//! example's layer, called by tonic clients over real HTTP/2 connections.

use bytes::Bytes;
use http_body_util::BodyExt;
use idem::sqlite::rusqlite;
use idem::sqlite::SqliteStore;
use idem::{Idempotency, MemoryStore, Policy};
use idem_tower::{GrpcIdempotencyLayer, GrpcMethod};
use payments_grpc::app::{account, layer, Consumer, CREATE_CHARGE};
use payments_grpc::proto::charges_client::ChargesClient;
use payments_grpc::proto::charges_server::{Charges, ChargesServer};
use payments_grpc::proto::{Charge, CreateChargeRequest, GetChargeRequest};
use prost::Message;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Response, Status};
use tower::ServiceExt;

const ACCOUNT: &str = "acct_hostile";

/// A handler that counts its runs and does what the `x-mode` metadata entry says (metadata is
/// not fingerprinted: a retry may ask for another behaviour under the same key).
#[derive(Clone, Default)]
struct Fake {
    calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl Charges for Fake {
    async fn create_charge(
        &self,
        request: Request<CreateChargeRequest>,
    ) -> Result<Response<Charge>, Status> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let mode = request
            .metadata()
            .get("x-mode")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("ok")
            .to_owned();
        if let Some(ms) = mode.strip_prefix("sleep-") {
            tokio::time::sleep(Duration::from_millis(ms.parse().expect("ms"))).await;
        }
        match mode.as_str() {
            "panic" => panic!("the handler panicked"),
            "status" => {
                let mut metadata = tonic::metadata::MetadataMap::new();
                metadata.insert("x-declined-by", "issuer".parse().expect("ascii"));
                Err(Status::with_details_and_metadata(
                    Code::Aborted,
                    format!("declined, attempt {n}: ü"),
                    Bytes::from_static(b"\x08\x0a\x12\x03abc"),
                    metadata,
                ))
            }
            _ => {
                let new = request.into_inner();
                let mut response = Response::new(Charge {
                    id: format!("ch_{n}"),
                    amount: new.amount,
                    currency: new.currency,
                    description: new.description,
                    created: 0,
                });
                let metadata = response.metadata_mut();
                metadata.insert("x-served-by", format!("node-{n}").parse().expect("ascii"));
                metadata.insert("set-cookie", "s=1".parse().expect("ascii"));
                Ok(response)
            }
        }
    }

    async fn get_charge(
        &self,
        _request: Request<GetChargeRequest>,
    ) -> Result<Response<Charge>, Status> {
        Err(Status::not_found("none"))
    }
}

struct Harness {
    addr: SocketAddr,
    fake: Fake,
}

impl Harness {
    async fn start(policy: Policy) -> Self {
        Self::start_with(policy, usize::MAX).await
    }

    /// A server that encodes answers of at most `max_answer` bytes (tonic's
    /// `max_encoding_message_size`).
    async fn start_with(policy: Policy, max_answer: usize) -> Self {
        Self::serve(policy, max_answer, layer).await
    }

    /// A server behind the layer `make` builds.
    async fn serve(
        policy: Policy,
        max_answer: usize,
        make: fn(Idempotency<MemoryStore>) -> GrpcIdempotencyLayer<MemoryStore, Consumer>,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let addr = listener.local_addr().expect("an address");
        let fake = Fake::default();
        let idem = Idempotency::with_policy(MemoryStore::new(), policy).expect("a policy");
        let service = ChargesServer::new(fake.clone()).max_encoding_message_size(max_answer);
        tokio::spawn(async move {
            Server::builder()
                .layer(make(idem))
                .add_service(service)
                .serve_with_incoming(TcpIncoming::from(listener))
                .await
                .expect("serves");
        });
        Self { addr, fake }
    }

    /// A new HTTP/2 connection.
    async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .expect("a URL")
            .connect()
            .await
            .expect("connects")
    }

    async fn client(&self) -> ChargesClient<Channel> {
        ChargesClient::new(self.channel().await)
    }

    fn calls(&self) -> usize {
        self.fake.calls.load(Ordering::SeqCst)
    }
}

fn message(amount: i64) -> CreateChargeRequest {
    CreateChargeRequest {
        amount,
        currency: "usd".into(),
        description: "tea".into(),
        request_id: String::new(),
    }
}

fn create(amount: i64, key: &str, mode: &str) -> Request<CreateChargeRequest> {
    let mut request = Request::new(message(amount));
    let metadata = request.metadata_mut();
    metadata.insert("x-account", ACCOUNT.parse().expect("ascii"));
    metadata.insert("idempotency-key", key.parse().expect("ascii"));
    metadata.insert("x-mode", mode.parse().expect("ascii"));
    request
}

fn key() -> String {
    format!("key-{:016x}", rand_u64())
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    );
    h.finish()
}

/// An answer read off the wire.
#[derive(Debug)]
struct Raw {
    head: http::HeaderMap,
    body: Bytes,
    trailers: http::HeaderMap,
}

impl Raw {
    fn entry(&self, name: &str) -> Option<&[u8]> {
        self.trailers
            .get(name)
            .or_else(|| self.head.get(name))
            .map(|v| v.as_bytes())
    }

    fn code(&self) -> Code {
        Code::from_bytes(self.entry("grpc-status").expect("a grpc-status"))
    }
}

fn framed(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// `CreateCharge` with `body` exactly, and `headers` added.
async fn raw(channel: &Channel, body: Vec<u8>, headers: &[(&str, &[u8])]) -> Raw {
    let mut request = http::Request::post(format!("http://localhost{CREATE_CHARGE}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("x-account", ACCOUNT);
    for (name, value) in headers {
        request = request.header(
            *name,
            http::HeaderValue::from_bytes(value).expect("a value"),
        );
    }
    let request = request
        .body(tonic::body::Body::new(http_body_util::Full::new(
            Bytes::from(body),
        )))
        .expect("a request");
    let response = channel
        .clone()
        .oneshot(request)
        .await
        .expect("an HTTP/2 answer");
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.expect("the body");
    Raw {
        head: parts.headers,
        trailers: collected.trailers().cloned().unwrap_or_default(),
        body: collected.to_bytes(),
    }
}

fn quick() -> Policy {
    Policy::default()
}

/// C8: a handler that panics after its effect may have run keeps the key; the retry is answered
/// the stored outcome unknown, a decodable gRPC `INTERNAL`, never a second run.
#[tokio::test]
async fn c08_a_panicking_handler_is_a_stored_internal_replayed_as_the_outcome_unknown() {
    let server = Harness::start(quick()).await;
    let mut client = server.client().await;
    let key = key();
    let first = client
        .create_charge(create(100, &key, "panic"))
        .await
        .expect_err("the handler panicked");
    let again = client
        .create_charge(create(100, &key, "ok"))
        .await
        .expect_err("the outcome unknown, replayed");
    assert_eq!(server.calls(), 1, "never re-run blind");
    assert_eq!(again.code(), Code::Internal, "{again:?}");
    assert_eq!(
        again
            .metadata()
            .get("idempotent-replayed")
            .map(|v| v.as_bytes()),
        Some(&b"true"[..]),
        "a replay of the stored answer: {again:?}"
    );
    assert!(
        !again.message().to_ascii_lowercase().contains("corrupt")
            && !again.message().to_ascii_lowercase().contains("not idem"),
        "the stored answer is the outcome unknown, not an undecodable record: {again:?}"
    );
    assert_eq!(
        (first.code(), first.message()),
        (again.code(), again.message()),
        "the caller sees the answer its retry sees, not a reset stream"
    );
}

/// C7: an error status with details and custom metadata is replayed byte for byte.
#[tokio::test]
async fn c07_an_error_status_with_details_is_replayed_byte_for_byte() {
    let server = Harness::start(quick()).await;
    let channel = server.channel().await;
    let key = key();
    let body = framed(&message(7).encode_to_vec());
    let headers: [(&str, &[u8]); 2] = [("idempotency-key", key.as_bytes()), ("x-mode", b"status")];
    let first = raw(&channel, body.clone(), &headers).await;
    let other = server.channel().await;
    let replay = raw(&other, body, &headers).await;
    assert_eq!(server.calls(), 1);
    assert_eq!(first.code(), Code::Aborted);
    for name in ["grpc-status", "grpc-message", "grpc-status-details-bin"] {
        assert_eq!(first.entry(name), replay.entry(name), "{name}");
        assert!(first.entry(name).is_some(), "{name}");
    }
    assert_eq!(first.body, replay.body);
    assert_eq!(
        replay.entry("idempotent-replayed"),
        Some(&b"true"[..]),
        "{replay:?}"
    );
}

/// C4, C5: concurrent retries of one key over eight HTTP/2 connections: one run, the others
/// `ABORTED` or the same answer.
#[tokio::test]
async fn c05_concurrent_retries_over_several_connections_run_once() {
    let server = Harness::start(quick()).await;
    let key = key();
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(server.client().await);
    }
    let calls = clients.into_iter().map(|mut client| {
        let key = key.clone();
        tokio::spawn(async move { client.create_charge(create(5, &key, "sleep-300")).await })
    });
    let mut ids = Vec::new();
    for call in calls {
        match call.await.expect("joined") {
            Ok(charge) => ids.push(charge.into_inner().id),
            Err(status) => assert_eq!(status.code(), Code::Aborted, "{status:?}"),
        }
    }
    assert_eq!(server.calls(), 1);
    let mut client = server.client().await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let last = client
        .create_charge(create(5, &key, "ok"))
        .await
        .expect("the replay");
    ids.push(last.into_inner().id);
    assert!(ids.iter().all(|id| id == "ch_1"), "{ids:?}");
}

/// C8: a client whose deadline passes mid-effect, or that resets its stream, then retries:
/// one run, and the retry gets its answer.
#[tokio::test]
async fn c08_a_deadline_or_a_reset_mid_effect_then_a_retry_runs_once() {
    let server = Harness::start(quick()).await;
    let mut client = server.client().await;
    let key = key();
    let mut request = create(9, &key, "sleep-400");
    request.set_timeout(Duration::from_millis(50));
    let status = client
        .create_charge(request)
        .await
        .expect_err("the deadline");
    // The client's own timer (`Cancelled`) or the server's (`DEADLINE_EXCEEDED`).
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );
    // A second key, its stream reset by the client (RST_STREAM) mid-effect.
    let reset_key = self::key();
    let call = client.create_charge(create(9, &reset_key, "sleep-400"));
    assert!(tokio::time::timeout(Duration::from_millis(50), call)
        .await
        .is_err());
    for key in [&key, &reset_key] {
        let answer = loop {
            match client.create_charge(create(9, key, "ok")).await {
                // Still running on its own: retry as the server says.
                Err(status) if status.code() == Code::Aborted => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => break other.expect("the stored answer"),
            }
        };
        assert_eq!(
            answer
                .metadata()
                .get("idempotent-replayed")
                .map(|v| v.as_bytes()),
            Some(&b"true"[..])
        );
    }
    assert_eq!(server.calls(), 2);
}

/// C1: keys in metadata that are binary (`-bin`), duplicated, empty, huge or not ASCII are
/// `INVALID_ARGUMENT`, nothing run.
#[tokio::test]
async fn c01_hostile_keys_in_metadata_are_invalid_argument_and_nothing_runs() {
    let server = Harness::start(quick()).await;
    let channel = server.channel().await;
    let body = framed(&message(3).encode_to_vec());
    let huge = "k".repeat(256);
    let cases: Vec<Vec<(&str, &[u8])>> = vec![
        vec![("idempotency-key-bin", b"a2V5")],
        vec![("idempotency-key", b"a"), ("idempotency-key", b"b")],
        vec![("idempotency-key", b"a"), ("idempotency-key", b"a")],
        vec![("idempotency-key", b"")],
        vec![("idempotency-key", b"\"\"")],
        vec![("idempotency-key", huge.as_bytes())],
        vec![("idempotency-key", b"k\xc3\xa9y")],
        vec![("idempotency-key", b"a, b")],
        vec![("idempotency-key", b"k y")],
    ];
    for case in cases {
        let answer = raw(&channel, body.clone(), &case).await;
        assert_eq!(answer.code(), Code::InvalidArgument, "{case:?}: {answer:?}");
    }
    assert_eq!(server.calls(), 0);
}

/// C3: the same key with the message encoded another way (field order, a default written out,
/// an unknown field) is another request: `FAILED_PRECONDITION`, never a second run.
#[tokio::test]
async fn c03_another_encoding_of_the_message_is_a_mismatch_never_a_second_run() {
    let server = Harness::start(quick()).await;
    let channel = server.channel().await;
    let key = key();
    let canonical = message(11).encode_to_vec();
    let headers: [(&str, &[u8]); 1] = [("idempotency-key", key.as_bytes())];
    let first = raw(&channel, framed(&canonical), &headers).await;
    assert_eq!(first.code(), Code::Ok);
    // Fields reversed: currency (2) before amount (1).
    let mut reordered = Vec::new();
    reordered.extend_from_slice(&canonical[2..]);
    reordered.extend_from_slice(&canonical[..2]);
    assert_eq!(
        CreateChargeRequest::decode(&reordered[..]).expect("decodes"),
        message(11)
    );
    let mut unknown = canonical.clone();
    unknown.extend_from_slice(&[0xf8, 0x06, 0x01]); // field 111, varint 1
    let mut default = canonical.clone();
    default.extend_from_slice(&[0x22, 0x00]); // request_id = "" written out
    for other in [reordered, unknown, default] {
        let answer = raw(&channel, framed(&other), &headers).await;
        assert_eq!(answer.code(), Code::FailedPrecondition, "{answer:?}");
    }
    let again = raw(&channel, framed(&canonical), &headers).await;
    assert_eq!(again.body, first.body);
    assert_eq!(server.calls(), 1);
}

/// C9: a handler that runs past its lease keeps the key (the heartbeat): a retry is in
/// flight, never a second run.
#[tokio::test]
async fn c09_a_handler_past_its_lease_is_never_run_twice() {
    let server = Harness::start(Policy::default().lease(Duration::from_millis(300))).await;
    let mut client = server.client().await;
    let key = key();
    let slow = tokio::spawn({
        let mut client = client.clone();
        let key = key.clone();
        async move { client.create_charge(create(4, &key, "sleep-1200")).await }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    let retry = client.create_charge(create(4, &key, "ok")).await;
    assert_eq!(
        retry.as_ref().map_err(Status::code).err(),
        Some(Code::Aborted),
        "{retry:?}"
    );
    let first = slow.await.expect("joined");
    assert_eq!(server.calls(), 1, "{first:?}");
}

/// C13: a deadline far shorter than the store budget: the call ends at its deadline, and the
/// execution that began still runs once.
#[tokio::test]
async fn c13_a_deadline_shorter_than_the_store_budget_runs_at_most_once() {
    let server = Harness::start(quick()).await;
    let mut client = server.client().await;
    let key = key();
    let mut request = create(6, &key, "ok");
    request.set_timeout(Duration::from_micros(1));
    let first = client.create_charge(request).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let again = client.create_charge(create(6, &key, "ok")).await;
    let again = again.expect("ran once or is answered");
    assert!(server.calls() <= 1, "{first:?}");
    assert_eq!(again.into_inner().id, "ch_1");
    assert_eq!(server.calls(), 1);
}

/// C3: a compressed message is `UNIMPLEMENTED` with `grpc-accept-encoding: identity`.
#[tokio::test]
async fn c03_a_compressed_message_is_unimplemented() {
    let server = Harness::start(quick()).await;
    let channel = server.channel().await;
    let key = key();
    let mut body = framed(&message(3).encode_to_vec());
    body[0] = 1;
    let answer = raw(
        &channel,
        body,
        &[
            ("idempotency-key", key.as_bytes()),
            ("grpc-encoding", b"gzip"),
        ],
    )
    .await;
    assert_eq!(answer.code(), Code::Unimplemented);
    assert_eq!(answer.entry("grpc-accept-encoding"), Some(&b"identity"[..]));
    assert_eq!(server.calls(), 0);
}

/// C13: no spelling of the protected method's path reaches its handler unprotected.
#[tokio::test]
async fn c13_no_spelling_of_the_path_reaches_the_handler_unprotected() {
    let server = Harness::start(quick()).await;
    let channel = server.channel().await;
    let body = framed(&message(3).encode_to_vec());
    for path in [
        "/payments.v1.Charges/CreateCharge/",
        "/payments.v1.Charges//CreateCharge",
        "/payments.v1.Charges/CreateCharge?a=1",
        "/payments.v1.Charges/Create%43harge",
        "/payments.v1.Charges/createcharge",
        "/payments.v1.Charges/CreateCharge;x",
        "/payments.v1.Charges/CreateCharge#f",
        "/payments.v1.Charges/./CreateCharge",
        "/payments.v1.Charges/x/../CreateCharge",
        "/payments%2Ev1.Charges/CreateCharge",
    ] {
        let Ok(uri) = format!("http://localhost{path}").parse::<http::Uri>() else {
            continue;
        };
        let request = http::Request::post(uri)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("x-account", ACCOUNT)
            .body(tonic::body::Body::new(http_body_util::Full::new(
                Bytes::from(body.clone()),
            )))
            .expect("a request");
        let response = channel.clone().oneshot(request).await.expect("an answer");
        let (parts, body) = response.into_parts();
        let trailers = body.collect().await.expect("the body").trailers().cloned();
        let status = parts
            .headers
            .get("grpc-status")
            .or_else(|| trailers.as_ref().and_then(|t| t.get("grpc-status")))
            .map(|v| Code::from_bytes(v.as_bytes()));
        // Unknown to tonic (UNIMPLEMENTED), or the protected method without its key.
        assert!(
            matches!(status, Some(Code::Unimplemented | Code::InvalidArgument)),
            "{path}: {status:?}"
        );
    }
    assert_eq!(server.calls(), 0);
}

/// The entries of an answer a client reads, but the transport's `date` and the replay mark.
fn entries(raw: &Raw) -> Vec<(String, Vec<u8>)> {
    let mut all: Vec<_> = raw
        .head
        .iter()
        .chain(raw.trailers.iter())
        .filter(|(n, _)| !matches!(n.as_str(), "date" | "idempotent-replayed"))
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect();
    all.sort();
    all
}

/// C7: the caller and every retry read the same metadata and trailers, OK or error.
#[tokio::test]
async fn c07_the_caller_and_the_retry_read_the_same_metadata() {
    for policy in [
        quick(),
        quick()
            .store_header("x-served-by")
            .store_header("x-declined-by")
            .store_header("set-cookie"),
    ] {
        same_metadata(policy).await;
    }
}

async fn same_metadata(policy: Policy) {
    let allowed = policy.stores_header("x-served-by");
    let server = Harness::start(policy).await;
    let channel = server.channel().await;
    for (mode, custom) in [(&b"ok"[..], "x-served-by"), (b"status", "x-declined-by")] {
        let key = key();
        let body = framed(&message(8).encode_to_vec());
        let headers: [(&str, &[u8]); 2] = [("idempotency-key", key.as_bytes()), ("x-mode", mode)];
        let first = raw(&channel, body.clone(), &headers).await;
        let replay = raw(&channel, body, &headers).await;
        assert_eq!(entries(&first), entries(&replay), "{first:?} {replay:?}");
        assert_eq!(first.body, replay.body);
        assert_eq!(first.entry(custom).is_some(), allowed, "{first:?}");
        assert_eq!(first.entry("set-cookie"), None, "never stored, never sent");
    }
}

/// C8: a handler that returned its answer has run its effect. When tonic then fails to encode
/// that answer (over `max_encoding_message_size`), it ends the stream with `OUT_OF_RANGE` in
/// the trailers: a code the handler did not choose, after the effect, never a refusal that
/// gives the key back for a second run.
#[tokio::test]
async fn c08_a_status_tonic_sends_after_the_handler_answered_keeps_the_key() {
    let server = Harness::start_with(quick(), 16).await;
    let mut client = server.client().await;
    let key = key();
    let first = client
        .create_charge(create(12, &key, "ok"))
        .await
        .expect_err("the answer is over the encoding limit");
    assert_eq!(first.code(), Code::OutOfRange, "{first:?}");
    let again = client
        .create_charge(create(12, &key, "ok"))
        .await
        .expect_err("the stored answer");
    assert_eq!(server.calls(), 1, "the effect ran once: {again:?}");
    assert_eq!(
        (again.code(), again.message()),
        (first.code(), first.message())
    );
    assert_eq!(
        again
            .metadata()
            .get("idempotent-replayed")
            .map(|v| v.as_bytes()),
        Some(&b"true"[..])
    );
}

/// C3, C5: while the first call runs, the key with another message is a mismatch
/// (`FAILED_PRECONDITION` wins over `ABORTED`), and the same message is in flight.
#[tokio::test]
async fn c03_a_mismatch_while_in_flight_is_failed_precondition() {
    let server = Harness::start(quick()).await;
    let key = key();
    let slow = tokio::spawn({
        let mut client = server.client().await;
        let key = key.clone();
        async move { client.create_charge(create(1, &key, "sleep-500")).await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut client = server.client().await;
    let other = client
        .create_charge(create(2, &key, "ok"))
        .await
        .expect_err("another message");
    assert_eq!(other.code(), Code::FailedPrecondition, "{other:?}");
    let same = client
        .create_charge(create(1, &key, "ok"))
        .await
        .expect_err("in flight");
    assert_eq!(same.code(), Code::Aborted, "{same:?}");
    slow.await.expect("joined").expect("the first answer");
    assert_eq!(server.calls(), 1);
}

/// C1: a key in the message's `request_id` that is not a valid key is `INVALID_ARGUMENT`; one
/// that disagrees with the metadata entry too; nothing runs.
#[tokio::test]
async fn c01_hostile_keys_in_the_request_id_field_are_invalid_argument() {
    let server = Harness::start(quick()).await;
    let mut client = server.client().await;
    for (field, entry) in [
        ("k y".to_owned(), None),
        ("k\u{e9}y".to_owned(), None),
        ("k".repeat(256), None),
        ("k\ty".to_owned(), None),
        ("field-key".to_owned(), Some("entry-key")),
    ] {
        let mut request = Request::new(CreateChargeRequest {
            request_id: field.clone(),
            ..message(1)
        });
        request
            .metadata_mut()
            .insert("x-account", ACCOUNT.parse().expect("ascii"));
        if let Some(entry) = entry {
            request
                .metadata_mut()
                .insert("idempotency-key", entry.parse().expect("ascii"));
        }
        let status = client.create_charge(request).await.expect_err("refused");
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{field:?}: {status:?}"
        );
    }
    assert_eq!(server.calls(), 0);
}

/// C12: a message over the limit is refused before the rest of it is read, and the client
/// gets `RESOURCE_EXHAUSTED` over HTTP/2, not a reset stream, however much it still sends.
#[tokio::test]
async fn c12_a_call_refused_before_its_body_is_read_gets_its_status() {
    let server = Harness::start(Policy::default().max_body_bytes(64 * 1024)).await;
    let mut client = server.client().await;
    for key in [None, Some(self::key())] {
        let mut request = Request::new(CreateChargeRequest {
            description: "d".repeat(2 * 1024 * 1024),
            ..message(1)
        });
        request
            .metadata_mut()
            .insert("x-account", ACCOUNT.parse().expect("ascii"));
        if let Some(key) = &key {
            request
                .metadata_mut()
                .insert("idempotency-key", key.parse().expect("ascii"));
        }
        let status = client.create_charge(request).await.expect_err("refused");
        assert_eq!(
            status.code(),
            Code::ResourceExhausted,
            "{key:?}: {status:?}"
        );
    }
    assert_eq!(server.calls(), 0);
}

/// `CreateCharge` keyed by the metadata entry only.
fn metadata_only(idem: Idempotency<MemoryStore>) -> GrpcIdempotencyLayer<MemoryStore, Consumer> {
    GrpcIdempotencyLayer::new(idem, account as Consumer).method(GrpcMethod::unary(CREATE_CHARGE))
}

/// C1: a method keyed by metadata only refuses a keyless call before reading its body; the
/// client, still sending a large message, gets `INVALID_ARGUMENT`, not a reset stream.
#[tokio::test]
async fn c01_a_keyless_call_refused_before_its_body_is_read_gets_its_status() {
    let server = Harness::serve(quick(), usize::MAX, metadata_only).await;
    let mut client = server.client().await;
    for size in [10, 900 * 1024] {
        let mut request = Request::new(CreateChargeRequest {
            description: "d".repeat(size),
            ..message(1)
        });
        request
            .metadata_mut()
            .insert("x-account", ACCOUNT.parse().expect("ascii"));
        let status = client.create_charge(request).await.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{size}: {status:?}");
    }
    assert_eq!(server.calls(), 0);
}

/// A handler that writes its answer in its own SQLite transaction, then panics.
#[derive(Clone, Default)]
struct CommitThenPanic {
    calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl Charges for CommitThenPanic {
    async fn create_charge(
        &self,
        request: Request<CreateChargeRequest>,
    ) -> Result<Response<Charge>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let reservation = request
            .extensions()
            .get::<idem_tower::Reservation<SqliteStore>>()
            .cloned()
            .expect("a reservation");
        let charge = Charge {
            id: "ch_committed".into(),
            ..Charge::default()
        };
        let answer = idem_tower::GrpcAnswer::ok(&charge).into_stored();
        reservation
            .transaction(Box::new(move |tx, _lease| -> Result<_, rusqlite::Error> {
                tx.execute("CREATE TABLE IF NOT EXISTS effects (x INTEGER)", [])?;
                tx.execute("INSERT INTO effects (x) VALUES (1)", [])?;
                Ok(answer)
            }))
            .await
            .expect("committed");
        panic!("the handler panicked after its commit");
    }

    async fn get_charge(
        &self,
        _request: Request<GetChargeRequest>,
    ) -> Result<Response<Charge>, Status> {
        Err(Status::not_found("none"))
    }
}

/// C6, C8: a handler that panics after its transaction committed the effect and its answer:
/// the caller and the retry both get the committed answer, one effect.
#[tokio::test]
async fn c08_a_panic_after_the_handlers_commit_answers_what_it_committed() {
    let dir = tempfile::tempdir().expect("a directory");
    let path = dir.path().join("idem.db");
    let store = SqliteStore::open(path.to_str().expect("utf-8"))
        .await
        .expect("a store");
    let idem = Idempotency::new(store);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let addr = listener.local_addr().expect("an address");
    let handler = CommitThenPanic::default();
    let service = ChargesServer::new(handler.clone());
    tokio::spawn(async move {
        Server::builder()
            .layer(layer(idem))
            .add_service(service)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .expect("serves");
    });
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("a URL")
        .connect()
        .await
        .expect("connects");
    let mut client = ChargesClient::new(channel);
    let key = key();
    let first = client.create_charge(create(3, &key, "ok")).await;
    let again = client.create_charge(create(3, &key, "ok")).await;
    assert_eq!(handler.calls.load(Ordering::SeqCst), 1);
    let ids = [&first, &again].map(|answer| {
        answer
            .as_ref()
            .map(|charge| charge.get_ref().id.clone())
            .map_err(|status| (status.code(), status.message().to_owned()))
    });
    assert_eq!(ids[0], ids[1], "one answer for the key");
    assert_eq!(ids[1], Ok("ch_committed".to_owned()), "what was committed");
    let db = rusqlite::Connection::open(&path).expect("the file");
    let effects: i64 = db
        .query_row("SELECT count(*) FROM effects", [], |row| row.get(0))
        .expect("a count");
    assert_eq!(effects, 1);
}

/// C4, C8: the example's own handler on SQLite, one key, eight HTTP/2 connections whose calls
/// end at deadlines from 30 ms to 400 ms while the charge takes 250 ms, then every caller
/// retries until answered: one charge, and every caller reads the same one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c04_callers_cancelling_at_random_on_one_key_make_one_charge() {
    let dir = tempfile::tempdir().expect("a directory");
    let path = dir.path().join("payments.db");
    let path = path.to_str().expect("utf-8").to_owned();
    let backend = payments_grpc::db::Sqlite::open(&path, Policy::default())
        .await
        .expect("the database");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(payments_grpc::app::serve(
        backend,
        listener,
        true,
        std::future::pending(),
    ));
    let key = key();
    let mut callers = Vec::new();
    for i in 0..8u64 {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .expect("a URL")
            .connect()
            .await
            .expect("connects");
        let key = key.clone();
        callers.push(tokio::spawn(async move {
            let mut client = ChargesClient::new(channel);
            let make = |timeout: Option<Duration>| {
                let mut request = create(250, &key, "ok");
                request
                    .metadata_mut()
                    .insert("x-test-delay-ms", "250".parse().expect("ascii"));
                if let Some(timeout) = timeout {
                    request.set_timeout(timeout);
                }
                request
            };
            let first = client
                .create_charge(make(Some(Duration::from_millis(30 + i * 50))))
                .await;
            if let Ok(charge) = first {
                return charge.into_inner().id;
            }
            loop {
                match client.create_charge(make(None)).await {
                    Ok(charge) => return charge.into_inner().id,
                    Err(status) if status.code() == Code::Aborted => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(status) => panic!("caller {i}: {status:?}"),
                }
            }
        }));
    }
    let mut ids = Vec::new();
    for caller in callers {
        ids.push(caller.await.expect("joined"));
    }
    assert!(ids.iter().all(|id| id == &ids[0]), "{ids:?}");
    let db = rusqlite::Connection::open(&path).expect("the file");
    let charges: i64 = db
        .query_row("SELECT count(*) FROM grpc_charges", [], |row| row.get(0))
        .expect("a count");
    assert_eq!(charges, 1);
}
