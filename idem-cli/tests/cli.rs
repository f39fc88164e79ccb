//! The `idem` command end to end, as an operator runs it: the binary against real SQLite files,
//! the PostgreSQL server and the Redis server that `bash scripts/test` starts (a missing server
//! is a failure, never a skip). Records are written through the library, then read, listed,
//! counted and purged through the command.

use idem_core::store::Store;
use idem_core::{
    Answer, Begin, Failure, FencingToken, Fingerprint, Idempotency, IdempotencyKey, Outcome,
    Policy, RecordId, Request, Scope, StoredResponse,
};
use idem_ops::Holder;
use idem_ops::Operator;
use idem_postgres::PgStore;
use idem_redis::RedisStore;
use idem_sqlite::SqliteStore;
use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const ROUTE: &str = "POST /v1/charges";
const SECRET_BODY: &str = "{\"id\":\"ch_1\",\"card\":\"4242 secret\"}";

struct Run {
    code: i32,
    out: String,
    err: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.out).unwrap_or_else(|e| panic!("{e}: {:?}", self.out))
    }
}

/// Runs `idem` with `args` (and no IDEM_URL from the environment).
fn idem(args: &[&str]) -> Run {
    idem_with(args, &[])
}

/// Runs `idem` with `args` and these environment variables (and no IDEM_URL).
fn idem_with(args: &[&str], vars: &[(&str, &str)]) -> Run {
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env_remove("IDEM_URL")
        .envs(vars.iter().copied())
        .output()
        .expect("run idem");
    Run {
        code: output.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&output.stdout).into_owned(),
        err: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run `bash scripts/test`, which starts the servers")
    })
}

fn request(consumer: &str, key: &str) -> Request {
    request_on(consumer, ROUTE, key)
}

fn request_on(consumer: &str, route: &str, key: &str) -> Request {
    let id = RecordId::new(
        Scope::new(consumer, route).expect("scope"),
        IdempotencyKey::new(key).expect("key"),
    );
    Request::from_parts(
        id,
        Fingerprint::builder().body(key.as_bytes()).finish(),
        key.len(),
    )
}

/// Writes, for `consumer`: `done` (completed, 201, a body that must not be printed unasked),
/// `running` (in progress, an hour's lease), `orphan` (in progress, lease passed) and `stale`
/// (completed, retention passed), then waits for the short deadlines to pass.
async fn records<S: Store + 'static>(store: S, consumer: &str) {
    let long = Idempotency::with_policy(
        std::sync::Arc::new(store),
        Policy::default().lease(Duration::from_secs(3600)),
    )
    .expect("policy");
    let short = Idempotency::with_policy(
        long.store().clone(),
        Policy::default()
            .lease(Duration::from_millis(200))
            .retention(Duration::from_millis(200)),
    )
    .expect("policy");
    let acquire = |idem: &Idempotency<std::sync::Arc<S>>, key: &'static str| {
        let request = request(consumer, key);
        let idem = idem.clone();
        async move {
            match idem.begin(&request).await.expect("begin") {
                Begin::Acquired(lease) => lease,
                other => panic!("{other:?}"),
            }
        }
    };
    let done = acquire(&long, "done").await;
    long.complete(
        done,
        StoredResponse::new(201, SECRET_BODY).with_header("content-type", "application/json"),
    )
    .await
    .expect("complete");
    let _running = acquire(&long, "running").await;
    let _orphan = acquire(&short, "orphan").await;
    let stale = acquire(&short, "stale").await;
    short
        .complete(stale, StoredResponse::new(200, "old"))
        .await
        .expect("complete");
    tokio::time::sleep(Duration::from_millis(400)).await;
}

