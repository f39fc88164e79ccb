//! The two example binaries together, as a new user runs them (C17): the payments server with
//! `--webhook-url http://127.0.0.1:PORT/webhooks/standard --webhook-secret whsec_...` and the
//! webhook receiver with `STANDARD_WEBHOOK_SECRET` set to the same secret. Each succeeded charge
//! is delivered through the outbox as one `charge.succeeded`, verified by the receiver and
//! processed there once (one row in its `received_events`, one entry in its audit trail, and
//! its effect: the charge marked paid once in the receiver's `paid_charges`), with the
//! message's stable id as `webhook-id`: after a replay of the request, after an outage of the
//! receiver, and after the server was killed between the receiver's answer and the attempt's
//! record; signed with both secrets during a rotation. On SQLite and on PostgreSQL.
//!
//! What each side shows: the server's outbox (its database: the message's id, its payload,
//! its delivery's state and attempts) and the receiver's test hooks (`GET /test/events/count`:
//! the event's executions; `GET /test/paid-charges`: each charge marked paid and how many
//! times; `GET /test/audit`: its id as received in `webhook-id`, its deliveries, its outcome). The receiver verifies the signature over the body before it
//! records anything, so an event processed under the message's id is the message's payload.
//!
//! The receiver is the binary cargo built beside this test: `cargo build -p webhook-receiver`
//! first (`cargo test --workspace` builds it).
//!
//! The outage test gives the server a short retry schedule (`--test-webhook-schedule-ms`, a
//! test hook) instead of the default one (at once, then 5 s ±20 %, then 5 min, ...), so the
//! receiver stays down through several attempts and the test waits a second, not minutes.

#[macro_use]
mod support;

use e2e_support::poll;
use fault_proxy::{Fault, FaultProxy};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};
use support::*;
use tokio::process::Command;

/// The endpoint's Standard Webhooks secret, given to both binaries.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The receiver's inbox source for Standard Webhooks.
const SOURCE: &str = "standard-webhooks";

/// How long a delivery may take to be processed when nothing fails (first attempt at once).
const DELIVERED_WITHIN: Duration = Duration::from_secs(10);

// ------------------------------------------------------------------------------------------
// The receiver
// ------------------------------------------------------------------------------------------

/// The `webhook-receiver` binary cargo built beside this test, refused when older than the
/// receiver's sources (a stale receiver would prove nothing).
fn receiver_binary() -> PathBuf {
    let how = "run `cargo build -p webhook-receiver` first (`cargo test --workspace` builds it)";
    // This test runs as target/<profile>/deps/<name>-<hash>.
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let path = profile.join(format!("webhook-receiver{}", std::env::consts::EXE_SUFFIX));
    let built = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("{} is not built ({e}): {how}", path.display()));
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("../webhook-receiver/src");
    let entries = std::fs::read_dir(&sources)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", sources.display()));
    for entry in entries.flatten() {
        let changed = entry
            .metadata()
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        assert!(
            changed <= built,
            "{} is older than {}: {how}",
            path.display(),
            entry.path().display()
        );
    }
    path
}

/// The receiver as a child process on the test's own SQLite file (kept across restarts), with
/// the Standard Webhooks route and the test hooks on.
struct Receiver {
    process: ServerProcess,
    http: reqwest::Client,
}

/// Counts the receivers a test started (their log files).
static RECEIVERS: AtomicU32 = AtomicU32::new(0);

impl Receiver {
    /// Starts it on `port` (0: a free one), verifying with [`SECRET`].
    async fn start(env: &TestEnv, port: u16) -> Receiver {
        Receiver::start_verifying(env, port, SECRET).await
    }

