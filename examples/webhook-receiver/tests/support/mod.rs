//! Test support for the end-to-end tests: a per-test temp dir with its SQLite file, the
//! receiver as a real child process on a free port that is always killed, Stripe-shaped
//! events, and a sender that signs and retries like Stripe (a fresh `t` per attempt; 409 and
//! 5xx delivered again, honouring `Retry-After`; every 2xx final).

#![allow(dead_code)]

pub(crate) use e2e_support::{error_chain, random_u64, Reply, ServerProcess};

use idem::inbox::SignatureScheme;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tokio::process::Command;

/// How long a server may take to print its `listening on` line.
const STARTUP_DEADLINE: Duration = Duration::from_secs(60);

/// Shuffles `items` in place (Fisher-Yates).
pub(crate) fn shuffle<T>(items: &mut [T]) {
    for i in (1..items.len()).rev() {
        let j = (random_u64() % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

/// The current unix time in seconds.
pub(crate) fn now_unix() -> i64 {
    idem::inbox::now_unix()
}

// ------------------------------------------------------------------------------------------
// Environment and the server process
// ------------------------------------------------------------------------------------------

/// One test's world: a temp dir (server logs, the SQLite file), removed on drop.
pub(crate) struct TestEnv {
    /// The temp dir (under `std::env::temp_dir()`).
    pub dir: PathBuf,
    /// What the server gets as `--database`.
    pub database: String,
    servers: AtomicU32,
}

impl TestEnv {
    /// A fresh environment for the test `test`.
    pub(crate) fn new(test: &str) -> TestEnv {
        let dir = std::env::temp_dir().join(format!(
            "idem-webhooks-{test}-{}-{:016x}",
            std::process::id(),
            random_u64()
        ));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create the temp dir {}: {e}", dir.display()));
        let database = dir.join("webhooks.db").display().to_string();
        TestEnv {
            dir,
            database,
            servers: AtomicU32::new(0),
        }
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A running `webhook-receiver` child process with the test hooks on ([`ServerProcess`]:
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

/// How a server process ended before it listened.
pub(crate) struct Refused {
    /// Its exit status.
    pub status: ExitStatus,
    /// Its stderr.
    pub stderr: String,
}

fn command(env: &TestEnv, secrets: Option<&str>) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_webhook-receiver"));
    cmd.arg("--addr")
        .arg("127.0.0.1:0")
        .arg("--database")
        .arg(&env.database)
        .env("IDEM_TEST_HOOKS", "1")
        .env("RUST_LOG", "info,idem=warn")
        .env_remove("IDEM_ADDR")
        .env_remove("DATABASE_URL")
        .env_remove("IDEM_LEASE_MS")
        .env_remove("IDEM_AUDIT_RETENTION_DAYS")
        .env_remove("WEBHOOK_SECRET")
        .env_remove("STANDARD_WEBHOOK_SECRET")
        .env_remove("GITHUB_WEBHOOK_SECRET")
        .env_remove("SHOPIFY_WEBHOOK_SECRET")
        .env_remove("IDEM_HEADER_TIMEOUT_MS")
        .env_remove("IDEM_BODY_TIMEOUT_MS")
        .env_remove("IDEM_MAX_CONNECTIONS")
        .env_remove("IDEM_MAX_BUFFERED_BODY_BYTES")
        .current_dir(&env.dir);
    if let Some(secrets) = secrets {
        cmd.env("WEBHOOK_SECRET", secrets);
    }
    cmd
}

impl Server {
    /// Starts the receiver on `env`'s database with `WEBHOOK_SECRET=secrets` and the test
    /// hooks on, `--addr 127.0.0.1:0`; waits for its `listening on http://127.0.0.1:PORT`.
    pub(crate) async fn start(env: &TestEnv, secrets: &str) -> Server {
        Server::start_with(env, secrets, &[]).await
    }

    /// [`Server::start`] with more settings in the environment (`IDEM_HEADER_TIMEOUT_MS`,
    /// ...).
    pub(crate) async fn start_with(env: &TestEnv, secrets: &str, vars: &[(&str, &str)]) -> Server {
        let index = env.servers.fetch_add(1, Ordering::Relaxed);
        let log = env.dir.join(format!("server-{index}.log"));
        let mut command = command(env, Some(secrets));
        command.envs(vars.iter().copied());
        Server(ServerProcess::start("webhook-receiver", command, log, &env.database).await)
    }

    /// Starts the receiver with `WEBHOOK_SECRET` unset; it must exit before listening.
    pub(crate) async fn start_without_secret(env: &TestEnv) -> Refused {
        let log = env.dir.join("refused.log");
        let log_file = std::fs::File::create(&log).expect("the log file");
        let child = command(env, None)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the receiver: {e}"));
        let output = tokio::time::timeout(STARTUP_DEADLINE, child.wait_with_output())
            .await
            .expect("the receiver without a secret did not exit")
            .expect("waiting for the receiver");
        assert!(
            !String::from_utf8_lossy(&output.stdout).contains("listening on"),
            "the receiver listened without a secret"
        );
        Refused {
            status: output.status,
            stderr: std::fs::read_to_string(&log).unwrap_or_default(),
        }
    }

    /// A sender (Stripe) for this server.
    pub(crate) fn sender(&self) -> Sender {
        Sender::new(&self.base_url)
    }
}

// ------------------------------------------------------------------------------------------
// Events
// ------------------------------------------------------------------------------------------

/// A Stripe-shaped event body, serialised once: every delivery of it sends these bytes.
#[derive(Clone, Debug)]
pub(crate) struct Event {
    /// `evt_...`.
    pub id: String,
    /// The raw body.
    pub body: Vec<u8>,
}

impl Event {
    /// A `payment_intent.succeeded` for `order_id` of `amount` euro cents.
    pub(crate) fn payment_succeeded(id: &str, order_id: &str, amount: i64) -> Event {
        Event::from_json(json!({
            "id": id,
            "object": "event",
            "api_version": "2024-06-20",
            "created": now_unix(),
            "data": {"object": {
                "id": format!("pi_{id}"),
                "object": "payment_intent",
                "amount": amount,
                "amount_received": amount,
                "currency": "eur",
                "metadata": {"order_id": order_id},
                "status": "succeeded",
            }},
            "livemode": false,
            "pending_webhooks": 1,
            "request": {"id": null, "idempotency_key": null},
            "type": "payment_intent.succeeded",
        }))
    }

    /// An event of `kind` about a customer.
    pub(crate) fn other(id: &str, kind: &str) -> Event {
        Event::from_json(json!({
            "id": id,
            "object": "event",
            "created": now_unix(),
            "data": {"object": {"id": format!("cus_{id}"), "object": "customer"}},
            "livemode": false,
            "type": kind,
        }))
    }

    /// An event with this exact JSON body.
    pub(crate) fn from_json(body: Value) -> Event {
        Event {
            id: body["id"].as_str().unwrap_or_default().to_owned(),
            body: serde_json::to_vec(&body).expect("json"),
        }
    }
}

/// A fresh event id, unique across tests and runs.
pub(crate) fn new_event_id(label: &str) -> String {
    format!("evt_{label}_{:016x}", random_u64())
}

/// The amount of seeded order `ord_n` (see src/shop.rs): the unit price of product
/// `(n - 1) mod 4` times `1 + (n - 1) mod 3`.
pub(crate) fn order_amount(n: u32) -> i64 {
    const UNIT: [i64; 4] = [850, 1200, 4500, 3200];
    UNIT[(n as usize - 1) % 4] * (1 + i64::from((n - 1) % 3))
}

/// The quantity of seeded order `ord_n`.
pub(crate) fn order_quantity(n: u32) -> i64 {
    1 + i64::from((n - 1) % 3)
}

// ------------------------------------------------------------------------------------------
// HTTP
// ------------------------------------------------------------------------------------------

/// What one delivery (with its retries) ended with.
#[derive(Debug)]
pub(crate) struct Delivered {
    /// The final answer (a 2xx, or a 4xx other than 409).
    pub reply: Reply,
    /// The status of every attempt that got an answer, the last one included.
    pub statuses: Vec<u16>,
    /// Attempts that got no answer (connection errors).
    pub transport_errors: u32,
}

/// Sends events to one receiver as Stripe does.
#[derive(Clone)]
pub(crate) struct Sender {
    http: reqwest::Client,
    base_url: String,
}

impl Sender {
    /// A sender for the receiver at `base_url`.
    pub(crate) fn new(base_url: &str) -> Sender {
        let http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(Duration::from_secs(2))
            .build()
            .expect("cannot build the reqwest client");
        Sender {
            http,
            base_url: base_url.to_owned(),
        }
    }

    /// One `POST /webhooks/stripe` of `body` with `Stripe-Signature: signature` (none when
    /// `None`) and the extra `headers`; no retry.
    pub(crate) async fn post(
        &self,
        body: &[u8],
        signature: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Result<Reply, String> {
        self.post_within(body, signature, headers, Duration::from_secs(30))
            .await
    }

    /// [`Sender::post`] that gives up (and hangs up) after `timeout`.
    pub(crate) async fn post_within(
        &self,
        body: &[u8],
        signature: Option<&str>,
        headers: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<Reply, String> {
        let mut request = self
            .http
            .post(format!("{}/webhooks/stripe", self.base_url))
            .header("content-type", "application/json; charset=utf-8")
            .header(
                "user-agent",
                "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
            )
            .timeout(timeout)
            .body(body.to_vec());
        if let Some(signature) = signature {
            request = request.header("stripe-signature", signature);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        Reply::fetch(request).await.map_err(|e| error_chain(&e))
    }

    /// One attempt of `event`, signed now with `scheme`'s first secret.
    pub(crate) async fn deliver_once(&self, event: &Event, scheme: &SignatureScheme) -> Reply {
        let signature = scheme.sign(&event.body, now_unix());
        self.post(&event.body, Some(&signature), &[])
            .await
            .unwrap_or_else(|e| panic!("delivering {} failed: {e}", event.id))
    }

    /// Delivers `event` until the receiver answers other than 409 or 5xx, re-signing each
    /// attempt with a fresh timestamp, as Stripe does; backs off (Retry-After honoured up to
    /// 200 ms, so that tests stay fast). Panics past `deadline`.
    pub(crate) async fn deliver(
        &self,
        event: &Event,
        scheme: &SignatureScheme,
        deadline: Duration,
    ) -> Delivered {
        let started = Instant::now();
        let mut statuses = Vec::new();
        let mut transport_errors = 0;
        let mut backoff = Duration::from_millis(10);
        loop {
            let signature = scheme.sign(&event.body, now_unix());
            let retry_after = match self.post(&event.body, Some(&signature), &[]).await {
                Ok(reply) => {
                    statuses.push(reply.status.as_u16());
                    let retry =
                        reply.status == StatusCode::CONFLICT || reply.status.is_server_error();
                    if !retry {
                        return Delivered {
                            reply,
                            statuses,
                            transport_errors,
                        };
                    }
                    reply.retry_after()
                }
                Err(error) => {
                    transport_errors += 1;
                    eprintln!("delivery of {} failed, retrying: {error}", event.id);
                    None
                }
            };
            assert!(
                started.elapsed() < deadline,
                "{} was not acknowledged within {deadline:?}: statuses {statuses:?}, {transport_errors} transport errors",
                event.id
            );
            let jitter = Duration::from_millis(random_u64() % 10);
            let pause = backoff.max(
                retry_after
                    .unwrap_or_default()
                    .min(Duration::from_millis(200)),
            );
            tokio::time::sleep(pause + jitter).await;
            backoff = (backoff * 2).min(Duration::from_millis(200));
        }
    }

    async fn get(&self, path: &str) -> Reply {
        self.send(reqwest::Method::GET, path, Vec::new()).await
    }

    /// `GET path`, which must answer 200 with JSON.
    pub(crate) async fn get_json(&self, path: &str) -> Value {
        let reply = self.get(path).await;
        assert_eq!(
            reply.status,
            StatusCode::OK,
            "GET {path}: {}",
            reply.describe()
        );
        reply.json()
    }

    /// `GET path`, whatever it answers.
    pub(crate) async fn get_reply(&self, path: &str) -> Reply {
        self.get(path).await
    }

    /// One request of `method` to `path` with `body`, whatever it answers.
    pub(crate) async fn send(&self, method: reqwest::Method, path: &str, body: Vec<u8>) -> Reply {
        let request = self
            .http
            .request(method.clone(), format!("{}{path}", self.base_url))
            .timeout(Duration::from_secs(10))
            .body(body);
        Reply::fetch(request)
            .await
            .unwrap_or_else(|e| panic!("{method} {path} failed: {}", error_chain(&e)))
    }

    /// The invoices committed (`GET /test/invoices/count`).
    pub(crate) async fn invoice_count(&self) -> u64 {
        self.get_json("/test/invoices/count").await["count"]
            .as_u64()
            .expect("a count")
    }

    /// The units the invoices took from stock (`GET /test/invoices/count`).
    pub(crate) async fn units_sold(&self) -> i64 {
        self.get_json("/test/invoices/count").await["units_sold"]
            .as_i64()
            .expect("units_sold")
    }

    /// Stripe's audit trail (`GET /test/audit?source=stripe`).
    pub(crate) async fn audit(&self) -> Vec<Value> {
        let page = self.get_json("/test/audit?source=stripe").await;
        page["entries"].as_array().cloned().expect("entries")
    }

    /// The audit entry of `event_id`, if any.
    pub(crate) async fn audit_entry(&self, event_id: &str) -> Option<Value> {
        self.audit()
            .await
            .into_iter()
            .find(|e| e["event_id"].as_str() == Some(event_id))
    }
}

/// Asserts `reply` is a problem (RFC 9457) of `status` and `kind`.
pub(crate) fn assert_problem(reply: &Reply, status: u16, kind: &str) {
    assert_eq!(reply.status.as_u16(), status, "{}", reply.describe());
    assert_eq!(
        reply.header("content-type").as_deref(),
        Some("application/problem+json"),
        "{}",
        reply.describe()
    );
    assert_eq!(reply.problem_kind(), kind, "{}", reply.describe());
    assert_eq!(reply.json()["status"], status, "{}", reply.describe());
}
