//! Test support for the end-to-end tests: a per-test environment (temp dir, SQLite file or a
//! PostgreSQL database of its own), the server as a real child process that is always killed,
//! and an HTTP client that behaves like a production payment client (per-attempt timeout,
//! retries with the same idempotency key, exponential backoff honouring `Retry-After`, an
//! overall deadline).

#![allow(dead_code)]

/// One `#[tokio::test]` per scenario per backend: `scenario => sqlite_test, postgres_test;`
/// runs the `async fn scenario(Backend)` on SQLite as `sqlite_test` and on PostgreSQL as
/// `postgres_test` (`#[macro_use] mod support;` to use it).
#[allow(unused_macros)]
macro_rules! on_both_backends {
    ($($scenario:ident => $sqlite:ident, $postgres:ident;)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $sqlite() {
                $scenario($crate::support::Backend::Sqlite).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $postgres() {
                $scenario($crate::support::Backend::Postgres).await
            }
        )*
    };
}

pub(crate) use e2e_support::{error_chain, random_u64, Reply, ServerProcess};

use reqwest::StatusCode;
use serde_json::Value;
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tokio::process::Command;

/// The API key every test authenticates with (unless it tests scoping).
pub(crate) const API_KEY: &str = "sk_test_e2e";

/// A fresh idempotency key, unique across tests and runs.
pub(crate) fn new_key(label: &str) -> String {
    format!("e2e-{label}-{:016x}", random_u64())
}

// ------------------------------------------------------------------------------------------
// Environment: backend, temp dir, database
// ------------------------------------------------------------------------------------------

/// The store the server runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    /// A fresh SQLite file in the test's temp dir.
    Sqlite,
    /// A fresh database on the PostgreSQL server at `IDEM_PG_URL`.
    Postgres,
}

struct PgDatabase {
    admin_url: String,
    name: String,
}

/// One test's world: a temp dir (server logs, the SQLite file) and the database the servers
/// are given. Dropping it removes the dir and drops the PostgreSQL database.
pub(crate) struct TestEnv {
    /// The backend.
    pub backend: Backend,
    /// The temp dir (under `std::env::temp_dir()`), removed on drop.
    pub dir: PathBuf,
    /// What the server gets as `--database`.
    pub database: String,
    pg: Option<PgDatabase>,
    servers: AtomicU32,
}

impl TestEnv {
    /// A fresh environment for the test `test` on `backend`.
    pub(crate) async fn new(backend: Backend, test: &str) -> TestEnv {
        let unique = format!("{:016x}", random_u64());
        let dir =
            std::env::temp_dir().join(format!("idem-e2e-{test}-{}-{unique}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create the temp dir {}: {e}", dir.display()));
        let mut env = TestEnv {
            backend,
            dir,
            database: String::new(),
            pg: None,
            servers: AtomicU32::new(0),
        };
        match backend {
            Backend::Sqlite => {
                env.database = env.dir.join("payments.db").display().to_string();
            }
            Backend::Postgres => {
                let admin_url = std::env::var("IDEM_PG_URL")
                    .ok()
                    .filter(|u| !u.trim().is_empty());
                let Some(admin_url) = admin_url else {
                    panic!(
                        "IDEM_PG_URL is not set: the PostgreSQL end-to-end tests need a running \
                         PostgreSQL server and never skip. Start one (for example \
                         `run_dir=$(mktemp -d) bash -c '. scripts/services.sh; start_services; \
                         env | grep IDEM_ > /tmp/idem_env'`, then \
                         `set -a; . /tmp/idem_env; set +a`) and export \
                         IDEM_PG_URL=postgres://user@host:port/postgres"
                    )
                };
                let name = format!("payments_{unique}");
                create_pg_database(&admin_url, &name).await;
                env.database = url_with_database(&admin_url, &name);
                env.pg = Some(PgDatabase { admin_url, name });
            }
        }
        env
    }

