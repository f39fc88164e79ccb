//! The `idem` command end to end, as an operator runs it: the binary against real SQLite files,
//! the PostgreSQL server and the Redis server that `bash scripts/test` starts (a missing server
//! is a failure, never a skip). Records are written through the library, then read, listed,
//! counted and purged through the command.

use idem_core::store::Store;
use idem_core::{
    Begin, FencingToken, Fingerprint, Idempotency, IdempotencyKey, Policy, RecordId, Request,
    Scope, StoredResponse,
};
use idem_postgres::PgStore;
use idem_redis::RedisStore;
use idem_sqlite::SqliteStore;
use serde_json::Value;
use std::process::Command;
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
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env_remove("IDEM_URL")
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
    let id = RecordId::new(
        Scope::new(consumer, ROUTE).expect("scope"),
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
