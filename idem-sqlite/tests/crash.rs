//! Real crashes (C6, C9): a child process (this test binary, re-run in child mode) is killed
//! with SIGKILL in the middle of a charge, and the parent retries.
//!
//! - killed before commit: the business row and the completion vanish together; the retry is in
//!   flight until the lease passes, then runs the effect exactly once;
//! - killed after commit, before it answers: the retry gets the replay; no second row;
//! - killed in the middle of a one-commit execution (C15): nothing of it is left, and the retry
//!   runs at once, exactly once (no lease to wait for).

mod common;

use common::{charges, with_charges};
use idem_core::store::Deadline;
use idem_core::{Answer, Begin, Idempotency, Outcome, Policy, Request, StoredResponse};
use idem_sqlite::{SqliteIdempotency, SqliteStore};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const LEASE: Duration = Duration::from_millis(800);
const CHILD_ENV: &str = "IDEM_SQLITE_CRASH_CHILD";

fn request(idem: &Idempotency<SqliteStore>, intent: &str) -> Request {
    idem.request("acct_crash", "POST", "/charges")
        .key(Some(intent))
        .body(b"{\"cents\":4200}")
        .build()
        .expect("request")
}

fn insert_charge(tx: &rusqlite::Transaction<'_>, intent: &str) -> rusqlite::Result<StoredResponse> {
    tx.execute(
        "INSERT INTO charges (intent, cents) VALUES (?1, 4200)",
        [intent],
    )?;
    Ok(StoredResponse::new(
        201,
        format!("charge {}", tx.last_insert_rowid()),
    ))
}

/// The table of the one-commit crash: a store opened for one commit holds its table alone.
const ONE_COMMIT_TABLE: &str = "crash_one_commit";

async fn one_commit_store(db: impl AsRef<Path>) -> SqliteStore {
    SqliteStore::builder(db.as_ref())
        .table(ONE_COMMIT_TABLE)
        .one_commit(true)
        .open()
        .await
        .expect("open for one commit")
}

/// The child's side: `mode` is `before-commit`, `after-commit` or `one-commit`. It prints `READY` when it is
/// at the point where the parent kills it, then waits to be killed.
#[tokio::test]
#[ignore = "child process of the crash tests: run by them with IDEM_SQLITE_CRASH_CHILD set"]
async fn crash_child() {
    let spec = std::env::var(CHILD_ENV).expect("run by the crash tests");
    let mut parts = spec.splitn(3, '|');
    let (mode, db, intent) = (
        parts.next().expect("mode"),
        parts.next().expect("db"),
        parts.next().expect("intent").to_owned(),
    );
    let store = if mode == "one-commit" {
        one_commit_store(db).await
    } else {
        SqliteStore::open(db).await.expect("open")
    };
    let idem = Idempotency::with_policy(store, Policy::default().lease(LEASE)).expect("policy");
    let request = request(&idem, &intent);
    match mode {
        "before-commit" => {
            let Begin::Acquired(lease) = idem.begin(&request).await.expect("begin") else {
                panic!("the child is first");
            };
            let mut db = idem.store().connect().expect("connect");
            let tx = db.transaction().expect("tx");
            let response = insert_charge(&tx, &intent).expect("insert");
            idem.store()
                .complete_in(&tx, &idem.completion(&lease, response))
                .expect("complete_in");
            println!("READY");
            std::thread::sleep(Duration::from_secs(60));
            tx.commit().expect("never reached");
        }
        "after-commit" => {
            let outcome = idem
                .run_in_transaction(&request, move |tx, _| insert_charge(tx, &intent))
                .await
                .expect("run");
            assert!(matches!(outcome, Outcome::Executed(_)));
            println!("READY");
            std::thread::sleep(Duration::from_secs(60));
        }
        "one-commit" => {
            let _ = idem
                .run_in_transaction(&request.clone().with_one_commit(true), move |tx, _| {
                    let response = insert_charge(tx, &intent)?;
                    println!("READY");
                    std::thread::sleep(Duration::from_secs(60));
                    Ok::<_, rusqlite::Error>(response)
                })
                .await;
            panic!("never reached");
        }
        other => panic!("unknown mode {other}"),
    }
}

