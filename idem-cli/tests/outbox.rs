//! `idem outbox` end to end: a message written and dispatched through the library until dead,
//! then counted, listed, inspected, retried and purged through the command, on SQLite and on
//! PostgreSQL (`IDEM_PG_URL`; a missing server is a failure, never a skip).

use idem_outbox::{Endpoint, Message, MessageId, Schedule};
use idem_postgres::sqlx::{AssertSqlSafe, Connection, Executor, PgConnection};
use serde_json::Value;
use std::process::Command;

/// Runs `idem` with `args`: its exit code and stdout.
fn idem(args: &[String]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env_remove("IDEM_URL")
        .output()
        .expect("run idem");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

fn json(args: &[String]) -> Value {
    let (code, out) = idem(args);
    assert_eq!(code, 0, "{args:?}: {out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

/// An endpoint nobody listens on, one attempt only: its message is dead after one dispatch.
fn refused() -> Endpoint {
    Endpoint::new(
        "merchant",
        "http://127.0.0.1:9/hooks",
        ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
    )
    .expect("an endpoint")
    .schedule(Schedule::new([]).expect("a schedule"))
}

/// What an operator does with a dead message, through the command, at `url`.
fn operate(url: &str, id: &MessageId) {
    let base = ["--url", url, "--json", "outbox"];
    let with = |more: &[&str]| -> Vec<String> {
        base.iter().chain(more).map(|s| (*s).to_owned()).collect()
    };
    let counts = json(&with(&["counts"]));
    assert_eq!(
        (counts["pending"].as_u64(), counts["dead"].as_u64()),
        (Some(0), Some(1)),
        "{counts}"
    );
    let dead = json(&with(&["list", "--state", "dead"]));
    assert_eq!(dead[0]["message_id"], id.as_str());
    let shown = json(&with(&["inspect", id.as_str()]));
    assert_eq!(shown[0]["state"], "dead");
    let attempt = &shown[0]["attempts_recorded"][0];
    assert!(
        attempt["status"].is_null() && attempt["error"].is_string(),
        "{shown}"
    );
    assert_eq!(json(&with(&["retry", id.as_str()]))["retried"], 1);
    assert_eq!(json(&with(&["counts"]))["dead"], 0);
    assert_eq!(
        idem(&with(&["retry", id.as_str()])).0,
        3,
        "nothing dead: exit 3"
    );
    assert_eq!(
        idem(&with(&["inspect", "msg_none"])).0,
        3,
        "no such message: exit 3"
    );
    assert_eq!(
        json(&with(&[
            "purge",
            "--delivered-for",
            "0s",
            "--dead-for",
            "0s"
        ]))["purged"],
        0
    );
    // Kept for ever, written as people write it: nothing purged, on every store (C12).
    assert_eq!(
        json(&with(&[
            "purge",
            "--delivered-for",
            "500000000years",
            "--dead-for",
            "500000000years"
        ]))["purged"],
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_outbox_counts_lists_inspects_retries_and_purges() {
    let dir = tempfile::tempdir().expect("a directory");
    let path = dir.path().join("shop.db");
    let store = idem_sqlite::SqliteStore::open(&path)
        .await
        .expect("a store");
    let outbox = idem_outbox::SqliteOutbox::open(&store)
        .await
        .expect("an outbox");
    outbox.register(&refused()).await.expect("registered");
    let sender = outbox.clone();
    let id = store
        .call(move |db| {
            let tx = db.transaction().expect("a transaction");
            let id = sender.enqueue(&tx, &Message::bytes("text/plain", "hi").to("merchant"));
            tx.commit().expect("committed");
            id
        })
        .await
        .expect("the writer")
        .expect("enqueued");
    assert_eq!(
        outbox
            .dispatcher()
            .allow_loopback(true)
            .dispatch_due()
            .await
            .expect("dispatched"),
        1
    );
    drop(store);
    operate(&format!("sqlite://{}", path.display()), &id);
}

/// A database of its own, `name` and the process id, on the server of `IDEM_PG_URL` (dropped
/// first if a run left it): its URL, a migrated store in it, and an outbox whose endpoint
/// refuses every delivery.
async fn postgres_outbox(name: &str) -> (String, idem_postgres::PgStore, idem_outbox::PgOutbox) {
    let base = std::env::var("IDEM_PG_URL")
        .expect("IDEM_PG_URL: run `bash scripts/test`, which starts the servers");
    let name = format!("{name}_{}", std::process::id());
    let mut admin = PgConnection::connect(&base).await.expect("the server");
    let _ = admin
        .execute(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}")))
        .await;
    admin
        .execute(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .await
        .expect("a database");
    let url = format!(
        "{}/{name}",
        &base[..base.rfind('/').expect("a database in the URL")]
    );
    let store = idem_postgres::PgStore::connect(&url)
        .await
        .expect("a store");
    store.migrate().await.expect("migrated");
    let outbox = idem_outbox::PgOutbox::open(&store)
        .await
        .expect("an outbox");
    outbox.register(&refused()).await.expect("registered");
    (url, store, outbox)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outbox_counts_lists_inspects_retries_and_purges() {
    let (url, store, outbox) = postgres_outbox("idem_cli_outbox").await;
    let mut tx = store.pool().begin().await.expect("a transaction");
    let id = outbox
        .enqueue(&mut tx, &Message::bytes("text/plain", "hi").to("merchant"))
        .await
        .expect("enqueued");
    tx.commit().await.expect("committed");
    assert_eq!(
        outbox
            .dispatcher()
            .allow_loopback(true)
            .dispatch_due()
            .await
            .expect("dispatched"),
        1
    );
    operate(&url, &id);
}

/// A database without an outbox: every `idem outbox` command, reads included, is a usage error
/// (exit 2) and creates nothing; the application's `open` creates the outbox's tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_command_never_creates_the_outbox() {
    let dir = tempfile::tempdir().expect("a directory");
    let path = dir.path().join("shop.db");
    drop(
        idem_sqlite::SqliteStore::open(&path)
            .await
            .expect("a store"),
    );
    let url = format!("sqlite://{}", path.display());
    for command in [&["counts"][..], &["list", "--state", "dead"], &["purge"]] {
        let args: Vec<String> = ["--url", url.as_str(), "outbox"]
            .iter()
            .chain(command)
            .map(|s| (*s).to_owned())
            .collect();
        let (code, out) = idem(&args);
        assert_eq!(code, 2, "{command:?}: {out}");
    }
    let db = idem_sqlite::rusqlite::Connection::open(&path).expect("the file");
    let tables: i64 = db
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name LIKE 'idem_outbox_%'",
            [],
            |row| row.get(0),
        )
        .expect("a count");
    assert_eq!(tables, 0, "no outbox table created");
}

/// A read of the outbox takes no lock that writers wait on: `idem outbox counts` while an
/// effect's transaction that enqueued is still open answers at once. It ran the outbox's
/// schema (`PgOutbox::open`), whose `CREATE INDEX IF NOT EXISTS` takes a SHARE lock on the
/// deliveries even when the index exists: the command waited for that transaction until its
/// deadline (exit 1), and every enqueue after it queued behind the command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outbox_counts_waits_for_no_open_enqueue() {
    let (url, store, outbox) = postgres_outbox("idem_cli_outbox_lock").await;
    // An effect's transaction, still running, has enqueued its message.
    let mut tx = store.pool().begin().await.expect("a transaction");
    outbox
        .enqueue(&mut tx, &Message::bytes("text/plain", "hi").to("merchant"))
        .await
        .expect("enqueued");
    let args: Vec<String> = ["--url", url.as_str(), "--timeout", "3", "outbox", "counts"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let started = std::time::Instant::now();
    let (code, out) = tokio::task::spawn_blocking(move || idem(&args))
        .await
        .expect("the command");
    let took = started.elapsed();
    tx.rollback().await.expect("rolled back");
    assert_eq!(
        code, 0,
        "counts during an open enqueue, after {took:?}: {out}"
    );
}