    /// PostgreSQL only: makes the test's database refuse connections and ends the ones it has
    /// (`allow = false`), or lets it accept them again (`allow = true`).
    pub(crate) async fn set_pg_connections_allowed(&self, allow: bool) {
        let pg = self
            .pg
            .as_ref()
            .expect("set_pg_connections_allowed is for PostgreSQL tests");
        let mut conn = PgConnection::connect(&pg.admin_url)
            .await
            .unwrap_or_else(|e| panic!("connect to IDEM_PG_URL={}: {e}", pg.admin_url));
        let sql = format!("ALTER DATABASE {} ALLOW_CONNECTIONS {allow}", pg.name);
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("ALTER DATABASE {}: {e}", pg.name));
        if !allow {
            let sql = format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{}'",
                pg.name
            );
            sqlx::raw_sql(AssertSqlSafe(sql))
                .execute(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("terminating the connections to {}: {e}", pg.name));
        }
        let _ = conn.close().await;
    }

    fn next_server_index(&self) -> u32 {
        self.servers.fetch_add(1, Ordering::Relaxed)
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        if let Some(pg) = self.pg.take() {
            drop_pg_database(pg);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `url` with its database (path) replaced by `database`, the query string kept.
pub(crate) fn url_with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.find('?') {
        Some(i) => (&url[..i], &url[i..]),
        None => (url, ""),
    };
    let authority_start = base.find("://").map(|i| i + 3).unwrap_or(0);
    let authority_end = base[authority_start..]
        .find('/')
        .map(|i| authority_start + i)
        .unwrap_or(base.len());
    format!("{}/{database}{query}", &base[..authority_end])
}

async fn create_pg_database(admin_url: &str, name: &str) {
    let mut last_error = String::new();
    for attempt in 0..5 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
        }
        let mut conn = match PgConnection::connect(admin_url).await {
            Ok(conn) => conn,
            Err(e) => {
                last_error = format!("connect to IDEM_PG_URL={admin_url}: {e}");
                continue;
            }
        };
        let sql = format!("CREATE DATABASE {name}");
        match sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut conn).await {
            Ok(_) => {
                let _ = conn.close().await;
                return;
            }
            // Concurrent CREATE DATABASE can collide on the template; retry.
            Err(e) => last_error = format!("CREATE DATABASE {name} on {admin_url}: {e}"),
        }
        let _ = conn.close().await;
    }
    panic!("cannot create the test's PostgreSQL database: {last_error}");
}

/// Drops the database from a thread of its own (with its own runtime): callable from `Drop`,
/// inside or outside a tokio runtime, while panicking or not.
fn drop_pg_database(pg: PgDatabase) {
    let PgDatabase { admin_url, name } = pg;
    let outcome = std::thread::spawn(move || -> Result<(), String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async {
            let mut conn = PgConnection::connect(&admin_url)
                .await
                .map_err(|e| e.to_string())?;
            let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
            sqlx::raw_sql(AssertSqlSafe(sql))
                .execute(&mut conn)
                .await
                .map_err(|e| format!("DROP DATABASE {name}: {e}"))?;
            let _ = conn.close().await;
            Ok(())
        })
    })
    .join();
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("warning: could not drop the test database: {e}"),
        Err(_) => eprintln!("warning: the thread dropping the test database panicked"),
    }
}

// ------------------------------------------------------------------------------------------
// The server process
// ------------------------------------------------------------------------------------------

/// A running `payments-server` child process with the test hooks on ([`ServerProcess`]:
/// always killed, its log tail printed when a test panics).
pub(crate) struct Server(ServerProcess);

impl std::ops::Deref for Server {
    type Target = ServerProcess;
    fn deref(&self) -> &ServerProcess {
        &self.0
    }
}

impl std::ops::DerefMut for Server {
    fn deref_mut(&mut self) -> &mut ServerProcess {
        &mut self.0
    }
}

impl Server {
    /// Starts the server on `env`'s database with the test hooks on, `--addr 127.0.0.1:0`, and
    /// the lease `lease_ms` when given (else the server's default); waits for its
    /// `listening on http://127.0.0.1:PORT` line on stdout.
    pub(crate) async fn start(env: &TestEnv, lease_ms: Option<u64>) -> Server {
        Server::start_on(env, &env.database, lease_ms).await
    }

