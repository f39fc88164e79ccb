//! End to end: the real `payments-grpc` process, real tonic clients over HTTP/2, each
//! scenario on SQLite and on PostgreSQL.

use bytes::Bytes;
use e2e_support::ServerProcess;
use fault_proxy::{Fault, FaultProxy, LoseAnswer, COMMIT_QUERY};
use http_body_util::BodyExt;
use idem::sqlite::rusqlite::{params, Connection};
use payments_grpc::app::CREATE_CHARGE;
use payments_grpc::proto::charges_client::ChargesClient;
use payments_grpc::proto::{Charge, CreateChargeRequest, GetChargeRequest};
use prost::Message;
use sqlx::Connection as _;
use std::time::{Duration, Instant};
use tempfile::TempDir;
use tokio::process::Command;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use tower::ServiceExt;

const ACCOUNT: &str = "acct_e2e";

/// The database a server runs on.
#[derive(Debug, Clone, Copy)]
enum Db {
    /// A fresh SQLite file.
    Sqlite,
    /// A fresh database on the PostgreSQL server at `IDEM_PG_URL`.
    Postgres,
}

/// A server on a fresh database, with its test hooks on.
struct Server {
    process: ServerProcess,
    // Kept for the server's log and the SQLite file.
    _dir: TempDir,
    database: String,
    db: Db,
}

/// `url` with its database replaced by `name`.
fn url_with_database(url: &str, name: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let (server, _) = base.rsplit_once('/').expect("a URL with a database");
    match query {
        Some(query) => format!("{server}/{name}?{query}"),
        None => format!("{server}/{name}"),
    }
}

impl Server {
    async fn start(db: Db) -> Self {
        Self::start_through(db, None).await
    }

    /// A server whose PostgreSQL connections go through the fault proxy `proxy` (its test
    /// reads go direct).
    async fn start_through(db: Db, proxy: Option<&FaultProxy>) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let database = match db {
            Db::Sqlite => dir.path().join("payments.db").display().to_string(),
            Db::Postgres => {
                let admin = std::env::var("IDEM_PG_URL").expect(
                    "IDEM_PG_URL: the PostgreSQL end-to-end tests need a running server and \
                     never skip (scripts/ starts one)",
                );
                let name = format!("payments_grpc_{:016x}", e2e_support::random_u64());
                create_database(&admin, &name).await;
                url_with_database(&admin, &name)
            }
        };
        let through = match proxy {
            Some(proxy) => through_proxy(&database, proxy),
            None => database.clone(),
        };
        let mut command = Command::new(env!("CARGO_BIN_EXE_payments-grpc"));
        command
            .arg("--addr")
            .arg("127.0.0.1:0")
            .arg("--database")
            .arg(&through)
            .arg("--test-hooks");
        let log = dir.path().join("server.log");
        let process = ServerProcess::start("payments-grpc", command, log, &format!("{db:?}")).await;
        Self {
            process,
            _dir: dir,
            database,
            db,
        }
    }

    async fn client(&self) -> ChargesClient<Channel> {
        ChargesClient::connect(self.process.base_url.clone())
            .await
            .expect("connects")
    }

    async fn channel(&self) -> Channel {
        Channel::from_shared(self.process.base_url.clone())
            .expect("a URL")
            .connect()
            .await
            .expect("connects")
    }

    /// The charges in the database, read beside the server.
    async fn charges(&self) -> i64 {
        const COUNT: &str = "SELECT count(*) FROM grpc_charges WHERE account = 'acct_e2e'";
        match self.db {
            Db::Sqlite => {
                let db = Connection::open(&self.database).expect("the database");
                db.query_row(COUNT, params![], |row| row.get(0))
                    .expect("a count")
            }
            Db::Postgres => {
                let mut conn = sqlx::PgConnection::connect(&self.database)
                    .await
                    .expect("the database");
                sqlx::query_scalar(COUNT)
                    .fetch_one(&mut conn)
                    .await
                    .expect("a count")
            }
        }
    }
}

/// The PostgreSQL `url` (`postgres://user@host:port/db`) with `proxy` in place of its server.
fn through_proxy(url: &str, proxy: &FaultProxy) -> String {
    let (user, rest) = url.split_once('@').expect("a URL with a user");
    let (_, database) = rest.split_once('/').expect("a URL with a database");
    format!("{user}@{}/{database}", proxy.addr())
}