    /// Starts it on `port` (0: a free one), verifying with `secrets`.
    async fn start_verifying(env: &TestEnv, port: u16, secrets: &str) -> Receiver {
        let index = RECEIVERS.fetch_add(1, Ordering::Relaxed);
        let log = env.dir.join(format!("receiver-{index}.log"));
        let mut cmd = Command::new(receiver_binary());
        cmd.arg("--addr")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--database")
            .arg(env.dir.join("webhooks.db"))
            .env("STANDARD_WEBHOOK_SECRET", secrets)
            .env("IDEM_TEST_HOOKS", "1")
            .env("RUST_LOG", "info,idem=warn")
            .env_remove("WEBHOOK_SECRET")
            .env_remove("GITHUB_WEBHOOK_SECRET")
            .env_remove("SHOPIFY_WEBHOOK_SECRET")
            .env_remove("IDEM_ADDR")
            .env_remove("DATABASE_URL")
            .env_remove("IDEM_LEASE_MS")
            .env_remove("IDEM_AUDIT_RETENTION_DAYS")
            .env_remove("IDEM_HEADER_TIMEOUT_MS")
            .env_remove("IDEM_BODY_TIMEOUT_MS")
            .env_remove("IDEM_MAX_CONNECTIONS")
            .env_remove("IDEM_MAX_BUFFERED_BODY_BYTES")
            .current_dir(&env.dir);
        let process = ServerProcess::start("webhook-receiver", cmd, log, "SQLite").await;
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("a reqwest client");
        Receiver { process, http }
    }

    /// Its port.
    fn port(&self) -> u16 {
        self.process
            .addr()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a port")
    }

    /// Where the payments server delivers.
    fn webhook_url(&self) -> String {
        self.process.url("/webhooks/standard")
    }

    async fn get_json(&self, path: &str) -> Value {
        let reply = Reply::fetch(
            self.http
                .get(self.process.url(path))
                .timeout(Duration::from_secs(10)),
        )
        .await
        .unwrap_or_else(|e| panic!("GET {path} on the receiver: {}", error_chain(&e)));
        assert_eq!(
            reply.status.as_u16(),
            200,
            "GET {path}: {}",
            reply.describe()
        );
        reply.json()
    }

    /// How many times events ran (rows of `received_events`) and how many distinct ids.
    async fn executions(&self) -> (u64, u64) {
        let counts = self
            .get_json(&format!("/test/events/count?source={SOURCE}"))
            .await;
        (
            counts["count"].as_u64().expect("count"),
            counts["distinct"].as_u64().expect("distinct"),
        )
    }

    /// The charges the receiver marked paid: charge id -> (event id, event type, times
    /// processed).
    async fn paid_charges(&self) -> Vec<(String, String, String, u64)> {
        let paid = self.get_json("/test/paid-charges").await;
        paid["charges"]
            .as_array()
            .expect("charges")
            .iter()
            .map(|c| {
                (
                    c["charge_id"].as_str().expect("charge_id").to_owned(),
                    c["event_id"].as_str().expect("event_id").to_owned(),
                    c["event_type"].as_str().expect("event_type").to_owned(),
                    c["processed"].as_u64().expect("processed"),
                )
            })
            .collect()
    }

    /// The audit trail of the Standard Webhooks route.
    async fn audit(&self) -> Vec<Value> {
        self.get_json(&format!("/test/audit?source={SOURCE}")).await["entries"]
            .as_array()
            .cloned()
            .expect("entries")
    }
}

// ------------------------------------------------------------------------------------------
// The server's outbox, read from its database
// ------------------------------------------------------------------------------------------

/// One delivery in the server's outbox.
#[derive(Debug, Clone)]
struct Delivery {
    /// The message's stable id, `msg_...`.
    message_id: String,
    /// The payload's `type`.
    event_type: String,
    /// The payload's `data.object.id`.
    charge_id: String,
    /// pending, delivered or dead.
    state: String,
    /// Attempts started (claimed), recorded or not.
    attempts: i64,
    /// The last recorded status.
    last_status: Option<i64>,
    /// The last recorded error.
    last_error: Option<String>,
}

const DELIVERIES: &str = "SELECT message_id, payload, state, CAST(attempts AS BIGINT), \
                          CAST(last_status AS BIGINT), last_error \
                          FROM idem_outbox_deliveries ORDER BY id";

/// A delivery's row: message id, payload, state, attempts, last status, last error.
type Row = (String, Vec<u8>, String, i64, Option<i64>, Option<String>);