    /// [`Server::start`] with `database` as `--database` (another spelling of `env`'s).
    pub(crate) async fn start_on(env: &TestEnv, database: &str, lease_ms: Option<u64>) -> Server {
        Server::start_with(env, database, lease_ms, &[]).await
    }

    /// [`Server::start_on`] with more settings in the environment (`IDEM_HEADER_TIMEOUT_MS`,
    /// ...).
    pub(crate) async fn start_with(
        env: &TestEnv,
        database: &str,
        lease_ms: Option<u64>,
        vars: &[(&str, &str)],
    ) -> Server {
        Server::start_full(env, database, lease_ms, &[], vars).await
    }

    /// [`Server::start`] with more flags (`--webhook-url URL`, ...).
    pub(crate) async fn start_with_args(
        env: &TestEnv,
        lease_ms: Option<u64>,
        args: &[&str],
    ) -> Server {
        Server::start_full(env, &env.database, lease_ms, args, &[]).await
    }

    async fn start_full(
        env: &TestEnv,
        database: &str,
        lease_ms: Option<u64>,
        args: &[&str],
        vars: &[(&str, &str)],
    ) -> Server {
        let index = env.next_server_index();
        let log = env.dir.join(format!("server-{index}.log"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_payments-server"));
        cmd.arg("--addr")
            .arg("127.0.0.1:0")
            .arg("--database")
            .arg(database);
        if let Some(ms) = lease_ms {
            cmd.arg("--lease-ms").arg(ms.to_string());
        }
        cmd.args(args);
        cmd.env("IDEM_TEST_HOOKS", "1")
            .env_remove("IDEM_ADDR")
            .env_remove("DATABASE_URL")
            .env_remove("IDEM_LEASE_MS")
            .env_remove("IDEM_RECONCILE_EVERY")
            .env_remove("IDEM_HEADER_TIMEOUT_MS")
            .env_remove("IDEM_BODY_TIMEOUT_MS")
            .env_remove("IDEM_MAX_CONNECTIONS")
            .env_remove("IDEM_MAX_BUFFERED_BODY_BYTES")
            .env_remove("IDEM_WEBHOOK_URL")
            .env_remove("IDEM_WEBHOOK_SECRET")
            .env_remove("IDEM_TEST_WEBHOOK_SCHEDULE_MS")
            .envs(vars.iter().copied())
            .current_dir(&env.dir);
        Server(
            ServerProcess::start("payments-server", cmd, log, &format!("database {database}"))
                .await,
        )
    }

    /// A client for this server (authenticated with [`API_KEY`]).
    pub(crate) fn api(&self) -> Api {
        Api::new(&self.base_url)
    }
}

// ------------------------------------------------------------------------------------------
// HTTP: requests, replies, the retrying client
// ------------------------------------------------------------------------------------------

/// A request body.
#[derive(Clone, Debug)]
pub(crate) enum Body {
    /// `application/x-www-form-urlencoded`.
    Form(Vec<(String, String)>),
    /// `application/json`.
    Json(Value),
}

/// A `POST /v1/charges`.
#[derive(Clone, Debug)]
pub(crate) struct ChargeRequest {
    /// The `Idempotency-Key` header, if any.
    pub key: Option<String>,
    /// The body.
    pub body: Body,
    /// `X-Test-Delay-Ms`, if any.
    pub delay_ms: Option<u64>,
    /// `X-Test-Network` (how the card network fails the call), if any.
    pub network_fault: Option<NetworkFault>,
    /// The API key, if any (anonymous without).
    pub api_key: Option<String>,
    /// Send the API key as the Basic user name instead of a Bearer token.
    pub basic_auth: bool,
}

impl ChargeRequest {
    /// A form-encoded charge of `amount` USD cents under `key`.
    pub(crate) fn form(key: &str, amount: i64) -> ChargeRequest {
        ChargeRequest {
            key: Some(key.to_owned()),
            body: Body::Form(vec![
                ("amount".to_owned(), amount.to_string()),
                ("currency".to_owned(), "usd".to_owned()),
                ("description".to_owned(), format!("e2e charge {key}")),
            ]),
            delay_ms: None,
            network_fault: None,
            api_key: Some(API_KEY.to_owned()),
            basic_auth: false,
        }
    }

    /// A form-encoded request with exactly these fields.
    pub(crate) fn form_fields(key: &str, fields: &[(&str, &str)]) -> ChargeRequest {
        ChargeRequest {
            key: Some(key.to_owned()),
            body: Body::Form(
                fields
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            delay_ms: None,
            network_fault: None,
            api_key: Some(API_KEY.to_owned()),
            basic_auth: false,
        }
    }

    /// A JSON request with this body.
    pub(crate) fn json(key: &str, body: Value) -> ChargeRequest {
        ChargeRequest {
            key: Some(key.to_owned()),
            body: Body::Json(body),
            delay_ms: None,
            network_fault: None,
            api_key: Some(API_KEY.to_owned()),
            basic_auth: false,
        }
    }

    /// With `X-Test-Delay-Ms: ms`.
    pub(crate) fn with_delay(mut self, ms: u64) -> ChargeRequest {
        self.delay_ms = Some(ms);
        self
    }

    /// With `X-Test-Network` asking the card network for `fault`.
    pub(crate) fn with_network_fault(mut self, fault: NetworkFault) -> ChargeRequest {
        self.network_fault = Some(fault);
        self
    }

    /// Without `X-Test-Network` (same key and body).
    pub(crate) fn without_network_fault(mut self) -> ChargeRequest {
        self.network_fault = None;
        self
    }

    /// Without `X-Test-Delay-Ms` (same key and body).
    pub(crate) fn without_delay(mut self) -> ChargeRequest {
        self.delay_ms = None;
        self
    }

    /// Without an `Idempotency-Key`.
    pub(crate) fn without_key(mut self) -> ChargeRequest {
        self.key = None;
        self
    }

    /// The API key sent as the Basic user name (`curl -u key:`).
    pub(crate) fn with_basic_auth(mut self) -> ChargeRequest {
        self.basic_auth = true;
        self
    }

    /// Authenticated with `api_key`, or anonymous with `None`.
    pub(crate) fn with_api_key(mut self, api_key: Option<&str>) -> ChargeRequest {
        self.api_key = api_key.map(str::to_owned);
        self
    }
}

/// How the server's simulated card network fails a call (`X-Test-Network`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NetworkFault {
    /// It records the authorization, and the handler's call times out.
    TimeoutAfterCharging,
    /// It records nothing, and the handler's call times out.
    TimeoutBeforeCharging,
}

impl NetworkFault {
    /// The header's value.
    pub(crate) fn header(self) -> &'static str {
        match self {
            NetworkFault::TimeoutAfterCharging => "timeout-after-charging",
            NetworkFault::TimeoutBeforeCharging => "timeout-before-charging",
        }
    }
}

/// What one attempt of the retrying client ended with.
#[derive(Clone, Debug)]
pub(crate) enum Attempt {
    /// No complete answer within the per-attempt timeout.
    Timeout(Duration),
    /// A connection or protocol error.
    Transport(String),
    /// An answer.
    Status {
        /// The status code.
        status: u16,
        /// Its `Retry-After`, if any.
        retry_after: Option<String>,
        /// Its latency.
        latency: Duration,
    },
}

/// The end of a retried request: the final (non-retryable) answer and every attempt.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// The final answer.
    pub reply: Reply,
    /// Every attempt, the last one included.
    pub attempts: Vec<Attempt>,
}