/// The PostgreSQL server's `host:port` in `IDEM_PG_URL`.
fn postgres_server() -> String {
    let url = std::env::var("IDEM_PG_URL").expect("IDEM_PG_URL");
    let (_, rest) = url.split_once('@').expect("a URL with a user");
    rest.split_once('/')
        .map_or(rest, |(server, _)| server)
        .to_owned()
}

/// Creates database `name` on the server at `admin` (tries again a few times: concurrent
/// `CREATE DATABASE`s can collide on their template).
async fn create_database(admin: &str, name: &str) {
    let mut last = String::new();
    for _ in 0..10 {
        let mut conn = sqlx::PgConnection::connect(admin)
            .await
            .expect("connect to IDEM_PG_URL");
        let created = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await;
        let _ = conn.close().await;
        match created {
            Ok(_) => return,
            Err(error) => last = error.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("CREATE DATABASE {name}: {last}");
}

impl Drop for Server {
    /// A PostgreSQL test's database is dropped, on a thread with a runtime of its own (a
    /// `Drop` cannot await).
    fn drop(&mut self) {
        let (Db::Postgres, Ok(admin)) = (self.db, std::env::var("IDEM_PG_URL")) else {
            return;
        };
        let Some((_, name)) = self
            .database
            .split('?')
            .next()
            .and_then(|u| u.rsplit_once('/'))
        else {
            return;
        };
        let name = name.to_owned();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let mut conn = sqlx::PgConnection::connect(&admin)
                    .await
                    .map_err(|e| e.to_string())?;
                let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                let _ = conn.close().await;
                Ok::<_, String>(())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("warning: the test database was not dropped: {dropped:?}");
        }
    }
}

/// One test per backend for each scenario.
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::Db::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::Db::Postgres).await
                }
            )*
        }
    };
}

on_every_backend!(
    c08_a_deadline_shorter_than_the_handler_then_a_retry_makes_one_charge,
    c04_sixteen_concurrent_callers_on_one_key_make_one_charge,
    c03_a_key_reused_with_another_amount_is_failed_precondition,
    c01_the_request_id_field_is_the_key,
    c08_an_invalid_request_is_refused_and_the_corrected_retry_with_the_key_runs,
    c07_a_replay_has_identical_message_bytes_and_trailers,
    c08_a_connection_dropped_mid_call_then_a_retry_makes_one_charge,
    c08_a_malformed_message_does_not_burn_the_key,
);

fn key() -> String {
    format!("key-{:016x}", e2e_support::random_u64())
}

fn create(amount: i64, key: Option<&str>) -> Request<CreateChargeRequest> {
    let mut request = Request::new(CreateChargeRequest {
        amount,
        currency: "usd".into(),
        description: "tea for two".into(),
        request_id: String::new(),
    });
    request
        .metadata_mut()
        .insert("x-account", ACCOUNT.parse().expect("ascii"));
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("idempotency-key", key.parse().expect("ascii"));
    }
    request
}

fn slow(mut request: Request<CreateChargeRequest>, ms: u64) -> Request<CreateChargeRequest> {
    request
        .metadata_mut()
        .insert("x-test-delay-ms", ms.to_string().parse().expect("ascii"));
    request
}

