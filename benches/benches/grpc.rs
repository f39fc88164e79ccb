//! The gRPC layer's cost per unary call (`GrpcIdempotencyLayer`, docs/grpc.md), against the same
//! tonic service without it, over a real HTTP/2 connection on loopback (docs/benchmarks.md,
//! "gRPC layer").
//!
//! `cargo bench -p idem-benches --bench grpc` (no server needed: the bench starts its own tonic
//! servers on `127.0.0.1:0` in its runtime and calls them through a tonic `Channel`). Smoke
//! test, each benchmark run once and the table one short round: `cargo test -p idem-benches
//! --bench grpc`.
//!
//! The service is `bench.v1.Charges/CreateCharge`, its messages and plumbing written by hand
//! (prost's derive, `tonic::server::Grpc`, `tonic::client::Grpc`: no `protoc`). Its handler
//! builds the `Charge` from the request with no I/O, so that what the layered side adds is
//! everything idem does: the layer's gRPC work and the store's reservation and completion.
//! Each call sends the same message and an `idempotency-key` metadata entry, on both sides.
//!
//! Two parts:
//! 1. criterion groups, one per engine: `grpc_memory` (`MemoryStore`) and `grpc_sqlite`
//!    (`SqliteStore` on a file in a temporary directory, its defaults), each with
//!    - `plain`: the service without the layer (the baseline; the same server in both groups),
//!    - `layer_fresh`: through the layer with a new key each call (executed: reserve, the
//!      handler, complete),
//!    - `layer_replay`: through the layer with the same key and message each call (the stored
//!      answer replayed, the handler not called).
//!
//!    The calls are made one after the other inside one task of a 2-worker Tokio runtime, the
//!    servers' tasks on the same runtime. The layer's cost per call is `layer_fresh / plain`
//!    and `layer_replay / plain` within one group.
//! 2. the same ratios measured interleaved (the sides alternate within each round, the order
//!    rotates; medians of the rounds, `harness::measure`), at 1 and 8 concurrent callers on one
//!    channel, printed at the end with the time per call of each side; written to
//!    `target/idem-bench/grpc.jsonl`. `IDEM_BENCH_ROUNDS` and `IDEM_BENCH_ROUND_MS` tune it,
//!    `IDEM_BENCH_TABLE=off|only` skips one part.

use criterion::{criterion_group, criterion_main, Bencher, Criterion};
use http::uri::PathAndQuery;
use idem::sqlite::SqliteStore;
use idem::store::Store;
use idem::{Idempotency, MemoryStore};
use idem_benches::harness::{measure, Mode, Op, OpFuture, Row};
use idem_benches::report::{self, Cell};
use idem_tower::{ConsumerError, GrpcIdempotencyLayer, GrpcMethod};
use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tonic::metadata::MetadataValue;
use tonic::server::{NamedService, UnaryService};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Response, Status};
use tonic_prost::ProstCodec;

const SERVICE: &str = "bench.v1.Charges";
const CREATE_CHARGE: &str = "/bench.v1.Charges/CreateCharge";
/// The key every `layer_replay` call sends.
const REPLAYED_KEY: &str = "replayed-key";

// ---------------------------------------------------------------------------------------------
// The service: messages, server plumbing, client

/// `bench.v1.CreateChargeRequest { int64 amount = 1; string currency = 2; string description = 3; }`.
#[derive(Clone, PartialEq, prost::Message)]
struct CreateChargeRequest {
    #[prost(int64, tag = "1")]
    amount: i64,
    #[prost(string, tag = "2")]
    currency: String,
    #[prost(string, tag = "3")]
    description: String,
}

/// `bench.v1.Charge { string id = 1; int64 amount = 2; string currency = 3; string description = 4; int64 created = 5; }`.
#[derive(Clone, PartialEq, prost::Message)]
struct Charge {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(int64, tag = "2")]
    amount: i64,
    #[prost(string, tag = "3")]
    currency: String,
    #[prost(string, tag = "4")]
    description: String,
    #[prost(int64, tag = "5")]
    created: i64,
}