/// Every delivery in the server's outbox (`env.database`), oldest first.
async fn outbox(env: &TestEnv) -> Vec<Delivery> {
    let rows: Vec<Row> = match env.backend {
        Backend::Sqlite => {
            let file = env.database.clone();
            tokio::task::spawn_blocking(move || {
                use idem::sqlite::rusqlite::{Connection, OpenFlags};
                let db = Connection::open_with_flags(&file, OpenFlags::SQLITE_OPEN_READ_ONLY)
                    .unwrap_or_else(|e| panic!("open {file}: {e}"));
                db.busy_timeout(Duration::from_secs(5))
                    .expect("busy timeout");
                let mut statement = db.prepare(DELIVERIES).expect("the outbox's table");
                let rows = statement
                    .query_map([], |row| {
                        Ok((
                            row.get(0)?,
                            row.get(1)?,
                            row.get(2)?,
                            row.get(3)?,
                            row.get(4)?,
                            row.get(5)?,
                        ))
                    })
                    .expect("the deliveries");
                rows.collect::<Result<Vec<_>, _>>().expect("the deliveries")
            })
            .await
            .expect("reading the outbox")
        }
        Backend::Postgres => {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(&env.database)
                .await
                .unwrap_or_else(|e| panic!("connect to the test's database: {e}"));
            let rows: Vec<Row> = sqlx::query_as(DELIVERIES)
                .fetch_all(&mut conn)
                .await
                .expect("the deliveries");
            let _ = conn.close().await;
            rows
        }
    };
    rows.into_iter()
        .map(
            |(message_id, payload, state, attempts, last_status, last_error)| {
                let event: Value = serde_json::from_slice(&payload).expect("a JSON payload");
                Delivery {
                    message_id,
                    event_type: event["type"].as_str().unwrap_or_default().to_owned(),
                    charge_id: event["data"]["object"]["id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    state,
                    attempts,
                    last_status,
                    last_error,
                }
            },
        )
        .collect()
}

/// The one message of `charge`: a `charge.succeeded` with the charge under `data.object`,
/// the only message in the outbox.
async fn the_message_of(env: &TestEnv, charge: &Value) -> Delivery {
    let deliveries = outbox(env).await;
    assert_eq!(
        deliveries.len(),
        1,
        "one charge, one message: {deliveries:#?}"
    );
    let delivery = deliveries[0].clone();
    assert!(
        delivery.message_id.starts_with("msg_"),
        "a stable id made at enqueue: {delivery:?}"
    );
    assert_eq!(delivery.event_type, "charge.succeeded", "{delivery:?}");
    assert_eq!(
        Some(delivery.charge_id.as_str()),
        charge["id"].as_str(),
        "{delivery:?}"
    );
    delivery
}

/// Waits up to `within` for the server to record the message's delivery as delivered.
async fn delivered(env: &TestEnv, within: Duration) -> Delivery {
    let every = Duration::from_millis(50);
    let tries = (within.as_millis() / every.as_millis()).max(1) as u32;
    let deliveries = poll(
        tries,
        every,
        || outbox(env),
        |d| d.len() == 1 && d[0].state == "delivered",
    )
    .await;
    assert!(
        deliveries.len() == 1 && deliveries[0].state == "delivered",
        "the message was not delivered within {within:?}: {deliveries:#?}"
    );
    deliveries[0].clone()
}

/// Asserts the receiver marked the charge of each of `messages` paid exactly once, by that
/// message (its `webhook-id`), and no other charge.
async fn assert_each_charge_paid_once(receiver: &Receiver, messages: &[Delivery]) {
    let mut expected: Vec<(String, String, String, u64)> = messages
        .iter()
        .map(|m| {
            (
                m.charge_id.clone(),
                m.message_id.clone(),
                "charge.succeeded".to_owned(),
                1,
            )
        })
        .collect();
    expected.sort();
    assert_eq!(
        receiver.paid_charges().await,
        expected,
        "each charge marked paid once, by its message (charge, event, type, times processed)"
    );
}

/// Asserts the receiver processed `message` once, having received it `deliveries` times
/// under its `webhook-id`, and nothing else: one execution, one audit entry, its charge marked
/// paid once.
async fn assert_processed_once(receiver: &Receiver, message: &Delivery, deliveries: u64) {
    let (executions, distinct) = receiver.executions().await;
    assert_eq!(
        (executions, distinct),
        (1, 1),
        "one event processed once (executions, distinct ids) for {message:?}"
    );
    let audit = receiver.audit().await;
    assert_eq!(audit.len(), 1, "one event in the audit trail: {audit:#?}");
    let entry = &audit[0];
    assert_eq!(
        entry["event_id"].as_str(),
        Some(message.message_id.as_str()),
        "the webhook-id the receiver keyed on is the message's stable id: {entry}"
    );
    assert_eq!(entry["outcome"], "processed", "{entry}");
    assert_eq!(
        entry["deliveries"].as_u64(),
        Some(deliveries),
        "deliveries of {}: {entry}",
        message.message_id
    );
    assert_eq!(
        entry["conflicts"], 0,
        "the same payload every time: {entry}"
    );
    assert_each_charge_paid_once(receiver, std::slice::from_ref(message)).await;
}

/// A succeeded charge of `amount` under a fresh key: the request and the charge.
async fn charge(server: &Server, amount: i64) -> (ChargeRequest, Value) {
    let request = ChargeRequest::form(&new_key("outbox-e2e"), amount);
    let reply = server.api().post_raw(&request).await;
    let charge = assert_charge(&reply, amount, "usd");
    assert_eq!(charge["status"], "succeeded", "{}", reply.describe());
    (request, charge)
}

/// The payments server with `--webhook-url url --webhook-secret SECRET`.
async fn start_with_flags(env: &TestEnv, url: &str, lease_ms: Option<u64>) -> Server {
    start_signing(env, url, lease_ms, SECRET).await
}

/// The payments server with `--webhook-url url --webhook-secret secrets`.
async fn start_signing(env: &TestEnv, url: &str, lease_ms: Option<u64>, secrets: &str) -> Server {
    Server::start_with_args(
        env,
        lease_ms,
        &["--webhook-url", url, "--webhook-secret", secrets],
    )
    .await
}

// ------------------------------------------------------------------------------------------
// The tests
// ------------------------------------------------------------------------------------------

/// A charge's `charge.succeeded` reaches the real receiver, which verifies it and processes it
/// once, keyed on the `webhook-id` that is the message's stable id.
async fn one_charge_one_event_processed_once(backend: Backend) {
    let env = TestEnv::new(backend, "outbox-e2e-once").await;
    let receiver = Receiver::start(&env, 0).await;
    let server = start_with_flags(&env, &receiver.webhook_url(), None).await;
    let started = Instant::now();
    let (_, charge) = charge(&server, 4242).await;
    let message = the_message_of(&env, &charge).await;
    let delivered = delivered(&env, DELIVERED_WITHIN).await;
    let latency = started.elapsed();
    assert_eq!(
        (delivered.attempts, delivered.last_status),
        (1, Some(200)),
        "delivered at the first attempt: {delivered:?}"
    );
    assert_processed_once(&receiver, &message, 1).await;
    eprintln!(
        "{backend:?}: charge {} -> {} processed once, delivered {latency:?} after the request",
        charge["id"], message.message_id
    );
}

on_both_backends! {
    one_charge_one_event_processed_once => c17_sqlite_a_charge_is_processed_once_by_the_receiver_under_its_stable_id, c17_postgres_a_charge_is_processed_once_by_the_receiver_under_its_stable_id;
}

/// The same charge request again with its Idempotency-Key is a replay: it sends no second
/// message, and the receiver still processed one event.
async fn a_replay_sends_nothing_more(backend: Backend) {
    let env = TestEnv::new(backend, "outbox-e2e-replay").await;
    let receiver = Receiver::start(&env, 0).await;
    let server = start_with_flags(&env, &receiver.webhook_url(), None).await;
    let (request, charge) = charge(&server, 1999).await;
    let message = the_message_of(&env, &charge).await;
    delivered(&env, DELIVERED_WITHIN).await;

    for _ in 0..3 {
        let replay = server.api().post_raw(&request).await;
        assert!(replay.replayed(), "{}", replay.describe());
        assert_eq!(replay.json()["id"], charge["id"], "{}", replay.describe());
    }
    // Whatever a replay could have enqueued would be attempted at once: give it the time.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = the_message_of(&env, &charge).await;
    assert_eq!(again.message_id, message.message_id);
    assert_eq!(
        (again.state.as_str(), again.attempts),
        ("delivered", 1),
        "{again:?}"
    );
    assert_processed_once(&receiver, &message, 1).await;
    eprintln!(
        "{backend:?}: 1 charge, 4 requests, 1 message, processed once ({})",
        message.message_id
    );
}

on_both_backends! {
    a_replay_sends_nothing_more => c17_sqlite_a_replayed_charge_request_sends_no_second_event, c17_postgres_a_replayed_charge_request_sends_no_second_event;
}

/// The receiver is down when five charges are made: their attempts fail (connection refused,
/// recorded) on a short test schedule (every 200 ms); the receiver comes back on its port after
/// a while and the next attempts deliver every event, each processed once and each charge
/// marked paid once.
async fn a_receiver_down_then_back_gets_everything_once(backend: Backend) {
    const CHARGES: usize = 5;
    let env = TestEnv::new(backend, "outbox-e2e-outage").await;
    let mut receiver = Receiver::start(&env, 0).await;
    let port = receiver.port();
    let url = receiver.webhook_url();
    let server = Server::start_with_args(
        &env,
        None,
        &[
            "--webhook-url",
            &url,
            "--webhook-secret",
            SECRET,
            "--test-webhook-schedule-ms",
            &["200"; 30].join(","),
        ],
    )
    .await;
    receiver.process.kill().await;
    drop(receiver);

    let mut charges = Vec::new();
    for n in 0..CHARGES {
        charges.push(charge(&server, 3100 + n as i64).await.1);
    }
    // Down for a while: every message failed three times or more, recorded, none lost.
    let failed = poll(
        300,
        Duration::from_millis(20),
        || outbox(&env),
        |d| d.len() == CHARGES && d.iter().all(|d| d.attempts >= 3 && d.last_error.is_some()),
    )
    .await;
    let down_since = Instant::now();
    assert!(
        failed.len() == CHARGES
            && failed
                .iter()
                .all(|d| d.state == "pending" && d.last_status.is_none()),
        "every message's attempts failed without an answer, recorded: {failed:#?}"
    );

    let receiver = Receiver::start(&env, port).await;
    let back_after = down_since.elapsed();
    let every = Duration::from_millis(50);
    let deliveries = poll(
        200,
        every,
        || outbox(&env),
        |d| d.len() == CHARGES && d.iter().all(|d| d.state == "delivered"),
    )
    .await;
    assert!(
        deliveries.len() == CHARGES
            && deliveries
                .iter()
                .all(|d| d.state == "delivered" && d.last_status == Some(200)),
        "every message delivered once the receiver was back: {deliveries:#?}"
    );
    let mut charge_ids: Vec<&str> = charges.iter().filter_map(|c| c["id"].as_str()).collect();
    let mut delivered_ids: Vec<&str> = deliveries.iter().map(|d| d.charge_id.as_str()).collect();
    charge_ids.sort_unstable();
    delivered_ids.sort_unstable();
    assert_eq!(delivered_ids, charge_ids, "one message per charge");
    let (executions, distinct) = receiver.executions().await;
    assert_eq!(
        (executions, distinct),
        (CHARGES as u64, CHARGES as u64),
        "each event processed once"
    );
    let audit = receiver.audit().await;
    assert!(
        audit.len() == CHARGES
            && audit
                .iter()
                .all(|e| e["outcome"] == "processed" && e["deliveries"] == 1),
        "each event received once, processed: {audit:#?}"
    );
    assert_each_charge_paid_once(&receiver, &deliveries).await;
    let attempts: i64 = deliveries.iter().map(|d| d.attempts).sum();
    eprintln!(
        "{backend:?}: receiver down (back {back_after:?} after every message failed three times); \
         messages {CHARGES}, attempts {attempts}, delivered {CHARGES}, processed {executions}, \
         duplicates processed 0, charges paid once {CHARGES}, lost 0"
    );
}

on_both_backends! {
    a_receiver_down_then_back_gets_everything_once => c17_sqlite_a_receiver_down_then_back_gets_every_event_once, c17_postgres_a_receiver_down_then_back_gets_every_event_once;
}

/// The server is killed (SIGKILL) after the receiver processed the event and before the
/// attempt was recorded: a proxy in front of the receiver delays each way by two seconds, so
/// the receiver's answer is still on its way when the test sees the event processed.
/// The restarted server delivers it again once its claim ran out, with the same `webhook-id`;
/// the receiver acknowledges the duplicate without running it again.
async fn killed_before_the_record_redelivers_the_same_id(backend: Backend) {
    // The claim is the lease; an attempt may take three quarters of it (6.75 s), more than
    // the proxy's two one-way delays (4 s).
    const LEASE_MS: u64 = 9000;
    let env = TestEnv::new(backend, "outbox-e2e-killed").await;
    let receiver = Receiver::start(&env, 0).await;
    let proxy = FaultProxy::start(receiver.process.addr())
        .await
        .expect("a proxy");
    proxy.set(Fault::Delay(Duration::from_secs(2)));
    let url = format!("http://{}/webhooks/standard", proxy.addr());
    let mut server = start_with_flags(&env, &url, Some(LEASE_MS)).await;

    let (_, charge) = charge(&server, 5000).await;
    let message = the_message_of(&env, &charge).await;
    let processed = poll(
        600,
        Duration::from_millis(10),
        || receiver.executions(),
        |c| c.0 >= 1,
    )
    .await;
    assert_eq!(processed, (1, 1), "the receiver processed it");
    server.kill().await;
    let unrecorded = the_message_of(&env, &charge).await;
    assert_eq!(
        (
            unrecorded.state.as_str(),
            unrecorded.attempts,
            unrecorded.last_status,
            unrecorded.last_error.as_deref()
        ),
        ("pending", 1, None, None),
        "killed after the receiver processed it and before the attempt was recorded"
    );
    drop(server);

    proxy.set(Fault::PassThrough);
    let killed_at = Instant::now();
    let _restarted = start_with_flags(&env, &url, Some(LEASE_MS)).await;
    let delivered = delivered(&env, Duration::from_secs(20)).await;
    assert_eq!(delivered.message_id, message.message_id);
    assert_eq!(
        (delivered.attempts, delivered.last_status),
        (2, Some(200)),
        "delivered again once, once the claim ran out: {delivered:?}"
    );
    assert_processed_once(&receiver, &message, 2).await;
    let lines = |outcome: &str| {
        receiver
            .process
            .log_lines(&[message.message_id.as_str(), outcome])
            .len()
    };
    assert_eq!(
        (lines("processed"), lines("duplicate")),
        (1, 1),
        "the receiver's log: the first delivery processed, the second a duplicate under the \
         same id:\n{}",
        receiver.process.log_tail(20)
    );
    eprintln!(
        "{backend:?}: killed before the record; {} delivered again {:?} later under the same \
         webhook-id; received 2, processed 1, lost 0",
        message.message_id,
        killed_at.elapsed()
    );
}

on_both_backends! {
    killed_before_the_record_redelivers_the_same_id => c17_sqlite_server_killed_before_the_record_redelivers_the_same_id_processed_once, c17_postgres_server_killed_before_the_record_redelivers_the_same_id_processed_once;
}

/// During a rotation the server signs with both secrets (`--webhook-secret new,old`): a
/// receiver that knows only the old one, and one that knows only the new one, each verify
/// the event and process it once; one that knows neither refuses it (400) and runs nothing.
async fn a_rotation_signs_with_both_secrets(backend: Backend) {
    const NEW: &str = "whsec_bmV3LXNlY3JldC1mb3Itcm90YXRpb24h";
    for (label, known) in [("old", SECRET), ("new", NEW)] {
        let env = TestEnv::new(backend, &format!("outbox-e2e-rotation-{label}")).await;
        let receiver = Receiver::start_verifying(&env, 0, known).await;
        let both = format!("{NEW},{SECRET}");
        let server = start_signing(&env, &receiver.webhook_url(), None, &both).await;
        let (_, charge) = charge(&server, 2500).await;
        let message = the_message_of(&env, &charge).await;
        let delivered = delivered(&env, DELIVERED_WITHIN).await;
        assert_eq!(
            (delivered.attempts, delivered.last_status),
            (1, Some(200)),
            "a receiver knowing only the {label} secret verified it: {delivered:?}"
        );
        assert_processed_once(&receiver, &message, 1).await;
    }
    // The control: a receiver that knows neither refuses it, and processes nothing.
    const OTHER: &str = "whsec_b3RoZXItc2VjcmV0LW5vdC1zaWduZWQh";
    let env = TestEnv::new(backend, "outbox-e2e-rotation-other").await;
    let receiver = Receiver::start_verifying(&env, 0, OTHER).await;
    let server = start_signing(
        &env,
        &receiver.webhook_url(),
        None,
        &format!("{NEW},{SECRET}"),
    )
    .await;
    charge(&server, 2500).await;
    let refused = poll(
        200,
        Duration::from_millis(20),
        || outbox(&env),
        |d| d.len() == 1 && d[0].last_status.is_some(),
    )
    .await;
    assert_eq!(
        (refused[0].state.as_str(), refused[0].last_status),
        ("pending", Some(400)),
        "a receiver knowing neither secret refuses the signature: {refused:?}"
    );
    assert_eq!(receiver.executions().await, (0, 0), "nothing processed");
    assert!(
        receiver.paid_charges().await.is_empty(),
        "no charge marked paid"
    );
    eprintln!("{backend:?}: signed with new and old, verified by either alone, by no other");
}

on_both_backends! {
    a_rotation_signs_with_both_secrets => c17_sqlite_a_rotation_signs_with_both_secrets, c17_postgres_a_rotation_signs_with_both_secrets;
}

/// A charge whose card network call timed out after charging is in doubt (502); the reconciler
/// finds the authorization, records the charge row and settles the record with the 200: the
/// charge succeeded, and every retry is answered that charge. Its `charge.succeeded` must be
/// in the outbox like every other succeeded charge's (C17: the merchant learns of each charge
/// once), yet the reconciler's path records the row without enqueueing it: the merchant never
/// hears of this charge. (No receiver is needed: the outbox is read from the database; the
/// endpoint is a closed port.)
async fn a_charge_settled_by_the_reconciler_has_its_event(backend: Backend) {
    let env = TestEnv::new(backend, "outbox-e2e-reconciled").await;
    // Nobody listens there: the message stays pending in the outbox, which is what is read.
    let url = "http://127.0.0.1:9/webhooks/standard";
    let server = Server::start_with_args(
        &env,
        None,
        &[
            "--webhook-url",
            url,
            "--webhook-secret",
            SECRET,
            "--reconcile-every",
            "0",
        ],
    )
    .await;
    let api = server.api();
    let request = ChargeRequest::form(&new_key("outbox-e2e-reconciled"), 4242)
        .with_network_fault(NetworkFault::TimeoutAfterCharging);
    let first = api.post_raw(&request).await;
    assert_eq!(first.status.as_u16(), 502, "in doubt: {}", first.describe());

    let report = api.reconcile().await;
    assert_eq!(report["settled"], 1, "the reconciler settled it: {report}");
    let settled = api.post_raw(&request.clone().without_network_fault()).await;
    let charge = assert_charge(&settled, 4242, "usd");
    assert_eq!(api.charge_count().await, 1, "one charge row");

    tokio::time::sleep(Duration::from_millis(500)).await;
    let deliveries = outbox(&env).await;
    let events: Vec<&Delivery> = deliveries
        .iter()
        .filter(|d| d.event_type == "charge.succeeded" && d.charge_id == charge["id"])
        .collect();
    assert_eq!(
        events.len(),
        1,
        "the succeeded charge {} settled by the reconciler has one charge.succeeded in the \
         outbox; the outbox holds: {deliveries:#?}",
        charge["id"]
    );
}

on_both_backends! {
    a_charge_settled_by_the_reconciler_has_its_event => c17_sqlite_a_charge_settled_by_the_reconciler_has_its_event, c17_postgres_a_charge_settled_by_the_reconciler_has_its_event;
}