impl Outcome {
    /// How many attempts got `status`.
    pub(crate) fn count_status(&self, status: u16) -> usize {
        self.attempts
            .iter()
            .filter(|a| matches!(a, Attempt::Status { status: s, .. } if *s == status))
            .count()
    }

    /// The attempts in one line, e.g. `timeout(500ms) 409(retry-after 1, 2ms) 200(3ms)`.
    pub(crate) fn summary(&self) -> String {
        let parts: Vec<String> = self
            .attempts
            .iter()
            .map(|a| match a {
                Attempt::Timeout(after) => format!("timeout({after:?})"),
                Attempt::Transport(e) => format!("error({e})"),
                Attempt::Status {
                    status,
                    retry_after: Some(ra),
                    latency,
                } => format!("{status}(retry-after {ra}, {latency:?})"),
                Attempt::Status {
                    status, latency, ..
                } => format!("{status}({latency:?})"),
            })
            .collect();
        parts.join(" ")
    }

    /// How many attempts timed out.
    pub(crate) fn timeouts(&self) -> usize {
        self.attempts
            .iter()
            .filter(|a| matches!(a, Attempt::Timeout(_)))
            .count()
    }
}

/// The retrying client's settings.
#[derive(Clone, Debug)]
pub(crate) struct RetryPolicy {
    /// Per-attempt timeout (whole request and body).
    pub attempt_timeout: Duration,
    /// The first backoff; doubled after each failed attempt.
    pub initial_backoff: Duration,
    /// The backoff's cap.
    pub max_backoff: Duration,
    /// `Retry-After` is honoured up to this (so that tests stay fast).
    pub retry_after_cap: Duration,
    /// The overall deadline: the client gives up (the test fails) past it.
    pub deadline: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempt_timeout: Duration::from_secs(10),
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(400),
            retry_after_cap: Duration::from_millis(300),
            deadline: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// With this per-attempt timeout.
    pub(crate) fn attempt_timeout(mut self, timeout: Duration) -> RetryPolicy {
        self.attempt_timeout = timeout;
        self
    }