fn message() -> CreateChargeRequest {
    CreateChargeRequest {
        amount: 2500,
        currency: "eur".to_owned(),
        description: "order 1042".to_owned(),
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// `bench.v1.Charges` as a tower service (what tonic's codegen would generate).
#[derive(Clone)]
struct ChargesServer;

impl NamedService for ChargesServer {
    const NAME: &'static str = SERVICE;
}

/// The handler: the charge built from the request, no I/O.
struct CreateCharge;

impl UnaryService<CreateChargeRequest> for CreateCharge {
    type Response = Charge;
    type Future = std::future::Ready<Result<Response<Charge>, Status>>;

    fn call(&mut self, request: tonic::Request<CreateChargeRequest>) -> Self::Future {
        let request = request.into_inner();
        std::future::ready(Ok(Response::new(Charge {
            id: "ch_3PqR8sT1uVwXyZ".to_owned(),
            amount: request.amount,
            currency: request.currency,
            description: request.description,
            created: 1_764_470_000,
        })))
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for ChargesServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        match request.uri().path() {
            CREATE_CHARGE => Box::pin(async move {
                let mut grpc =
                    tonic::server::Grpc::new(ProstCodec::<Charge, CreateChargeRequest>::default());
                Ok(grpc.unary(CreateCharge, request).await)
            }),
            _ => Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

type Consumer = fn(&http::request::Parts) -> Result<String, ConsumerError>;

fn account(_: &http::request::Parts) -> Result<String, ConsumerError> {
    Ok("acct_bench".to_owned())
}

/// The layer protecting `CreateCharge`, its key from the `idempotency-key` metadata entry.
fn layer<S: Store>(idem: Idempotency<S>) -> GrpcIdempotencyLayer<S, Consumer> {
    GrpcIdempotencyLayer::new(idem, account as Consumer).method(GrpcMethod::unary(CREATE_CHARGE))
}

/// A listener on a free loopback port (Nagle off, as tonic's own `serve` sets it).
fn listener() -> (TcpIncoming, SocketAddr) {
    let incoming = TcpIncoming::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("a loopback port")
        .with_nodelay(Some(true));
    let addr = incoming.local_addr().expect("the bound address");
    (incoming, addr)
}

/// A channel to `addr`, connected.
async fn connect(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .expect("a valid URI")
        .connect()
        .await
        .expect("the bench's own server accepts")
}

/// The service without the layer, served on a task of the current runtime.
async fn serve_plain() -> Channel {
    let (incoming, addr) = listener();
    tokio::spawn(
        Server::builder()
            .add_service(ChargesServer)
            .serve_with_incoming(incoming),
    );
    connect(addr).await
}

/// The service behind the layer over `idem`, served on a task of the current runtime.
async fn serve_layered<S: Store + 'static>(idem: Idempotency<S>) -> Channel {
    let (incoming, addr) = listener();
    tokio::spawn(
        Server::builder()
            .layer(layer(idem))
            .add_service(ChargesServer)
            .serve_with_incoming(incoming),
    );
    connect(addr).await
}

/// One `CreateCharge` call with `key` in metadata: the charge's amount and whether the answer
/// was a replay.
async fn create_charge(channel: Channel, key: String) -> (i64, bool) {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("the channel is ready");
    let mut request = tonic::Request::new(message());
    request.metadata_mut().insert(
        "idempotency-key",
        MetadataValue::try_from(key.as_str()).expect("an ASCII key"),
    );
    let response = grpc
        .unary(
            request,
            PathAndQuery::from_static(CREATE_CHARGE),
            ProstCodec::<CreateChargeRequest, Charge>::default(),
        )
        .await
        .expect("the call succeeds");
    let replayed = response.metadata().get("idempotent-replayed").is_some();
    (response.into_inner().amount, replayed)
}

/// The three calls measured: the plain service, the layer with a new key, the layer replaying.
#[derive(Clone)]
struct Calls {
    plain: Channel,
    layered: Channel,
    keys: Arc<AtomicU64>,
}

impl Calls {
    fn fresh_key(&self) -> String {
        format!("k-{}", self.keys.fetch_add(1, Ordering::Relaxed))
    }

    fn plain(&self) -> impl Future<Output = (i64, bool)> + Send + 'static {
        create_charge(self.plain.clone(), self.fresh_key())
    }

    fn layer_fresh(&self) -> impl Future<Output = (i64, bool)> + Send + 'static {
        create_charge(self.layered.clone(), self.fresh_key())
    }

    fn layer_replay(&self) -> impl Future<Output = (i64, bool)> + Send + 'static {
        create_charge(self.layered.clone(), REPLAYED_KEY.to_owned())
    }

    /// What each side answers, checked once before measuring (and the replayed key completed).
    async fn check(&self) {
        assert_eq!(self.plain().await, (2500, false), "plain");
        assert_eq!(self.layer_fresh().await, (2500, false), "fresh");
        assert_eq!(self.layer_replay().await, (2500, false), "the first call");
        assert_eq!(self.layer_replay().await, (2500, true), "a replay");
        assert_eq!(self.layer_fresh().await, (2500, false), "fresh again");
    }
}

// ---------------------------------------------------------------------------------------------
// Measuring

/// Times `iters` calls of `op`, one after the other, inside one task of the runtime (as a
/// client's task makes them): the loop runs on a worker thread, beside the servers' tasks.
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

fn group(c: &mut Criterion, rt: &Runtime, name: &str, calls: &Calls) {
    let mut group = c.benchmark_group(name);
    group.bench_function("plain", |b| {
        let calls = calls.clone();
        on_worker(b, rt, move || calls.plain());
    });
    group.bench_function("layer_fresh", |b| {
        let calls = calls.clone();
        on_worker(b, rt, move || calls.layer_fresh());
    });
    group.bench_function("layer_replay", |b| {
        let calls = calls.clone();
        on_worker(b, rt, move || calls.layer_replay());
    });
    group.finish();
}

/// An operation of the table.
fn op<F, Fut>(f: F) -> Op
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = (i64, bool)> + Send + 'static,
{
    Arc::new(move || -> OpFuture {
        let call = f();
        Box::pin(async move {
            black_box(call.await);
        })
    })
}

/// The interleaved table: per engine and path, the layer against the plain service in
/// alternating rounds; then the summary of the ratios.
fn table(rt: &Runtime, engines: &[(&'static str, Calls)]) {
    let mut mode = Mode::from_env();
    mode.callers = vec![1, 8];
    println!(
        "\ngRPC layer against the plain service, interleaved: {} round(s) of {} ms per side and \
         number of callers (quick: {})",
        mode.rounds,
        mode.round.as_millis(),
        mode.quick
    );
    let mut cells: Vec<Cell> = Vec::new();
    for (store, calls) in engines {
        let plain = {
            let calls = calls.clone();
            op(move || calls.plain())
        };
        let fresh = {
            let calls = calls.clone();
            op(move || calls.layer_fresh())
        };
        let replay = {
            let calls = calls.clone();
            op(move || calls.layer_replay())
        };
        for (path, layered) in [("fresh_key", fresh), ("replay", replay)] {
            let row = Row {
                store,
                path,
                size: 0,
                sides: vec![("layer", layered), ("plain", Arc::clone(&plain))],
            };
            cells.extend(measure(rt, &mode, &row));
        }
    }
    println!("\n| store | path | callers | plain µs/call | layer µs/call | layer / plain |");
    println!("|---|---|---|---|---|---|");
    for layered in cells.iter().filter(|c| c.side == "layer") {
        let Some(plain) = cells.iter().find(|c| {
            c.side == "plain"
                && c.store == layered.store
                && c.path == layered.path
                && c.callers == layered.callers
        }) else {
            continue;
        };
        // Time per call from the throughput: with n callers, n calls run at once.
        let per_call = |cell: &Cell| cell.callers as f64 * 1e6 / cell.ops_per_sec;
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.2} |",
            layered.store,
            layered.path,
            layered.callers,
            per_call(plain),
            per_call(layered),
            layered.ratio_to_baseline.unwrap_or(f64::NAN)
        );
    }
    match report::write("grpc", &cells) {
        Ok(path) => println!("\nresults: {}", path.display()),
        Err(error) => eprintln!("results not written: {error}"),
    }
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let engines = rt.block_on(async {
        let plain = serve_plain().await;
        let keys = Arc::new(AtomicU64::new(0));
        let memory = Calls {
            plain: plain.clone(),
            layered: serve_layered(Idempotency::new(MemoryStore::new())).await,
            keys: Arc::clone(&keys),
        };
        let sqlite_store = SqliteStore::open(dir.path().join("grpc.db"))
            .await
            .expect("a SQLite store in the temporary directory");
        let sqlite = Calls {
            plain,
            layered: serve_layered(Idempotency::new(sqlite_store)).await,
            keys,
        };
        memory.check().await;
        sqlite.check().await;
        vec![("grpc_memory", memory), ("grpc_sqlite", sqlite)]
    });
    let part = std::env::var("IDEM_BENCH_TABLE").unwrap_or_default();
    if part != "only" {
        for (name, calls) in &engines {
            group(c, &rt, name, calls);
        }
    }
    if part != "off" {
        table(&rt, &engines);
    }
    drop(rt);
    drop(dir);
}

criterion_group! {
    name = grpc;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = benches
}
criterion_main!(grpc);