/// Runs the child until it prints READY, then kills it with SIGKILL.
fn run_child_and_kill(mode: &str, db: &Path, intent: &str) {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--ignored",
            "--exact",
            "crash_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, format!("{mode}|{}|{intent}", db.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    let ready = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|line| line.ends_with("READY"));
    assert!(ready, "the child did not reach its kill point");
    child.kill().expect("SIGKILL");
    let status = child.wait().expect("wait");
    assert!(!status.success(), "the child was killed, not finished");
}

async fn parent() -> Idempotency<SqliteStore> {
    let store = SqliteStore::open(common::db_path()).await.expect("open");
    with_charges(&store).await;
    Idempotency::with_policy(store, Policy::default().lease(LEASE)).expect("policy")
}

#[tokio::test]
async fn c09_killed_before_commit_retry_after_lease_runs_once() {
    let intent = format!("before-{}", idem_core::FencingToken::generate());
    let idem = parent().await;
    run_child_and_kill("before-commit", &common::db_path(), &intent);

    assert_eq!(
        charges(idem.store(), &intent).await,
        0,
        "the uncommitted charge vanished"
    );
    let request = request(&idem, &intent);
    let first = idem.begin(&request).await.expect("begin");
    assert!(
        matches!(first, Begin::Answered(Answer::InFlight { .. })),
        "the orphan holds until its lease: {first:?}"
    );

    tokio::time::sleep(LEASE + Duration::from_millis(200)).await;
    for attempt in 0..3 {
        let i = intent.clone();
        let outcome = idem
            .run_in_transaction(&request, move |tx, _| insert_charge(tx, &i))
            .await
            .expect("retry");
        assert_eq!(
            matches!(outcome, Outcome::Executed(_)),
            attempt == 0,
            "{outcome:?}"
        );
    }
    assert_eq!(charges(idem.store(), &intent).await, 1);
}

#[tokio::test]
async fn c07_killed_after_commit_before_answer_retry_replays() {
    let intent = format!("after-{}", idem_core::FencingToken::generate());
    let idem = parent().await;
    run_child_and_kill("after-commit", &common::db_path(), &intent);

    assert_eq!(charges(idem.store(), &intent).await, 1);
    let request = request(&idem, &intent);
    let i = intent.clone();
    let outcome = idem
        .run_in_transaction(&request, move |tx, _| insert_charge(tx, &i))
        .await
        .expect("retry");
    let Outcome::Answered(Answer::Replay(response)) = outcome else {
        panic!("expected the replay, got {outcome:?}");
    };
    assert_eq!(response.status, 201);
    assert!(String::from_utf8_lossy(&response.body).starts_with("charge "));
    assert_eq!(charges(idem.store(), &intent).await, 1);
}

/// C15: a process killed while its one-commit execution's effect runs (reservation and
/// business row written, uncommitted) leaves nothing: no record, no business row. The retry,
/// at once (no lease to wait for), executes exactly once, and its retries replay.
#[tokio::test]
async fn c15_killed_in_a_one_commit_execution_leaves_nothing_and_the_retry_runs_at_once() {
    let intent = format!("one-{}", idem_core::FencingToken::generate());
    let seed = SqliteStore::open(common::db_path()).await.expect("open");
    with_charges(&seed).await;
    drop(seed);
    run_child_and_kill("one-commit", &common::db_path(), &intent);

    // The child's lock went with it: the table can be held for one commit again.
    let store = one_commit_store(common::db_path()).await;
    let idem = Idempotency::with_policy(store, Policy::default().lease(LEASE)).expect("policy");
    assert_eq!(charges(idem.store(), &intent).await, 0, "nothing committed");
    let request = request(&idem, &intent);
    let record = idem_core::Store::lookup(idem.store(), request.id(), Deadline::default())
        .await
        .expect("lookup");
    assert!(record.is_none(), "no record is left: {record:?}");
    for attempt in 0..3 {
        let i = intent.clone();
        let outcome = idem
            .run_in_transaction(&request.clone().with_one_commit(true), move |tx, _| {
                insert_charge(tx, &i)
            })
            .await
            .expect("retry");
        assert_eq!(
            matches!(outcome, Outcome::Executed(_)),
            attempt == 0,
            "{outcome:?}"
        );
    }
    assert_eq!(charges(idem.store(), &intent).await, 1);
}