    /// With this overall deadline.
    pub(crate) fn deadline(mut self, deadline: Duration) -> RetryPolicy {
        self.deadline = deadline;
        self
    }

    /// The pause before attempt `failed + 1`: exponential with "equal jitter", never less
    /// than the (capped) `Retry-After` the server asked for.
    fn pause(&self, failed: u32, retry_after: Option<Duration>) -> Duration {
        let exp = self
            .initial_backoff
            .saturating_mul(1u32 << failed.saturating_sub(1).min(16))
            .min(self.max_backoff);
        let half = exp / 2;
        let jitter_ms = u64::try_from(half.as_millis()).unwrap_or(u64::MAX).max(1);
        let backoff = half + Duration::from_millis(random_u64() % jitter_ms);
        match retry_after {
            Some(ra) => backoff.max(ra.min(self.retry_after_cap)),
            None => backoff,
        }
    }
}

/// Whether an answer with this status is retried (with the same key).
pub(crate) fn is_retryable(status: StatusCode) -> bool {
    status == StatusCode::CONFLICT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}

/// An HTTP client for one server.
#[derive(Clone)]
pub(crate) struct Api {
    http: reqwest::Client,
    base_url: String,
}

impl Api {
    /// A client for the server at `base_url`.
    pub(crate) fn new(base_url: &str) -> Api {
        let http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(Duration::from_secs(2))
            .build()
            .expect("cannot build the reqwest client");
        Api {
            http,
            base_url: base_url.to_owned(),
        }
    }

    /// One attempt of `req`, no retry.
    pub(crate) async fn send_once(
        &self,
        req: &ChargeRequest,
        timeout: Duration,
    ) -> Result<Reply, reqwest::Error> {
        let mut builder = self
            .http
            .post(format!("{}/v1/charges", self.base_url))
            .timeout(timeout);
        if let Some(key) = &req.key {
            builder = builder.header("Idempotency-Key", key);
        }
        if let Some(api_key) = &req.api_key {
            builder = if req.basic_auth {
                builder.basic_auth(api_key, Some(""))
            } else {
                builder.bearer_auth(api_key)
            };
        }
        if let Some(ms) = req.delay_ms {
            builder = builder.header("X-Test-Delay-Ms", ms.to_string());
        }
        if let Some(fault) = req.network_fault {
            builder = builder.header("X-Test-Network", fault.header());
        }
        builder = match &req.body {
            Body::Form(fields) => builder.form(fields),
            Body::Json(value) => builder.json(value),
        };
        Reply::fetch(builder).await
    }