/// Sends `make()` until it is not `ABORTED` (in flight), waiting as the server says.
async fn retry_until_answered(
    client: &mut ChargesClient<Channel>,
    make: impl Fn() -> Request<CreateChargeRequest>,
) -> Result<tonic::Response<Charge>, Status> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client.create_charge(make()).await {
            Err(status) if status.code() == Code::Aborted && Instant::now() < deadline => {
                let wait = status
                    .metadata()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok())
                    .expect("an in-flight answer says when to retry");
                assert!((1..=1).contains(&wait), "capped at 1 s: {wait}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}

fn replayed(response: &tonic::Response<Charge>) -> bool {
    response
        .metadata()
        .get("idempotent-replayed")
        .map(|v| v.as_bytes())
        == Some(b"true")
}

async fn c08_a_deadline_shorter_than_the_handler_then_a_retry_makes_one_charge(db: Db) {
    let server = Server::start(db).await;
    let mut client = server.client().await;
    let key = key();
    let mut first = slow(create(2500, Some(&key)), 1500);
    first.set_timeout(Duration::from_millis(300));
    let timed_out = client
        .create_charge(first)
        .await
        .expect_err("the deadline passes first");
    assert!(
        matches!(timed_out.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{timed_out:?}"
    );
    let retry = retry_until_answered(&mut client, || create(2500, Some(&key)))
        .await
        .expect("the retry gets the charge");
    assert!(replayed(&retry), "the first execution's answer, replayed");
    assert_eq!(retry.get_ref().amount, 2500);
    assert_eq!(server.charges().await, 1);
    let fetched = client
        .get_charge({
            let mut r = Request::new(GetChargeRequest {
                id: retry.get_ref().id.clone(),
            });
            r.metadata_mut()
                .insert("x-account", ACCOUNT.parse().expect("ascii"));
            r
        })
        .await
        .expect("GetCharge");
    assert_eq!(fetched.get_ref(), retry.get_ref());
}

/// C6, C8 (PostgreSQL): the charge's COMMIT lands but its answer is lost, so the handler takes
/// it for a rollback and says nothing happened. The key's give-back is fenced out by the
/// completion that committed with the charge, and the answer is the charge, never "not
/// recorded, retry" (a client taking that at its word would pay twice under a new key).
#[tokio::test]
async fn c08_a_lost_answer_to_the_charges_commit_is_answered_with_the_charge() {
    let proxy = FaultProxy::start(&postgres_server())
        .await
        .expect("a proxy");
    let server = Server::start_through(Db::Postgres, Some(&proxy)).await;
    let mut client = server.client().await;
    client
        .create_charge(create(100, Some(&key())))
        .await
        .expect("a first charge, migrations done");
    let key = key();
    proxy.set(LoseAnswer::to(COMMIT_QUERY));
    let first = client
        .create_charge(create(500, Some(&key)))
        .await
        .expect("the charge that committed");
    assert_eq!(first.get_ref().amount, 500);
    proxy.set(Fault::PassThrough);
    let retry = retry_until_answered(&mut client, || create(500, Some(&key)))
        .await
        .expect("the retry gets the charge");
    assert!(replayed(&retry), "the stored charge, replayed");
    assert_eq!(retry.get_ref(), first.get_ref());
    assert_eq!(server.charges().await, 2);
}

async fn c04_sixteen_concurrent_callers_on_one_key_make_one_charge(db: Db) {
    let server = Server::start(db).await;
    let key = key();
    let mut callers = Vec::new();
    for _ in 0..16 {
        let mut client = server.client().await;
        let key = key.clone();
        callers.push(tokio::spawn(async move {
            retry_until_answered(&mut client, || slow(create(4200, Some(&key)), 300))
                .await
                .expect("every caller gets the charge")
                .into_inner()
        }));
    }
    let mut ids = Vec::new();
    for caller in callers {
        ids.push(caller.await.expect("a caller").id);
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "one charge for all: {ids:?}");
    assert_eq!(server.charges().await, 1);
}

async fn c03_a_key_reused_with_another_amount_is_failed_precondition(db: Db) {
    let server = Server::start(db).await;
    let mut client = server.client().await;
    let key = key();
    client
        .create_charge(create(2500, Some(&key)))
        .await
        .expect("the charge");
    let reused = client
        .create_charge(create(9900, Some(&key)))
        .await
        .expect_err("another request under the same key");
    assert_eq!(reused.code(), Code::FailedPrecondition);
    assert_eq!(server.charges().await, 1);
}

async fn c01_the_request_id_field_is_the_key(db: Db) {
    let server = Server::start(db).await;
    let mut client = server.client().await;
    let with_id = || {
        let mut request = create(700, None);
        request.get_mut().request_id = "req-aip-155".into();
        request
    };
    let first = client.create_charge(with_id()).await.expect("the charge");
    let again = client.create_charge(with_id()).await.expect("the replay");
    assert!(!replayed(&first));
    assert!(replayed(&again));
    assert_eq!(again.get_ref(), first.get_ref());
    let missing = client
        .create_charge(create(700, None))
        .await
        .expect_err("no key at all");
    assert_eq!(missing.code(), Code::InvalidArgument);
    assert_eq!(server.charges().await, 1);
}

async fn c08_an_invalid_request_is_refused_and_the_corrected_retry_with_the_key_runs(db: Db) {
    let server = Server::start(db).await;
    let mut client = server.client().await;
    let key = key();
    let refused = client
        .create_charge(create(0, Some(&key)))
        .await
        .expect_err("amount 0");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(server.charges().await, 0);
    // The key was released, so a corrected request under it runs (it is a new fingerprint,
    // but nothing was recorded for the refused one).
    let corrected = client
        .create_charge(create(100, Some(&key)))
        .await
        .expect("the corrected request runs");
    assert!(!replayed(&corrected));
    assert_eq!(server.charges().await, 1);
}

/// An answer as it came off the wire: head, body bytes, trailers.
struct Raw {
    head: http::HeaderMap,
    body: Bytes,
    trailers: http::HeaderMap,
}

async fn raw_create(channel: &Channel, key: &str, amount: i64) -> Raw {
    let message = CreateChargeRequest {
        amount,
        currency: "eur".into(),
        description: "raw".into(),
        request_id: String::new(),
    }
    .encode_to_vec();
    let mut framed = vec![0];
    framed.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
    framed.extend_from_slice(&message);
    raw_send(channel, key, framed).await
}

/// A call with `framed` as its body exactly, read off the wire.
async fn raw_send(channel: &Channel, key: &str, framed: Vec<u8>) -> Raw {
    let request = http::Request::post(format!("http://localhost{CREATE_CHARGE}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("x-account", ACCOUNT)
        .header("idempotency-key", key)
        .body(tonic::body::Body::new(http_body_util::Full::new(
            Bytes::from(framed),
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

async fn c07_a_replay_has_identical_message_bytes_and_trailers(db: Db) {
    let server = Server::start(db).await;
    let channel = server.channel().await;
    let key = key();
    let first = raw_create(&channel, &key, 1234).await;
    let replay = raw_create(&channel, &key, 1234).await;
    assert_eq!(
        first.trailers.get("grpc-status").map(|v| v.as_bytes()),
        Some(&b"0"[..])
    );
    assert!(!first.body.is_empty());
    assert_eq!(replay.body, first.body, "the message bytes, byte for byte");
    assert_eq!(replay.trailers, first.trailers, "the same trailers");
    assert_eq!(
        replay.head.get("idempotent-replayed").map(|v| v.as_bytes()),
        Some(&b"true"[..])
    );
    assert_eq!(first.head.get("idempotent-replayed"), None);
    // Trailers follow the body, so neither answer declares its length (HTTP/2 readers that
    // trust content-length would stop before grpc-status).
    assert_eq!(first.head.get("content-length"), None);
    assert_eq!(replay.head.get("content-length"), None);
    assert!(replay.trailers.contains_key("grpc-status"));
    let charge = Charge::decode(&first.body[5..]).expect("a Charge");
    assert_eq!(charge.amount, 1234);
    assert_eq!(server.charges().await, 1);
}

async fn c08_a_connection_dropped_mid_call_then_a_retry_makes_one_charge(db: Db) {
    let server = Server::start(db).await;
    let key = key();
    // A connection of its own, dropped with the call while the handler runs.
    let doomed = server.channel().await;
    let call = tokio::spawn({
        let key = key.clone();
        async move {
            let mut client = ChargesClient::new(doomed);
            client
                .create_charge(slow(create(3100, Some(&key)), 1000))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    call.abort();
    assert!(call.await.expect_err("aborted").is_cancelled());
    let mut client = server.client().await;
    let retry = retry_until_answered(&mut client, || create(3100, Some(&key)))
        .await
        .expect("the retry gets the charge");
    assert!(replayed(&retry));
    assert_eq!(retry.get_ref().amount, 3100);
    assert_eq!(server.charges().await, 1);
}

async fn c08_a_malformed_message_does_not_burn_the_key(db: Db) {
    let server = Server::start(db).await;
    let channel = server.channel().await;
    let key = key();
    // A field header with wire type 7: no protobuf message decodes from it.
    let malformed = raw_send(&channel, &key, b"\x00\x00\x00\x00\x03\xff\xff\xff".to_vec()).await;
    let code = malformed
        .trailers
        .get("grpc-status")
        .or_else(|| malformed.head.get("grpc-status"))
        .map(|v| Code::from_bytes(v.as_bytes()));
    assert_eq!(code, Some(Code::InvalidArgument));
    assert_eq!(server.charges().await, 0);
    let mut client = server.client().await;
    let corrected = client
        .create_charge(create(2500, Some(&key)))
        .await
        .expect("the corrected call runs under the same key");
    assert!(!replayed(&corrected));
    assert_eq!(server.charges().await, 1);
}