fn keys(listing: &Value) -> Vec<String> {
    let mut keys: Vec<String> = listing["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| r["key"].as_str().expect("key").to_owned())
        .collect();
    keys.sort();
    keys
}

/// What every store answers the same way; `base` is the URL and naming flags.
fn reads_and_lists(base: &[&str], consumer: &str, purges: bool) {
    let cmd = |extra: &[&str]| idem(&[base, extra].concat());

    // inspect: the record, never its body unless asked.
    let shown = cmd(&["inspect", consumer, ROUTE, "done"]);
    assert_eq!(shown.code, 0, "{}", shown.err);
    assert!(
        shown.out.contains("completed") && shown.out.contains("201"),
        "{}",
        shown.out
    );
    assert!(
        shown.out.contains("content-type: application/json"),
        "{}",
        shown.out
    );
    assert!(
        !shown.out.contains("secret"),
        "a body printed unasked: {}",
        shown.out
    );
    let with_body = cmd(&["inspect", consumer, ROUTE, "done", "--body"]);
    assert!(with_body.out.contains("4242 secret"), "{}", with_body.out);
    let json = cmd(&["--json", "inspect", consumer, ROUTE, "done"]).json();
    assert_eq!(json["state"], "completed");
    assert_eq!(json["status"], 201);
    assert_eq!(json["key"], "done");
    assert!(json.get("body").is_none(), "{json}");
    assert_eq!(json["body_bytes"], SECRET_BODY.len());
    let json = cmd(&["--json", "inspect", consumer, ROUTE, "done", "--body"]).json();
    assert_eq!(json["body"], SECRET_BODY);

    // inspect: when it was reserved and completed (by the store's clock), and who holds it.
    assert!(
        shown.out.contains("reserved at") && shown.out.contains("completed at"),
        "{}",
        shown.out
    );
    let me = Holder::this_process();
    assert!(
        shown
            .out
            .contains(&format!("pid {} on {}", me.pid(), me.host())),
        "the holder is this test, which wrote the record: {}",
        shown.out
    );
    let done = cmd(&["--json", "inspect", consumer, ROUTE, "done"]).json();
    let reserved = done["reserved_at_ms"].as_u64().expect("a reservation time");
    let landed = done["completed_at_ms"].as_u64().expect("a completion time");
    let expires = done["expires_at_ms"].as_u64().expect("expires");
    assert!(reserved <= landed && landed < expires, "{done}");
    assert_eq!(done["holder"]["pid"], me.pid(), "{done}");
    assert_eq!(done["holder"]["host"], me.host(), "{done}");
    assert_eq!(
        done["holder"]["alive"],
        Value::Null,
        "nobody holds a completed record"
    );
    let running = cmd(&["--json", "inspect", consumer, ROUTE, "running"]).json();
    assert_eq!(running["completed_at"], Value::Null, "{running}");
    assert_eq!(
        running["holder"]["alive"], "alive",
        "this test runs: {running}"
    );
    let running_text = cmd(&["inspect", consumer, ROUTE, "running"]);
    assert!(
        running_text.out.contains("holder alive") && running_text.out.contains("alive"),
        "{}",
        running_text.out
    );
    let orphan = cmd(&["--json", "inspect", consumer, ROUTE, "orphan"]).json();
    assert_eq!(
        (orphan["state"].as_str(), orphan["live"].as_bool()),
        (Some("in_progress"), Some(false))
    );
    let missing = cmd(&["inspect", consumer, ROUTE, "never-used"]);
    assert_eq!(missing.code, 3, "{}", missing.err);
    assert!(missing.out.is_empty());

    // pending: in progress, live or orphaned, by age (every page: a scanning store's first page
    // may hold fewer records than the limit).
    let pending = cmd(&["--json", "pending", "--older-than", "0s", "--all"]).json();
    assert_eq!(keys(&pending), ["orphan", "running"], "{pending}");
    let young = cmd(&["pending", "--older-than", "1h", "--all"]);
    assert_eq!(young.code, 0);
    assert!(
        young.out.is_empty() && young.err.contains("no records"),
        "{}",
        young.err
    );
    let table = cmd(&["pending", "--older-than", "100ms", "--all"]);
    assert!(table.out.starts_with("RESERVED"), "{}", table.out);
    assert!(
        table.out.contains("orphaned") && table.out.contains("holds"),
        "{}",
        table.out
    );
    assert!(
        table.out.contains("HOLDER") && table.out.contains("ALIVE"),
        "{}",
        table.out
    );
    assert!(
        table
            .out
            .contains(&format!("pid {} on", std::process::id()))
            && table.out.contains("alive"),
        "{}",
        table.out
    );
    for record in pending["records"].as_array().expect("records") {
        assert_eq!(record["holder"]["pid"], std::process::id(), "{record}");
        assert_eq!(record["holder"]["alive"], "alive", "{record}");
    }

    // Paging: one record a page, followed by hand, then with --all.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    // A scanning store pages through every key of the server: as many pages as it takes.
    for _ in 0..100_000 {
        let mut args = vec!["--json", "pending", "--older-than", "0s", "--limit", "1"];
        if let Some(cursor) = &after {
            args.extend(["--after", cursor.as_str()]);
        }
        let page = cmd(&args).json();
        assert!(page["records"].as_array().expect("records").len() <= 1);
        seen.extend(keys(&page));
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    seen.sort();
    assert_eq!(seen, ["orphan", "running"]);
    let all = cmd(&[
        "--json",
        "pending",
        "--older-than",
        "0s",
        "--limit",
        "1",
        "--all",
    ])
    .json();
    assert_eq!(keys(&all), ["orphan", "running"]);
    assert_eq!(all["next"], Value::Null);
    let bad = cmd(&["pending", "--after", "garbage"]);
    assert_eq!(bad.code, 2, "a cursor the store did not make: {}", bad.err);
    for mistake in [
        vec!["inspect", consumer, ROUTE, "bad key"],
        vec!["inspect", "", ROUTE, "k"],
        vec!["completed", ""],
        vec!["completed", consumer, "--route", ""],
    ] {
        let run = cmd(&mistake);
        assert_eq!(run.code, 2, "{mistake:?}: {}", run.err);
    }

    // completed: the consumer's live ones, with their status.
    let completed = cmd(&["--json", "completed", consumer, "--all"]).json();
    assert_eq!(keys(&completed), ["done"], "{completed}");
    assert_eq!(completed["records"][0]["status"], 201);
    let on_route = cmd(&["completed", consumer, "--route", ROUTE, "--all"]);
    assert!(
        on_route.out.contains("done") && on_route.out.contains("201"),
        "{}",
        on_route.out
    );
    assert!(!on_route.out.contains("secret"));

    // stats and purge.
    let stats = cmd(&["--json", "stats"]).json();
    assert_eq!(
        (stats["in_progress"].as_u64(), stats["completed"].as_u64()),
        (Some(1), Some(1)),
        "{stats}"
    );
    if purges {
        assert_eq!(
            (stats["orphaned"].as_u64(), stats["expired"].as_u64()),
            (Some(1), Some(1)),
            "{stats}"
        );
        let purged = cmd(&["--json", "purge", "--all", "--batch", "1"]).json();
        assert_eq!(purged["purged"], 2, "{purged}");
        assert_eq!(
            purged["batches"], 3,
            "two full batches, then one that finds nothing"
        );
        let text = cmd(&["purge"]);
        assert!(
            text.out.contains("0 expired records deleted"),
            "{}",
            text.out
        );
        assert!(
            text.err.contains("batch 1"),
            "progress on stderr: {}",
            text.err
        );
        let after = cmd(&["--json", "stats"]).json();
        assert_eq!(
            (after["orphaned"].as_u64(), after["expired"].as_u64()),
            (Some(0), Some(0)),
            "{after}"
        );
    } else {
        let purged = cmd(&["purge", "--all"]);
        assert_eq!(purged.code, 0);
        assert!(purged.err.contains("nothing to purge"), "{}", purged.err);
    }
    let stats = cmd(&["stats"]);
    assert!(
        stats.out.contains("in progress") && stats.out.contains("oldest in progress"),
        "{}",
        stats.out
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_migrate_inspect_list_count_and_purge() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("ops.db");
    let url = format!("sqlite://{}", path.display());

    let read = idem(&["--url", &url, "stats"]);
    assert_eq!(read.code, 1, "reading a missing file is an error");
    assert!(!path.exists(), "a read created the database");
    let printed = idem(&["--url", &url, "migrate", "--print"]);
    assert!(
        printed
            .out
            .contains("CREATE TABLE IF NOT EXISTS idem_records")
            && printed.out.contains("reserved_at")
    );
    assert!(!path.exists(), "--print touched the database");
    let migrated = idem(&["--url", &url, "--table", "ops", "migrate"]);
    assert_eq!(migrated.code, 0, "{}", migrated.err);

    let store = SqliteStore::builder(&path)
        .table("ops")
        .open()
        .await
        .expect("open");
    records(store, "acct_sqlite").await;
    reads_and_lists(&["--url", &url, "--table", "ops"], "acct_sqlite", true);

    let wrong = idem(&["--url", &url, "--schema", "s", "stats"]);
    assert_eq!(wrong.code, 2, "--schema is not SQLite's: {}", wrong.err);
    let refused = idem(&["--url", &url, "--table", "bad name", "stats"]);
    assert_eq!(
        refused.code, 2,
        "a table name SQLite refuses: {}",
        refused.err
    );
    let far = idem(&[
        "--url",
        &url,
        "--table",
        "ops",
        "pending",
        "--after",
        "p.99999999999999999.61",
    ]);
    assert_eq!(far.code, 2, "a position no store made: {}", far.err);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_migrate_inspect_list_count_and_purge() {
    let url = env("IDEM_PG_URL");
    let schema = format!("cli_{}", FencingToken::generate());
    let base = [
        "--url",
        url.as_str(),
        "--schema",
        schema.as_str(),
        "--table",
        "ops",
    ];
    let printed = idem(&[&base[..], &["migrate", "--print"]].concat());
    assert!(
        printed.out.contains(&format!("\"{schema}\".\"ops\"")),
        "{}",
        printed.out
    );
    let before = idem(&[&base[..], &["stats"]].concat());
    assert_eq!(before.code, 1, "no table yet: {}", before.out);
    let migrated = idem(&[&base[..], &["migrate"]].concat());
    assert_eq!(migrated.code, 0, "{}", migrated.err);
    assert_eq!(
        idem(&[&base[..], &["migrate"]].concat()).code,
        0,
        "migrate twice"
    );

    let store = PgStore::builder()
        .schema(&schema)
        .table("ops")
        .connect(&url)
        .await
        .expect("connect");
    records(store, "acct_pg").await;
    reads_and_lists(&base, "acct_pg", true);
    let secret = idem(&["--url", "postgres://idem:hunter2@127.0.0.1:1/none", "stats"]);
    assert_eq!(secret.code, 1);
    assert!(
        !secret.err.contains("hunter2"),
        "a password printed: {}",
        secret.err
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_inspect_list_count_and_nothing_to_purge() {
    let url = env("IDEM_REDIS_URL");
    let prefix = format!("cli{}", FencingToken::generate());
    let base = ["--url", url.as_str(), "--prefix", prefix.as_str()];
    let migrate = idem(&[&base[..], &["migrate"]].concat());
    assert_eq!(migrate.code, 0);
    assert!(migrate.err.contains("no schema"), "{}", migrate.err);
    let store = RedisStore::builder()
        .prefix(&prefix)
        .connect(&url)
        .await
        .expect("connect");
    records(store, "acct_redis").await;
    reads_and_lists(&base, "acct_redis", false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_lists_and_counts_every_master() {
    let nodes = env("IDEM_REDIS_CLUSTER_NODES");
    let nodes: Vec<&str> = nodes.split(',').collect();
    let hosts: Vec<&str> = nodes
        .iter()
        .map(|n| n.trim_start_matches("redis://"))
        .collect();
    let url = format!("redis+cluster://{}", hosts.join(","));
    let prefix = format!("cli{}", FencingToken::generate());
    let store = RedisStore::builder()
        .prefix(&prefix)
        .connect_cluster(&nodes)
        .await
        .expect("connect");
    records(store, "acct_cluster").await;
    reads_and_lists(&["--url", &url, "--prefix", &prefix], "acct_cluster", false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_through_pgbouncer_in_transaction_mode() {
    let url = env("IDEM_PG_URL");
    let bouncer = env("IDEM_PGBOUNCER_URL");
    let schema = format!("cli_{}", FencingToken::generate());
    let direct = ["--url", url.as_str(), "--schema", schema.as_str()];
    assert_eq!(idem(&[&direct[..], &["migrate"]].concat()).code, 0);
    let store = PgStore::builder()
        .schema(&schema)
        .connect(&url)
        .await
        .expect("connect");
    records(store, "acct_bouncer").await;
    let pooled = ["--url", bouncer.as_str(), "--schema", schema.as_str()];
    // Prepared statements do not survive a pooler in transaction mode: the command sends none.
    for _ in 0..5 {
        let stats = idem(&[&pooled[..], &["--json", "stats"]].concat());
        assert_eq!(stats.code, 0, "{}", stats.err);
        assert_eq!(stats.json()["in_progress"], 1);
        let pending = idem(&[&pooled[..], &["--json", "pending", "--older-than", "0s"]].concat());
        assert_eq!(keys(&pending.json()), ["orphan", "running"]);
    }
}

/// The payments server's consumer is a hash and its route a template: what an on-call engineer
/// pastes from a customer's ticket is the key, and maybe the concrete path.
const HASHED_CONSUMER: &str = "acct_d58630097774edc2";
const TEMPLATE: &str = "POST /v1/customers/{id}/refunds";
const QUOTED_KEY: &str = "quoted-key";

/// Writes the records of a quoted key under two consumers and routes (one completed, one in
/// progress), and `KEY_LOOKUP_MAX + 1` records of another key.
async fn key_records<S: Store + 'static>(store: S) {
    let idem = Idempotency::with_policy(
        std::sync::Arc::new(store),
        Policy::default().lease(Duration::from_secs(3600)),
    )
    .expect("policy");
    let acquire = |request: Request| {
        let idem = idem.clone();
        async move {
            match idem.begin(&request).await.expect("begin") {
                Begin::Acquired(lease) => lease,
                other => panic!("{other:?}"),
            }
        }
    };
    let refund = acquire(request_on(HASHED_CONSUMER, TEMPLATE, QUOTED_KEY)).await;
    idem.complete(refund, StoredResponse::new(200, "refunded"))
        .await
        .expect("complete");
    let _charging = acquire(request_on("acct_other", ROUTE, QUOTED_KEY)).await;
    for i in 0..=50 {
        let _lease = acquire(request_on(&format!("acct_many_{i:02}"), ROUTE, "many-key")).await;
    }
}

/// C2: a key alone finds its records under every consumer and route, bounded, with the note
/// that keys are the clients'; a concrete path gets the hint that a template is expected and
/// the routes the key does have.
fn looks_up_by_key(base: &[&str]) {
    let cmd = |extra: &[&str]| idem(&[base, extra].concat());
    let found = cmd(&["inspect", QUOTED_KEY]);
    assert_eq!(found.code, 0, "{}", found.err);
    assert!(found.out.starts_with("CONSUMER"), "{}", found.out);
    for expected in [
        HASHED_CONSUMER,
        TEMPLATE,
        "acct_other",
        ROUTE,
        "completed 200",
    ] {
        assert!(found.out.contains(expected), "{expected}: {}", found.out);
    }
    assert!(
        found.err.contains("keys are chosen by clients"),
        "{}",
        found.err
    );
    let json = cmd(&["--json", "inspect", QUOTED_KEY]).json();
    let records = json["records"].as_array().expect("records");
    let scopes: Vec<(&str, &str)> = records
        .iter()
        .map(|r| {
            (
                r["consumer"].as_str().expect("consumer"),
                r["route"].as_str().expect("route"),
            )
        })
        .collect();
    assert_eq!(
        scopes,
        [(HASHED_CONSUMER, TEMPLATE), ("acct_other", ROUTE)],
        "{json}"
    );
    assert_eq!(json["more"], false);
    assert_eq!(records[1]["holder"]["alive"], "alive", "{json}");
    assert!(json["note"].as_str().is_some_and(|n| n.contains("clients")));

    // One record: the whole of it, times and holder, from the key alone.
    let one = cmd(&["inspect", "done"]);
    assert_eq!(one.code, 0, "{}", one.err);
    assert!(
        one.out.contains("completed at")
            && one.out.contains("content-type: application/json")
            && !one.out.contains("secret"),
        "{}",
        one.out
    );
    let one = cmd(&["--json", "inspect", "done"]).json();
    assert_eq!(one["record"]["status"], 201, "{one}");
    assert!(one["record"]["completed_at_ms"].is_u64(), "{one}");
    let many = cmd(&["--json", "inspect", "many-key"]).json();
    assert_eq!(
        many["records"].as_array().expect("records").len(),
        50,
        "bounded: {many}"
    );
    assert_eq!(many["more"], true, "51 records: more exist");
    let text = cmd(&["inspect", "many-key"]);
    assert!(text.err.contains("more than 50"), "{}", text.err);
    let none = cmd(&["inspect", "never-quoted"]);
    assert_eq!(none.code, 3, "{}", none.err);
    assert!(none.err.contains("no record has this key"), "{}", none.err);

    // The concrete path a client sent: no record, a hint, and the routes that do exist.
    let concrete = cmd(&[
        "inspect",
        HASHED_CONSUMER,
        "POST /v1/customers/cus_9s6XKzkNRiz8i3/refunds",
        QUOTED_KEY,
    ]);
    assert_eq!(concrete.code, 3, "{}", concrete.err);
    assert!(
        concrete.err.contains("looks like a concrete path")
            && concrete.err.contains("cus_9s6XKzkNRiz8i3"),
        "{}",
        concrete.err
    );
    if base.iter().any(|a| a.starts_with("redis")) {
        // Finding a key scans every record on Redis: never implicitly, a hint instead.
        assert!(
            concrete
                .err
                .contains(&format!("try `idem inspect {QUOTED_KEY}`"))
                && !concrete.err.contains("this key has records under"),
            "{}",
            concrete.err
        );
    } else {
        assert!(
            concrete.err.contains("this key has records under")
                && concrete.err.contains(TEMPLATE)
                && concrete.err.contains(HASHED_CONSUMER),
            "{}",
            concrete.err
        );
    }
    let template = cmd(&["--json", "inspect", HASHED_CONSUMER, TEMPLATE, QUOTED_KEY]).json();
    assert_eq!(template["status"], 200, "the template finds it: {template}");
    let half = cmd(&["inspect", HASHED_CONSUMER, TEMPLATE]);
    assert_eq!(half.code, 2, "two parts are neither form: {}", half.err);
}

/// The `running` record's holder, as `pending` and `inspect` show it, after the test wrote
/// `holder` in its place: `expected` is the alive column.
fn holder_shown(base: &[&str], consumer: &str, holder: &Holder, expected: &str) {
    let cmd = |extra: &[&str]| idem(&[base, extra].concat());
    let pending = cmd(&["--json", "pending", "--older-than", "0s", "--all"]).json();
    let running = pending["records"]
        .as_array()
        .expect("records")
        .iter()
        .find(|r| r["key"] == "running")
        .unwrap_or_else(|| panic!("running is pending: {pending}"));
    assert_eq!(running["holder"]["pid"], holder.pid(), "{running}");
    assert_eq!(running["holder"]["alive"], expected, "{running}");
    let shown = cmd(&["inspect", consumer, ROUTE, "running"]);
    assert!(
        shown
            .out
            .contains(&format!("pid {} on {}", holder.pid(), holder.host()))
            && shown.out.contains(expected),
        "{}",
        shown.out
    );
}

/// The `done` record after the test removed its completion time and holder, as a record
/// written before the store kept them: still read, both shown as unknown.
fn written_before_provenance(base: &[&str], consumer: &str) {
    let cmd = |extra: &[&str]| idem(&[base, extra].concat());
    let json = cmd(&["--json", "inspect", consumer, ROUTE, "done"]).json();
    assert_eq!(json["status"], 201, "{json}");
    assert_eq!(
        (&json["completed_at"], &json["holder"]),
        (&Value::Null, &Value::Null),
        "{json}"
    );
    let text = cmd(&["inspect", consumer, ROUTE, "done"]);
    assert!(
        text.out
            .contains("unknown (written before the store kept it)"),
        "{}",
        text.out
    );
}

/// A pid no process has: a child's, after it exited.
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().expect("spawn");
    let pid = child.id();
    child.wait().expect("wait");
    pid
}

/// The holders the liveness checks write: a process that exited on this host, and one on
/// another host.
fn foreign_holders() -> [(Holder, &'static str); 2] {
    let me = Holder::this_process();
    [
        (
            Holder::new(me.host(), dead_pid(), 7, None)
                .with_machine(me.boot_id(), me.pid_namespace()),
            "dead",
        ),
        (
            Holder::new("another-host.example", me.pid(), 7, None)
                .with_machine(me.boot_id(), me.pid_namespace()),
            "unknown (another host or namespace)",
        ),
    ]
}

/// Starts `idem` with `args` in the background, its output collected.
fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env_remove("IDEM_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn idem")
}

/// Stops a watch the way an operator does (Ctrl-C: SIGINT) and collects what it printed.
fn interrupt(child: Child) -> Run {
    let pid = child.id().to_string();
    let sent = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill");
    assert!(sent.success());
    let output = child.wait_with_output().expect("wait");
    Run {
        code: output.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&output.stdout).into_owned(),
        err: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// A watch refreshes every second, with no screen clearing on a pipe, and Ctrl-C ends it with
/// status 0.
async fn watches(base: &[&str]) {
    let child = spawn(&[base, &["stats", "--watch", "1"]].concat());
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let run = interrupt(child);
    assert_eq!(run.code, 0, "Ctrl-C ends a watch: {}", run.err);
    assert!(
        run.out.matches("counted at").count() >= 2,
        "refreshed: {}",
        run.out
    );
    assert!(
        !run.out.contains('\u{1b}'),
        "no escapes on a pipe: {:?}",
        run.out
    );
    let child = spawn(
        &[
            base,
            &[
                "--json",
                "pending",
                "--older-than",
                "0s",
                "--all",
                "--watch",
                "1",
            ],
        ]
        .concat(),
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let run = interrupt(child);
    assert_eq!(run.code, 0, "{}", run.err);
    let documents: Vec<Value> = run
        .out
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON document a line"))
        .collect();
    assert!(!documents.is_empty(), "{}", run.out);
    assert!(documents.iter().all(|d| d["records"].is_array()));
}

/// A store error while watching is printed, and the next refresh tries again: `break_it` and
/// `mend` take the table away and give it back.
async fn a_watch_survives_a_store_error<B, M, FB, FM>(base: &[&str], break_it: B, mend: M)
where
    B: FnOnce() -> FB,
    M: FnOnce() -> FM,
    FB: std::future::Future<Output = ()>,
    FM: std::future::Future<Output = ()>,
{
    let child = spawn(&[base, &["stats", "--watch", "1"]].concat());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    break_it().await;
    tokio::time::sleep(Duration::from_millis(2000)).await;
    mend().await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let run = interrupt(child);
    assert_eq!(
        run.code, 0,
        "a store error does not end a watch: {}",
        run.err
    );
    assert!(run.err.contains("trying again in 1s"), "{}", run.err);
    assert!(
        run.out.matches("counted at").count() >= 3,
        "counted before the error and after it: {}",
        run.out
    );
    // Ctrl-C stops a run wherever it is, so the last refresh may be cut short: the one before
    // it is whole.
    let refreshes: Vec<&str> = run.out.split("every 1s").collect();
    assert!(
        refreshes
            .iter()
            .rev()
            .take(2)
            .any(|r| r.contains("counted at")),
        "recovered: {}",
        run.out
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_key_lookup_holders_watch_and_a_newer_table() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("oncall.db");
    let url = format!("sqlite://{}", path.display());
    assert_eq!(idem(&["--url", &url, "migrate"]).code, 0);
    let store = SqliteStore::builder(&path).open().await.expect("open");
    records(store.clone(), "acct_sqlite").await;
    key_records(store).await;
    let base = ["--url", url.as_str()];
    looks_up_by_key(&base);

    let db = idem_sqlite::rusqlite::Connection::open(&path).expect("open");
    for (holder, expected) in foreign_holders() {
        db.execute(
            "UPDATE idem_records SET holder = ?1 WHERE key = 'running'",
            [holder.encode()],
        )
        .expect("write the holder");
        holder_shown(&base, "acct_sqlite", &holder, expected);
    }
    db.execute(
        "UPDATE idem_records SET holder = NULL, completed_at = NULL WHERE key = 'done'",
        [],
    )
    .expect("as before version 3");
    written_before_provenance(&base, "acct_sqlite");

    watches(&base).await;
    let db = std::sync::Mutex::new(db);
    let rename = |from: &str, to: &str| {
        db.lock()
            .expect("db")
            .execute_batch(&format!("ALTER TABLE {from} RENAME TO {to}"))
            .expect("rename");
    };
    a_watch_survives_a_store_error(
        &base,
        || async { rename("idem_records", "idem_records_away") },
        || async { rename("idem_records_away", "idem_records") },
    )
    .await;

    // A table a newer release migrated: the command, not the table, needs upgrading.
    db.lock()
        .expect("db")
        .execute(
            "INSERT INTO idem_schema_migrations (table_name, version, applied_at) VALUES ('idem_records', 99, 0)",
            [],
        )
        .expect("a newer version");
    let stats = idem(&["--url", &url, "stats"]);
    assert_eq!(stats.code, 1, "{}", stats.err);
    assert!(
        stats.err.contains("older than the table") && stats.err.contains("upgrade the command"),
        "{}",
        stats.err
    );
    assert!(!stats.err.contains("migrate it first"), "{}", stats.err);
    let migrate = idem(&["--url", &url, "migrate"]);
    assert_eq!(migrate.code, 1);
    assert!(migrate.err.contains("upgrade"), "{}", migrate.err);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_key_lookup_holders_watch_and_a_newer_table() {
    let url = env("IDEM_PG_URL");
    let schema = format!("cli_{}", FencingToken::generate());
    let base = ["--url", url.as_str(), "--schema", schema.as_str()];
    assert_eq!(idem(&[&base[..], &["migrate"]].concat()).code, 0);
    let store = PgStore::builder()
        .schema(&schema)
        .connect(&url)
        .await
        .expect("connect");
    records(store.clone(), "acct_pg").await;
    key_records(store).await;
    looks_up_by_key(&base);

    let pool = idem_postgres::sqlx::PgPool::connect(&url)
        .await
        .expect("connect");
    for (holder, expected) in foreign_holders() {
        idem_postgres::sqlx::query(idem_postgres::sqlx::AssertSqlSafe(format!(
            "UPDATE \"{schema}\".idem_records SET holder = $1 WHERE key = 'running'"
        )))
        .bind(holder.encode())
        .execute(&pool)
        .await
        .expect("write the holder");
        holder_shown(&base, "acct_pg", &holder, expected);
    }
    idem_postgres::sqlx::raw_sql(idem_postgres::sqlx::AssertSqlSafe(format!(
        "UPDATE \"{schema}\".idem_records SET holder = NULL, completed_at = NULL WHERE key = 'done'"
    )))
    .execute(&pool)
    .await
    .expect("as before version 3");
    written_before_provenance(&base, "acct_pg");

    watches(&base).await;
    let rename = |from: &'static str, to: &'static str| {
        let (pool, schema) = (pool.clone(), schema.clone());
        async move {
            idem_postgres::sqlx::raw_sql(idem_postgres::sqlx::AssertSqlSafe(format!(
                "ALTER TABLE \"{schema}\".{from} RENAME TO {to}"
            )))
            .execute(&pool)
            .await
            .expect("rename");
        }
    };
    a_watch_survives_a_store_error(
        &base,
        || rename("idem_records", "idem_records_away"),
        || rename("idem_records_away", "idem_records"),
    )
    .await;

    idem_postgres::sqlx::raw_sql(idem_postgres::sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{schema}\".idem_schema_migrations (table_name, version) VALUES ('{schema}.idem_records', 99)"
    )))
    .execute(&pool)
    .await
    .expect("a newer version");
    let migrate = idem(&[&base[..], &["migrate"]].concat());
    assert_eq!(migrate.code, 1, "{}", migrate.err);
    assert!(
        migrate.err.contains("newer release") && migrate.err.contains("upgrade"),
        "{}",
        migrate.err
    );
    // Reading a newer table: upgrade the command; a table never migrated: migrate first.
    let newer = idem(&[&base[..], &["stats"]].concat());
    assert_eq!(newer.code, 1, "{}", newer.err);
    assert!(
        newer.err.contains("upgrade the command") && newer.err.contains("version 99"),
        "{}",
        newer.err
    );
    let unmigrated = format!("cli_{}", FencingToken::generate());
    let older = idem(&["--url", url.as_str(), "--schema", &unmigrated, "stats"]);
    assert_eq!(older.code, 1, "{}", older.err);
    assert!(older.err.contains("migrate first"), "{}", older.err);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_key_lookup_holders_and_watch() {
    let url = env("IDEM_REDIS_URL");
    let prefix = format!("cli{}", FencingToken::generate());
    let base = ["--url", url.as_str(), "--prefix", prefix.as_str()];
    let store = RedisStore::builder()
        .prefix(&prefix)
        .connect(&url)
        .await
        .expect("connect");
    records(store.clone(), "acct_redis").await;
    key_records(store).await;
    looks_up_by_key(&base);

    let client = idem_redis::redis::Client::open(url.as_str()).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let id = request("acct_redis", "running").id().clone();
    let key: String = format!(
        "{prefix}:{}",
        id.digest()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    for (holder, expected) in foreign_holders() {
        let () = idem_redis::redis::cmd("HSET")
            .arg(&key)
            .arg("h")
            .arg(holder.encode())
            .query_async::<i64>(&mut conn)
            .await
            .map(drop)
            .expect("write the holder");
        holder_shown(&base, "acct_redis", &holder, expected);
    }
    let done = request("acct_redis", "done").id().clone();
    let done_key = format!(
        "{prefix}:{}",
        done.digest()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let removed: i64 = idem_redis::redis::cmd("HDEL")
        .arg(&done_key)
        .arg("h")
        .arg("ca")
        .query_async(&mut conn)
        .await
        .expect("as before the fields were kept");
    assert_eq!(removed, 2);
    written_before_provenance(&base, "acct_redis");
    watches(&base).await;
}

/// A store that accepts connections and never answers: a listener whose connections are held
/// open, unread, until the test ends.
fn frozen_store() -> (String, std::thread::JoinHandle<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    let held = std::thread::spawn(move || {
        let mut open = Vec::new();
        for conn in listener.incoming().take(8) {
            open.push(conn);
        }
        std::thread::sleep(Duration::from_secs(30));
    });
    (format!("127.0.0.1:{port}"), held)
}

/// A one-shot command on a store that never answers ends within its `--timeout` with a store
/// error (exit 1), on PostgreSQL and Redis alike.
#[test]
fn a_store_that_never_answers_ends_a_command_within_its_timeout() {
    let (address, _held) = frozen_store();
    for url in [
        format!("redis://{address}"),
        format!("postgres://idem@{address}/idem"),
    ] {
        let started = std::time::Instant::now();
        let run = idem(&["--url", &url, "--timeout", "1", "stats"]);
        let took = started.elapsed();
        assert_eq!(run.code, 1, "{url}: {}", run.err);
        assert!(took < Duration::from_secs(5), "{url}: took {took:?}");
        assert!(
            run.err.contains("did not answer within 1s"),
            "{url}: {}",
            run.err
        );
    }
}

/// Ctrl-C ends a watch within a second even while its run waits for a store that never
/// answers.
#[test]
fn ctrl_c_ends_a_watch_that_waits_for_a_frozen_store() {
    let (address, _held) = frozen_store();
    let url = format!("redis://{address}");
    let child = spawn(&["--url", &url, "--timeout", "60", "stats", "--watch", "1"]);
    std::thread::sleep(Duration::from_millis(1500));
    let started = std::time::Instant::now();
    let run = interrupt(child);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(run.code, 0, "Ctrl-C ends a watch: {}", run.err);
}

/// Executes `request` on `idem` with a handler whose outcome is unknown (the provider timed out
/// after the call was sent): the record is kept in doubt, with `note`.
async fn in_doubt<S: Store + 'static>(
    idem: &Idempotency<S>,
    request: &Request,
    note: &'static str,
) {
    let run = idem
        .run(request, move |_| async move {
            Err::<StoredResponse, _>(Failure::unknown("timeout").noting(note))
        })
        .await;
    assert!(run.is_err(), "an unknown outcome is an error: {run:?}");
}

/// Executes `request` on `idem` with a handler that answers 200 `again`.
async fn retry<S: Store + 'static>(idem: &Idempotency<S>, request: &Request) -> Outcome {
    idem.run(request, |_| async {
        Ok::<_, Failure<std::io::Error>>(StoredResponse::new(200, "again"))
    })
    .await
    .expect("run")
}

/// The `doubt` commands on every store: records in doubt listed, shown, settled and released
/// by an operator through the library's fenced path, the audit trail kept; `expires` says
/// whether an expired record stays readable (SQL) or is gone (Redis's TTL).
async fn decides_records_in_doubt<S: Operator + 'static>(
    store: S,
    base: &[&str],
    consumer: &str,
    expires: bool,
) {
    let cmd = |extra: &[&str]| idem_with(&[base, extra].concat(), &[("USER", "tester")]);
    let idem = Idempotency::new(std::sync::Arc::new(store));
    let (a, b) = (request(consumer, "doubt-a"), request(consumer, "doubt-b"));
    in_doubt(&idem, &a, "net key a").await;
    in_doubt(&idem, &b, "net key b").await;
    let done = request(consumer, "sure");
    assert!(matches!(retry(&idem, &done).await, Outcome::Executed(_)));
    let downstream = idem_ops::reconcile::in_doubt(&idem, a.id())
        .await
        .expect("read")
        .expect("in doubt")
        .downstream_key();

    // list: both, oldest first, with their cause; paged like the other listings.
    let listed = cmd(&["--json", "doubt", "list", "--all"]);
    assert_eq!(listed.code, 0, "{}", listed.err);
    let listed = listed.json();
    assert_eq!(keys(&listed), ["doubt-a", "doubt-b"], "{listed}");
    for record in listed["records"].as_array().expect("records") {
        assert_eq!(record["status"], 500, "{record}");
        assert_eq!(record["doubt"]["cause"], "handler_failure", "{record}");
        assert_eq!(record["doubt"]["attempts"], 0, "{record}");
        assert!(record["check_at_ms"].is_u64(), "{record}");
    }
    let due = cmd(&["--json", "doubt", "list", "--due", "--all"]).json();
    assert_eq!(keys(&due), ["doubt-a", "doubt-b"], "due at once: {due}");
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..100_000 {
        let mut args = vec!["--json", "doubt", "list", "--limit", "1"];
        if let Some(cursor) = &after {
            args.extend(["--after", cursor.as_str()]);
        }
        let page = cmd(&args).json();
        assert!(page["records"].as_array().expect("records").len() <= 1);
        seen.extend(keys(&page));
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    seen.sort();
    assert_eq!(seen, ["doubt-a", "doubt-b"]);
    let table = cmd(&["doubt", "list", "--all"]);
    assert!(table.out.starts_with("RESERVED"), "{}", table.out);
    for expected in [
        "CAUSE",
        "NEXT CHECK",
        "doubt-a",
        "doubt-b",
        "handler_failure",
        "500",
    ] {
        assert!(table.out.contains(expected), "{expected}: {}", table.out);
    }
    assert!(!table.out.contains("sure"), "not in doubt: {}", table.out);
    let stats = cmd(&["--json", "stats"]).json();
    assert_eq!(stats["in_doubt"], 2, "{stats}");
    assert!(cmd(&["stats"]).out.contains("in doubt"));

    // show: the record in doubt, and no trail yet.
    let shown = cmd(&["doubt", "show", consumer, ROUTE, "doubt-a"]);
    assert_eq!(shown.code, 0, "{}", shown.err);
    for expected in [
        "handler_failure",
        "net key a",
        &downstream,
        "500",
        "not checked yet",
    ] {
        assert!(shown.out.contains(expected), "{expected}: {}", shown.out);
    }
    assert!(shown.err.contains("no audit trail"), "{}", shown.err);
    let json = cmd(&["--json", "doubt", "show", consumer, ROUTE, "doubt-a"]).json();
    assert_eq!(
        (&json["in_doubt"], &json["state"]),
        (&Value::Bool(true), &Value::from("in_doubt"))
    );
    assert_eq!(json["record"]["doubt"]["note"], "net key a", "{json}");
    assert_eq!(
        json["record"]["downstream_key"],
        downstream.as_str(),
        "{json}"
    );
    assert_eq!(json["trail"], Value::Array(Vec::new()), "{json}");

    // Mistakes write nothing.
    for mistake in [
        vec![
            "doubt", "settle", consumer, ROUTE, "doubt-a", "--status", "201",
        ],
        vec![
            "doubt", "settle", consumer, ROUTE, "doubt-a", "--status", "201", "--reason", " ",
        ],
        vec![
            "doubt", "settle", consumer, ROUTE, "doubt-a", "--status", "99", "--reason", "x",
        ],
        vec![
            "doubt",
            "settle",
            consumer,
            ROUTE,
            "doubt-a",
            "--status",
            "201",
            "--reason",
            "x",
            "--header",
            "Set-Cookie: s=1",
        ],
        vec![
            "doubt", "release", consumer, ROUTE, "bad key", "--reason", "x",
        ],
    ] {
        let run = cmd(&mistake);
        assert_eq!(run.code, 2, "{mistake:?}: {}", run.err);
    }
    assert_eq!(cmd(&["--json", "stats"]).json()["in_doubt"], 2);

    // settle: the real answer, replayed from now on; the trail says who and why.
    let settled = cmd(&[
        "doubt",
        "settle",
        consumer,
        ROUTE,
        "doubt-a",
        "--status",
        "201",
        "--body",
        r#"{"id":"ch_1"}"#,
        "--header",
        "Content-Type: application/json",
        "--header",
        "X-Provider-Id: ch_1",
        "--reason",
        "captured as ch_1 in the dashboard",
        "--by",
        "operator alice",
    ]);
    assert_eq!(settled.code, 0, "{}", settled.err);
    assert!(settled.out.contains("settled 201"), "{}", settled.out);
    match retry(&idem, &a).await {
        Outcome::Answered(Answer::Replay(response)) => {
            assert_eq!(response.status, 201);
            assert_eq!(response.body, br#"{"id":"ch_1"}"#);
            assert_eq!(
                response.header("content-type"),
                Some(&b"application/json"[..])
            );
            assert_eq!(
                response.header("x-provider-id"),
                None,
                "replayed only where the application's policy stores it"
            );
        }
        other => panic!("the settled answer is replayed: {other:?}"),
    }
    let stored = cmd(&["inspect", consumer, ROUTE, "doubt-a"]);
    assert!(
        stored.out.contains("x-provider-id: ch_1") && stored.out.contains("201"),
        "stored as given: {}",
        stored.out
    );
    let trail = cmd(&["doubt", "show", consumer, ROUTE, "doubt-a"]);
    assert_eq!(trail.code, 0, "{}", trail.err);
    assert!(trail.err.contains("not in doubt"), "{}", trail.err);
    for expected in [
        "settled 201",
        "operator alice",
        "captured as ch_1 in the dashboard",
        "operator check",
    ] {
        assert!(trail.out.contains(expected), "{expected}: {}", trail.out);
    }
    let json = cmd(&["--json", "doubt", "show", consumer, ROUTE, "doubt-a"]).json();
    assert_eq!(
        (&json["in_doubt"], &json["state"]),
        (&Value::Bool(false), &Value::from("completed"))
    );
    let entries = json["trail"].as_array().expect("trail");
    assert_eq!(entries.len(), 1, "{json}");
    assert_eq!(entries[0]["decision"], "settled");
    assert_eq!(entries[0]["status"], 201);
    assert_eq!(entries[0]["by"], "operator alice");
    assert_eq!(entries[0]["answer"], "captured as ch_1 in the dashboard");
    assert_eq!(entries[0]["asked"], "operator check");

    // The same decision again: the record is no longer in doubt.
    let again = cmd(&[
        "--json", "doubt", "settle", consumer, ROUTE, "doubt-a", "--status", "201", "--reason",
        "twice",
    ]);
    assert_eq!(again.code, 3, "{}", again.err);
    assert_eq!(again.json()["in_doubt"], false);
    let again = cmd(&[
        "doubt", "settle", consumer, ROUTE, "doubt-a", "--status", "201", "--reason", "twice",
    ]);
    assert_eq!(again.code, 3);
    assert!(again.err.contains("not in doubt"), "{}", again.err);
    assert_eq!(
        cmd(&["--json", "doubt", "show", consumer, ROUTE, "doubt-a"]).json()["trail"]
            .as_array()
            .map(Vec::len),
        Some(1),
        "a decision that was not made leaves no entry"
    );

    // release: the record is gone, the retry executes, the trail stays.
    let released = cmd(&[
        "--json",
        "doubt",
        "release",
        consumer,
        ROUTE,
        "doubt-b",
        "--reason",
        "no authorization under this key",
        "--asked",
        "card network dashboard",
    ]);
    assert_eq!(released.code, 0, "{}", released.err);
    let released = released.json();
    assert_eq!(released["decision"], "released", "{released}");
    assert_eq!(
        released["by"], "operator tester",
        "by defaults to operator $USER"
    );
    assert_eq!(
        cmd(&["inspect", consumer, ROUTE, "doubt-b"]).code,
        3,
        "released: no record"
    );
    let gone = cmd(&["doubt", "show", consumer, ROUTE, "doubt-b"]);
    assert_eq!(gone.code, 0, "the trail is still there: {}", gone.err);
    for expected in [
        "released",
        "operator tester",
        "no authorization under this key",
        "card network dashboard",
    ] {
        assert!(gone.out.contains(expected), "{expected}: {}", gone.out);
    }
    assert!(
        gone.err.contains("not in doubt") && gone.err.contains("no record"),
        "{}",
        gone.err
    );
    assert!(
        matches!(retry(&idem, &b).await, Outcome::Executed(_)),
        "the retry executes"
    );
    let json = cmd(&["--json", "doubt", "show", consumer, ROUTE, "doubt-b"]).json();
    assert_eq!(json["state"], "completed", "{json}");
    assert_eq!(json["trail"][0]["decision"], "released", "{json}");
    let nothing = cmd(&["doubt", "show", consumer, ROUTE, "never-used"]);
    assert_eq!(nothing.code, 3, "neither record nor trail: {}", nothing.err);
    assert_eq!(cmd(&["--json", "stats"]).json()["in_doubt"], 0);
    let empty = cmd(&["doubt", "list", "--all"]);
    assert!(
        empty.out.is_empty() && empty.err.contains("no records in doubt"),
        "{}",
        empty.err
    );

    // A record whose retention passed between the read and the decision: the store refuses
    // the decision, nothing is written (on Redis the record is gone by its TTL: not in doubt).
    let short = Idempotency::with_policy(
        idem.store().clone(),
        Policy::default().retention(Duration::from_millis(300)),
    )
    .expect("policy");
    let late = request(consumer, "doubt-late");
    in_doubt(&short, &late, "net key late").await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let lost = cmd(&[
        "doubt",
        "release",
        consumer,
        ROUTE,
        "doubt-late",
        "--reason",
        "too late",
    ]);
    if expires {
        assert_eq!(lost.code, 3, "{}", lost.err);
    } else {
        assert_eq!(lost.code, 4, "{}", lost.err);
        assert!(
            lost.err.contains("changed since it was read"),
            "{}",
            lost.err
        );
        let json = cmd(&[
            "--json",
            "doubt",
            "settle",
            consumer,
            ROUTE,
            "doubt-late",
            "--status",
            "201",
            "--reason",
            "too late",
        ]);
        assert_eq!(json.code, 4, "{}", json.err);
        assert_eq!(json.json()["decision"], "contested");
    }
    let untouched = cmd(&["--json", "doubt", "show", consumer, ROUTE, "doubt-late"]).json();
    assert_eq!(untouched["trail"], Value::Array(Vec::new()), "{untouched}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_records_in_doubt_are_listed_shown_settled_and_released() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("doubt.db");
    let url = format!("sqlite://{}", path.display());
    assert_eq!(idem(&["--url", &url, "migrate"]).code, 0);
    let store = SqliteStore::builder(&path).open().await.expect("open");
    decides_records_in_doubt(store, &["--url", &url], "acct_sqlite", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_records_in_doubt_are_listed_shown_settled_and_released() {
    let url = env("IDEM_PG_URL");
    let schema = format!("cli_{}", FencingToken::generate());
    let base = ["--url", url.as_str(), "--schema", schema.as_str()];
    assert_eq!(idem(&[&base[..], &["migrate"]].concat()).code, 0);
    let store = PgStore::builder()
        .schema(&schema)
        .connect(&url)
        .await
        .expect("connect");
    decides_records_in_doubt(store, &base, "acct_pg", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_records_in_doubt_are_listed_shown_settled_and_released() {
    let url = env("IDEM_REDIS_URL");
    let prefix = format!("cli{}", FencingToken::generate());
    let store = RedisStore::builder()
        .prefix(&prefix)
        .connect(&url)
        .await
        .expect("connect");
    decides_records_in_doubt(
        store,
        &["--url", &url, "--prefix", &prefix],
        "acct_redis",
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_records_in_doubt_are_listed_shown_settled_and_released() {
    let nodes = env("IDEM_REDIS_CLUSTER_NODES");
    let nodes: Vec<&str> = nodes.split(',').collect();
    let hosts: Vec<&str> = nodes
        .iter()
        .map(|n| n.trim_start_matches("redis://"))
        .collect();
    let url = format!("redis+cluster://{}", hosts.join(","));
    let prefix = format!("cli{}", FencingToken::generate());
    let store = RedisStore::builder()
        .prefix(&prefix)
        .connect_cluster(&nodes)
        .await
        .expect("connect");
    decides_records_in_doubt(
        store,
        &["--url", &url, "--prefix", &prefix],
        "acct_cluster",
        true,
    )
    .await;
}

/// `purge --all` from a timer (docs/operations.md) is a new process each time: on PostgreSQL it
/// must reach the expired records reserved after more than a window of records kept longer (a
/// longer retention, another engine's policy on the same table), not stop at the first window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c10_purge_all_reaches_expired_records_behind_longer_kept_ones_on_postgres() {
    let url = env("IDEM_PG_URL");
    let schema = format!("cli_{}", FencingToken::generate());
    let base = [
        "--url",
        url.as_str(),
        "--schema",
        schema.as_str(),
        "--table",
        "ops",
    ];
    let migrated = idem(&[&base[..], &["migrate"]].concat());
    assert_eq!(migrated.code, 0, "{}", migrated.err);
    let store = PgStore::builder()
        .schema(&schema)
        .table("ops")
        .connect(&url)
        .await
        .expect("connect");
    let engine = |retention| {
        Idempotency::with_policy(store.clone(), Policy::default().retention(retention))
            .expect("policy")
    };
    let (long, short) = (
        engine(Duration::from_secs(3600)),
        engine(Duration::from_millis(200)),
    );
    // Reserved first and kept an hour: more of them than one purge window (4 x --batch) holds.
    for (idem, prefix, count) in [(&long, "kept", 30), (&short, "gone", 10)] {
        for i in 0..count {
            let request = request("acct_purge", &format!("{prefix}-{i}"));
            let Begin::Acquired(lease) = idem.begin(&request).await.expect("begin") else {
                panic!("a fresh key")
            };
            idem.complete(lease, StoredResponse::new(201, "ok"))
                .await
                .expect("complete");
        }
        // Later reservation times for the next records.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let purged = idem(&[&base[..], &["--json", "purge", "--all", "--batch", "2"]].concat());
    assert_eq!(purged.code, 0, "{}", purged.err);
    assert_eq!(
        purged.json()["purged"],
        10,
        "every expired record, however many were kept before them: {}",
        purged.out
    );
    let stats = idem(&[&base[..], &["--json", "stats"]].concat());
    assert_eq!(stats.code, 0, "{}", stats.err);
    assert_eq!(stats.json()["expired"], 0, "{}", stats.out);
}

/// A record that does not decode stops every scan of a Redis prefix (stats, pending, doubt
/// list, inspect by key: C12, never read as absent): the error names its key, so that an
/// operator can find it and look at it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c12_a_corrupt_redis_record_is_named_by_the_listings_it_stops() {
    use idem_redis::redis::AsyncCommands;
    let url = env("IDEM_REDIS_URL");
    let prefix = format!("cli{}", FencingToken::generate());
    let key = format!("{prefix}:{}", "ab".repeat(32));
    let client = idem_redis::redis::Client::open(url.as_str()).expect("a client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let _: () = conn.hset(&key, "foo", "bar").await.expect("written");
    let base = ["--url", url.as_str(), "--prefix", prefix.as_str()];
    for command in [
        &["stats"][..],
        &["pending", "--older-than", "0s", "--all"],
        &["doubt", "list", "--all"],
    ] {
        let run = idem(&[&base[..], command].concat());
        assert_eq!(run.code, 1, "{command:?}: {}", run.err);
        assert!(
            run.err.contains("corrupt") && run.err.contains(&key),
            "{command:?} names the record: {}",
            run.err
        );
    }
    let _: () = conn.del(&key).await.expect("deleted");
}