    /// One attempt of `req` that must get an answer (no transport error, no timeout).
    pub(crate) async fn post_raw(&self, req: &ChargeRequest) -> Reply {
        self.send_once(req, Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("POST /v1/charges failed: {}", error_chain(&e)))
    }

    /// `req` the way a production client sends it: retried with the same key on timeouts,
    /// connection errors, 409, 429 and 5xx, with capped exponential backoff honouring
    /// `Retry-After`; panics (with every attempt) past the policy's deadline.
    pub(crate) async fn post_charge(&self, req: &ChargeRequest, policy: &RetryPolicy) -> Outcome {
        let started = Instant::now();
        let mut attempts = Vec::new();
        let mut last_reply: Option<Reply> = None;
        let mut failed: u32 = 0;
        loop {
            let remaining = policy.deadline.saturating_sub(started.elapsed());
            let timeout = policy.attempt_timeout.min(remaining);
            let retry_after = match self.send_once(req, timeout).await {
                Ok(reply) => {
                    attempts.push(Attempt::Status {
                        status: reply.status.as_u16(),
                        retry_after: reply.header("retry-after"),
                        latency: reply.latency,
                    });
                    if !is_retryable(reply.status) {
                        return Outcome { reply, attempts };
                    }
                    let retry_after = reply.retry_after();
                    last_reply = Some(reply);
                    retry_after
                }
                Err(e) if e.is_timeout() => {
                    attempts.push(Attempt::Timeout(timeout));
                    None
                }
                Err(e) => {
                    attempts.push(Attempt::Transport(error_chain(&e)));
                    None
                }
            };
            failed += 1;
            let pause = policy.pause(failed, retry_after);
            if started.elapsed() + pause >= policy.deadline {
                panic!(
                    "the retrying client gave up on key {:?}: no final answer within its deadline \
                     of {:?} after {} attempts; attempts: {attempts:#?}; last answer: {}",
                    req.key,
                    policy.deadline,
                    attempts.len(),
                    last_reply
                        .as_ref()
                        .map(Reply::describe)
                        .unwrap_or_else(|| "none".to_owned())
                );
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// `GET path` (authenticated), which must get an answer.
    pub(crate) async fn get(&self, path: &str) -> Reply {
        let request = self
            .http
            .get(format!("{}{path}", self.base_url))
            .bearer_auth(API_KEY)
            .timeout(Duration::from_secs(10));
        Reply::fetch(request)
            .await
            .unwrap_or_else(|e| panic!("GET {path} failed: {}", error_chain(&e)))
    }

    /// One request of `method` to `path` with `headers` and `body` (no authentication unless
    /// a header gives it), which must get an answer.
    pub(crate) async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Reply {
        let mut request = self
            .http
            .request(method.clone(), format!("{}{path}", self.base_url))
            .timeout(Duration::from_secs(10))
            .body(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        Reply::fetch(request)
            .await
            .unwrap_or_else(|e| panic!("{method} {path} failed: {}", error_chain(&e)))
    }

    /// A charge (`POST /v1/charges`, authenticated) sent with `method` spelled as given,
    /// `content_type` and `body`, under `key`.
    pub(crate) async fn charge_as(
        &self,
        method: &str,
        key: &str,
        content_type: &str,
        body: &str,
    ) -> Reply {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method token");
        let bearer = format!("Bearer {API_KEY}");
        let headers = [
            ("authorization", bearer.as_str()),
            ("idempotency-key", key),
            ("content-type", content_type),
        ];
        self.send(method, "/v1/charges", &headers, body.as_bytes().to_vec())
            .await
    }

    /// The authorizations the server's card network made (`GET
    /// /test/network/authorizations/count`).
    pub(crate) async fn authorization_count(&self) -> u64 {
        let reply = self.get("/test/network/authorizations/count").await;
        assert_eq!(
            reply.status,
            StatusCode::OK,
            "GET /test/network/authorizations/count: {}",
            reply.describe()
        );
        reply.json()["count"].as_u64().unwrap_or_else(|| {
            panic!(
                "GET /test/network/authorizations/count: no non-negative integer `count`: {}",
                reply.describe()
            )
        })
    }

    /// One reconciliation pass now (`POST /test/reconcile`): its report (`checked`, `settled`,
    /// `released`, `deferred`, `contested`, `failed`).
    pub(crate) async fn reconcile(&self) -> Value {
        let reply = self
            .send(reqwest::Method::POST, "/test/reconcile", &[], Vec::new())
            .await;
        assert_eq!(
            reply.status,
            StatusCode::OK,
            "POST /test/reconcile: {}",
            reply.describe()
        );
        let report = reply.json();
        assert!(
            report["checked"].is_u64(),
            "POST /test/reconcile: no report: {}",
            reply.describe()
        );
        report
    }

    /// The committed rows in the charges table (`GET /test/charges/count`).
    pub(crate) async fn charge_count(&self) -> u64 {
        let reply = self.get("/test/charges/count").await;
        assert_eq!(
            reply.status,
            StatusCode::OK,
            "GET /test/charges/count (is IDEM_TEST_HOOKS=1 honoured?): {}",
            reply.describe()
        );
        reply.json()["count"].as_u64().unwrap_or_else(|| {
            panic!(
                "GET /test/charges/count: no non-negative integer `count`: {}",
                reply.describe()
            )
        })
    }
}

// ------------------------------------------------------------------------------------------
// Assertions
// ------------------------------------------------------------------------------------------

/// Asserts `reply` is a 200 charge of `amount` in `currency`; returns its JSON.
pub(crate) fn assert_charge(reply: &Reply, amount: i64, currency: &str) -> Value {
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "expected a 200 charge: {}",
        reply.describe()
    );
    let charge = reply.json();
    let id = charge["id"]
        .as_str()
        .unwrap_or_else(|| panic!("the charge has no string `id`: {}", reply.describe()));
    assert!(
        id.starts_with("ch_"),
        "the charge id {id:?} does not start with ch_: {}",
        reply.describe()
    );
    assert_eq!(charge["object"], "charge", "{}", reply.describe());
    assert_eq!(
        charge["amount"].as_i64(),
        Some(amount),
        "{}",
        reply.describe()
    );
    assert_eq!(
        charge["currency"].as_str(),
        Some(currency),
        "{}",
        reply.describe()
    );
    assert!(
        charge["created"]
            .as_i64()
            .is_some_and(|c| c > 1_500_000_000),
        "`created` is not unix seconds: {}",
        reply.describe()
    );
    charge
}

/// Asserts a Stripe-shaped error: `status`, `error.type` = `kind`, `error.code` = `code`
/// Asserts `reply` is a 503 with `Retry-After` and a Stripe-shaped error (`error.type`);
/// `what` says which request, in the messages.
pub(crate) fn assert_unavailable(reply: &Reply, what: &str) {
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{what}: a 503: {}",
        reply.describe()
    );
    assert!(
        reply.header("retry-after").is_some(),
        "{what}: the 503 carries Retry-After: {}",
        reply.describe()
    );
    assert!(
        reply.json()["error"]["type"].is_string(),
        "{what}: a Stripe-shaped error: {}",
        reply.describe()
    );
}

/// (when given), a string `error.message`; returns the JSON.
pub(crate) fn assert_error(reply: &Reply, status: u16, kind: &str, code: Option<&str>) -> Value {
    assert_eq!(
        reply.status.as_u16(),
        status,
        "unexpected status: {}",
        reply.describe()
    );
    let body = reply.json();
    let error = &body["error"];
    assert!(
        error.is_object(),
        "no `error` object in the body: {}",
        reply.describe()
    );
    assert_eq!(
        error["type"].as_str(),
        Some(kind),
        "error.type: {}",
        reply.describe()
    );
    if let Some(code) = code {
        assert_eq!(
            error["code"].as_str(),
            Some(code),
            "error.code: {}",
            reply.describe()
        );
    }
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "error.message missing or empty: {}",
        reply.describe()
    );
    body
}

/// Asserts the 409 of a duplicate of a running request: at once (< 1 s), `Retry-After`,
/// an idempotency error body, and no `Stripe-Should-Retry: false`.
pub(crate) fn assert_in_flight_conflict(reply: &Reply) {
    assert_error(reply, 409, "idempotency_error", None);
    assert!(
        reply.latency < Duration::from_secs(1),
        "the 409 took {:?} (must come at once, well under a second): {}",
        reply.latency,
        reply.describe()
    );
    let retry_after = reply
        .header("retry-after")
        .unwrap_or_else(|| panic!("the 409 has no Retry-After: {}", reply.describe()));
    assert!(
        retry_after.trim().parse::<u64>().is_ok(),
        "Retry-After {retry_after:?} is not delta-seconds: {}",
        reply.describe()
    );
    assert!(
        !reply
            .header("stripe-should-retry")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("false")),
        "a 409 must never say Stripe-Should-Retry: false: {}",
        reply.describe()
    );
    assert!(
        !reply.replayed(),
        "a 409 is not a replay: {}",
        reply.describe()
    );
}

// ------------------------------------------------------------------------------------------
// Requests in flight
// ------------------------------------------------------------------------------------------

/// A request running on a task of its own: its answer, or its transport error as text.
pub(crate) type Flight = tokio::task::JoinHandle<Result<Reply, String>>;

/// Sends `req` once on a task of its own (no retry), with a long timeout.
pub(crate) fn spawn_once(api: &Api, req: &ChargeRequest) -> Flight {
    let api = api.clone();
    let req = req.clone();
    tokio::spawn(async move {
        api.send_once(&req, Duration::from_secs(60))
            .await
            .map_err(|e| error_chain(&e))
    })
}

/// A 409 seen while one identical request runs, and the requests still in flight (the one
/// executing among them).
pub(crate) struct InFlight {
    /// The first 409 answer.
    pub conflict: Reply,
    /// The requests not finished when the 409 came.
    pub pending: Vec<Flight>,
}

/// Sends `req` (which should be slow: `X-Test-Delay-Ms`) on a task of its own, then an
/// identical duplicate every `every` until one of them gets a 409 — whichever of them reached
/// the server first is the executing one. Panics if any gets another answer first, or if no
/// 409 comes within `within`.
pub(crate) async fn fire_until_conflict(
    api: &Api,
    req: &ChargeRequest,
    every: Duration,
    within: Duration,
) -> InFlight {
    let started = Instant::now();
    let mut pending = vec![spawn_once(api, req)];
    let mut next_fire = started + every;
    loop {
        if let Some(i) = pending.iter().position(|f| f.is_finished()) {
            let result = pending
                .remove(i)
                .await
                .expect("a spawned request task panicked");
            match result {
                Ok(reply) if reply.status == StatusCode::CONFLICT => {
                    return InFlight {
                        conflict: reply,
                        pending,
                    }
                }
                Ok(reply) => panic!(
                    "while waiting for a duplicate of the running request {:?} to get a 409, one \
                     got another answer: {}",
                    req.key,
                    reply.describe()
                ),
                Err(e) => panic!(
                    "while waiting for a duplicate of the running request {:?} to get a 409, one \
                     failed: {e}",
                    req.key
                ),
            }
        }
        assert!(
            started.elapsed() < within,
            "no duplicate of the running request {:?} got a 409 within {within:?} ({} sent)",
            req.key,
            pending.len()
        );
        if Instant::now() >= next_fire {
            pending.push(spawn_once(api, req));
            next_fire += every;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Awaits every flight, each within `within` overall.
pub(crate) async fn land_all(flights: Vec<Flight>, within: Duration) -> Vec<Result<Reply, String>> {
    let deadline = tokio::time::Instant::now() + within;
    let mut out = Vec::new();
    for flight in flights {
        match tokio::time::timeout_at(deadline, flight).await {
            Ok(joined) => out.push(joined.expect("a spawned request task panicked")),
            Err(_) => panic!("a request in flight did not finish within {within:?}"),
        }
    }
    out
}
