//! Real crashes and a real clock skew (C6, C9, C11): a child process (this test binary, re-run in
//! child mode) is killed with SIGKILL in the middle of a charge, or runs with its clock ten
//! minutes ahead; the parent retries against the same server.

mod common;

use common::{charges, pg_url, SCHEMA};
use idem_core::store::Deadline;
use idem_core::{Answer, Begin, Idempotency, Outcome, Policy, Request, Store, StoredResponse};
use idem_postgres::sqlx::{self, AssertSqlSafe};
use idem_postgres::{PgIdempotency, PgStore};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const LEASE: Duration = Duration::from_millis(1500);
const CHILD_ENV: &str = "IDEM_PG_CRASH_CHILD";
/// Set for a child whose engine expects fresh keys (`Claim::expects_fresh`) when it reserves.
const WARM_ENV: &str = "IDEM_PG_CRASH_WARM";
/// The lease of the one-commit crash test: far longer than the test, so that a retry that
/// runs proves the key was free at once, not after a lease.
const ONE_COMMIT_LEASE: Duration = Duration::from_secs(120);

fn request(idem: &Idempotency<PgStore>, intent: &str) -> Request {
    idem.request("acct_crash", "POST", "/charges")
        .key(Some(intent))
        .body(b"{\"cents\":4200}")
        .build()
        .expect("request")
}

async fn engine(table: &str) -> Idempotency<PgStore> {
    engine_with(table, LEASE).await
}

async fn engine_with(table: &str, lease: Duration) -> Idempotency<PgStore> {
    let store = PgStore::builder()
        .schema(SCHEMA)
        .table(table)
        .max_connections(4)
        .connect(&pg_url())
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    common::business_table(store.pool()).await;
    Idempotency::with_policy(store, Policy::default().lease(lease)).expect("policy")
}

async fn insert_charge(
    tx: &mut sqlx::PgConnection,
    intent: &str,
) -> Result<StoredResponse, sqlx::Error> {
    let (id,): (i64,) = sqlx::query_as(
        "INSERT INTO idem_test.charges (intent, cents) VALUES ($1, 4200) RETURNING id",
    )
    .bind(intent)
    .fetch_one(tx)
    .await?;
    Ok(StoredResponse::new(201, format!("charge {id}")))
}

/// The child's side: `mode|table|intent`. It prints `READY ...` at the point where the parent
/// kills it (or reads what it printed), then waits.
#[tokio::test]
#[ignore = "child process of the crash and skew tests: run by them with IDEM_PG_CRASH_CHILD set"]
async fn crash_child() {
    let spec = std::env::var(CHILD_ENV).expect("run by the crash tests");
    let mut parts = spec.splitn(3, '|');
    let (mode, table, intent) = (
        parts.next().expect("mode"),
        parts.next().expect("table"),
        parts.next().expect("intent").to_owned(),
    );
    let warm = std::env::var_os(WARM_ENV).is_some();
    let idem = engine(table).await;
    if warm {
        common::expecting_fresh_keys(&idem).await;
    }
    let request = request(&idem, &intent);
    match mode {
        "before-commit" => {
            let Begin::Acquired(lease) = idem.begin(&request).await.expect("begin") else {
                panic!("the child is first");
            };
            let mut tx = idem.store().pool().begin().await.expect("tx");
            let response = insert_charge(&mut tx, &intent).await.expect("insert");
            idem.store()
                .complete_in(&mut tx, &idem.completion(&lease, response))
                .await
                .expect("complete_in");
            println!("READY");
            tokio::time::sleep(Duration::from_secs(60)).await;
            tx.commit().await.expect("never reached");
        }
        "after-commit" => {
            let outcome = idem
                .run_in_transaction(&request, move |tx, _| {
                    Box::pin(async move { insert_charge(tx, &intent).await })
                })
                .await
                .expect("run");
            assert!(matches!(outcome, Outcome::Executed(_)));
            println!("READY");
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        "one-commit-hang" => {
            let idem = engine_with(table, ONE_COMMIT_LEASE).await;
            if warm {
                common::expecting_fresh_keys(&idem).await;
            }
            let request = self::request(&idem, &intent);
            let _ = idem
                .run_in_transaction(&request.clone().with_one_commit(true), move |tx, _| {
                    Box::pin(async move {
                        let charged = insert_charge(tx, &intent).await;
                        println!("READY");
                        tokio::time::sleep(Duration::from_secs(60)).await;
                        charged
                    })
                })
                .await;
            panic!("never reached: the parent kills the child first");
        }
        "skewed" => {
            let Begin::Acquired(lease) = idem.begin(&request).await.expect("begin") else {
                panic!("the child is first");
            };
            let local_ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .expect("clock")
                .as_millis();
            println!("READY {} {local_ms}", lease.lease_until().as_millis());
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        other => panic!("unknown mode {other}"),
    }
}

/// libfaketime, which scripts/test installs (Debian package faketime): a missing library fails
/// the test, never skips it.
fn libfaketime() -> String {
    [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib",
    ]
    .iter()
    .map(|dir| format!("{dir}/faketime/libfaketime.so.1"))
    .find(|path| std::path::Path::new(path).exists())
    .expect("libfaketime is not installed: run `bash scripts/test`, or apt-get install faketime")
}

/// Runs the child (with `env` added) until it prints READY; returns that line's words and
/// kills the child with SIGKILL.
fn run_child_and_kill(env: &[(&str, &str)], mode: &str, table: &str, intent: &str) -> Vec<String> {
    let mut command = Command::new(std::env::current_exe().expect("test binary"));
    command.args([
        "--ignored",
        "--exact",
        "crash_child",
        "--nocapture",
        "--test-threads=1",
    ]);
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command
        .env(CHILD_ENV, format!("{mode}|{table}|{intent}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    let ready = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|line| {
            line.split_once("READY").map(|(_, rest)| {
                rest.split_whitespace()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
        });
    child.kill().expect("SIGKILL");
    let status = child.wait().expect("wait");
    assert!(!status.success(), "the child was killed, not finished");
    ready.expect("the child did not reach its kill point")
}

fn table() -> String {
    format!("crash_{}", idem_core::FencingToken::generate())
}

#[tokio::test]
async fn c09_killed_before_commit_retry_after_lease_runs_once() {
    killed_before_commit(false).await;
}

/// The same with both engines expecting fresh keys: the killed reservation was the insert
/// alone (`sql/insert.sql`), and so is each retry's first step.
#[tokio::test]
async fn c09_c04_expecting_fresh_keys_killed_before_commit_retry_after_lease_runs_once() {
    killed_before_commit(true).await;
}

/// Environment for a child that expects fresh keys when `warm`.
fn warm_env(warm: bool) -> Vec<(&'static str, &'static str)> {
    if warm {
        vec![(WARM_ENV, "1")]
    } else {
        Vec::new()
    }
}

async fn killed_before_commit(warm: bool) {
    let (table, intent) = (
        table(),
        format!("before-{}", idem_core::FencingToken::generate()),
    );
    let idem = engine(&table).await;
    if warm {
        common::expecting_fresh_keys(&idem).await;
    }
    run_child_and_kill(&warm_env(warm), "before-commit", &table, &intent);

    assert_eq!(
        charges(idem.store().pool(), &intent).await,
        0,
        "the uncommitted charge vanished"
    );
    let request = request(&idem, &intent);
    let first = idem.begin(&request).await.expect("begin");
    assert!(
        matches!(first, Begin::Answered(Answer::InFlight { .. })),
        "the orphan holds until its lease: {first:?}"
    );
    tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
    for attempt in 0..3 {
        let i = intent.clone();
        let outcome = idem
            .run_in_transaction(&request, move |tx, _| {
                Box::pin(async move { insert_charge(tx, &i).await })
            })
            .await
            .expect("retry");
        assert_eq!(
            matches!(outcome, Outcome::Executed(_)),
            attempt == 0,
            "{outcome:?}"
        );
    }
    assert_eq!(charges(idem.store().pool(), &intent).await, 1);
}

/// C15: a one-commit execution killed with SIGKILL while its effect runs (its business row
/// written, nothing committed) leaves nothing at all: no record, no business row, and the key
/// free at once (the lease is two minutes; the retry runs as soon as the server has ended the
/// dead session, well within seconds) for a retry that executes once.
#[tokio::test]
async fn c15_one_commit_killed_mid_effect_leaves_nothing_and_the_retry_runs_at_once() {
    one_commit_killed_mid_effect(false).await;
}

/// The same with both engines expecting fresh keys (the gate taken by the insert alone).
#[tokio::test]
async fn c15_c04_expecting_fresh_keys_one_commit_killed_mid_effect_leaves_nothing() {
    one_commit_killed_mid_effect(true).await;
}

async fn one_commit_killed_mid_effect(warm: bool) {
    let (table, intent) = (
        table(),
        format!("once-{}", idem_core::FencingToken::generate()),
    );
    let idem = engine_with(&table, ONE_COMMIT_LEASE).await;
    if warm {
        common::expecting_fresh_keys(&idem).await;
    }
    run_child_and_kill(&warm_env(warm), "one-commit-hang", &table, &intent);
    let killed = std::time::Instant::now();

    let request = request(&idem, &intent);
    assert!(
        idem.store()
            .lookup(request.id(), Deadline::default())
            .await
            .expect("lookup")
            .is_none(),
        "no record of the killed execution"
    );
    assert_eq!(
        charges(idem.store().pool(), &intent).await,
        0,
        "no business row"
    );
    // Until the server has noticed the dead session (its socket closed), its transaction
    // still holds the gate: the retry is answered in flight, never waits.
    let mut in_flight = 0;
    let outcome = loop {
        let i = intent.clone();
        let outcome = idem
            .run_in_transaction(&request.clone().with_one_commit(true), move |tx, _| {
                Box::pin(async move { insert_charge(tx, &i).await })
            })
            .await
            .expect("retry");
        match outcome {
            Outcome::Answered(Answer::InFlight { .. })
                if killed.elapsed() < Duration::from_secs(10) =>
            {
                in_flight += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => break other,
        }
    };
    assert!(
        matches!(outcome, Outcome::Executed(_)),
        "the retry ran at once ({in_flight} in-flight answers first): {outcome:?}"
    );
    assert!(killed.elapsed() < ONE_COMMIT_LEASE / 4, "no lease wait");
    let i = intent.clone();
    let again = idem
        .run_in_transaction(&request.clone().with_one_commit(true), move |tx, _| {
            Box::pin(async move { insert_charge(tx, &i).await })
        })
        .await
        .expect("replay");
    assert!(
        matches!(again, Outcome::Answered(Answer::Replay(_))),
        "{again:?}"
    );
    assert_eq!(charges(idem.store().pool(), &intent).await, 1);
}

#[tokio::test]
async fn c07_killed_after_commit_before_answer_retry_replays() {
    let (table, intent) = (
        table(),
        format!("after-{}", idem_core::FencingToken::generate()),
    );
    let idem = engine(&table).await;
    run_child_and_kill(&[], "after-commit", &table, &intent);

    assert_eq!(charges(idem.store().pool(), &intent).await, 1);
    let request = request(&idem, &intent);
    let i = intent.clone();
    let outcome = idem
        .run_in_transaction(&request, move |tx, _| {
            Box::pin(async move { insert_charge(tx, &i).await })
        })
        .await
        .expect("retry");
    let Outcome::Answered(Answer::Replay(response)) = outcome else {
        panic!("expected the replay, got {outcome:?}");
    };
    assert!(String::from_utf8_lossy(&response.body).starts_with("charge "));
    assert_eq!(charges(idem.store().pool(), &intent).await, 1);
}

/// C11: a process whose clock runs ten minutes ahead reserves; its lease deadline is the
/// server's (not ten minutes off), a process with the right clock sees the record in flight for
/// the lease and no longer, then takes it over.
#[tokio::test]
async fn c11_skewed_process_clocks_agree_on_the_lease() {
    let (table, intent) = (
        table(),
        format!("skew-{}", idem_core::FencingToken::generate()),
    );
    let idem = engine(&table).await;
    let preload = libfaketime();
    let words = run_child_and_kill(
        &[
            ("LD_PRELOAD", preload.as_str()),
            ("FAKETIME", "+10m"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
        "skewed",
        &table,
        &intent,
    );
    let lease_until: u64 = words[0].parse().expect("lease_until");
    let child_clock: u128 = words[1].parse().expect("child clock");
    let ours = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis();
    assert!(
        child_clock > ours + 9 * 60 * 1000,
        "the child's clock is ten minutes ahead ({child_clock} vs {ours})"
    );
    let server_now = u64::try_from(ours).expect("ms");
    assert!(
        lease_until < server_now + LEASE.as_millis() as u64 + 5_000,
        "the lease was computed by the child's clock: {lease_until} vs {server_now}"
    );
    let request = request(&idem, &intent);
    let Begin::Answered(Answer::InFlight { retry_after }) =
        idem.begin(&request).await.expect("begin")
    else {
        panic!("in flight");
    };
    assert!(retry_after <= LEASE, "{retry_after:?}");
    tokio::time::sleep(retry_after + Duration::from_millis(300)).await;
    let Begin::Acquired(lease) = idem.begin(&request).await.expect("begin") else {
        panic!("the skewed process's orphan is taken over after the lease, not ten minutes later");
    };
    assert_eq!(lease.acquired().kind(), idem_core::EventKind::TakenOver);
}

/// C6: the backend of an in-flight effect is terminated mid transaction: no business row, no
/// completed record, and the key is recoverable.
#[tokio::test]
async fn c06_terminated_backend_mid_transaction_leaves_nothing() {
    let (table, intent) = (
        table(),
        format!("term-{}", idem_core::FencingToken::generate()),
    );
    let idem = engine(&table).await;
    let request = request(&idem, &intent);
    let (pid_tx, pid_rx) = tokio::sync::oneshot::channel::<i32>();
    let i = intent.clone();
    let running = {
        let (idem, request) = (idem.clone(), request.clone());
        tokio::spawn(async move {
            idem.run_in_transaction(&request, move |tx, _| {
                Box::pin(async move {
                    let response = insert_charge(tx, &i).await?;
                    let (pid,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
                        .fetch_one(&mut *tx)
                        .await?;
                    let _ = pid_tx.send(pid);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    Ok::<_, sqlx::Error>(response)
                })
            })
            .await
        })
    };
    let pid = pid_rx.await.expect("pid");
    sqlx::raw_sql(AssertSqlSafe(format!("SELECT pg_terminate_backend({pid})")))
        .execute(idem.store().pool())
        .await
        .expect("terminate");
    let result = running.await.expect("task");
    assert!(result.is_err(), "the effect's transaction died: {result:?}");
    assert_eq!(charges(idem.store().pool(), &intent).await, 0);
    let record = idem_core::Store::lookup(idem.store(), request.id(), Deadline::default())
        .await
        .expect("lookup");
    assert!(
        record.as_ref().is_none_or(|r| r.is_in_progress()),
        "{record:?}"
    );
    tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
    let i = intent.clone();
    let retry = idem
        .run_in_transaction(&request, move |tx, _| {
            Box::pin(async move { insert_charge(tx, &i).await })
        })
        .await
        .expect("retry");
    assert!(matches!(retry, Outcome::Executed(_)));
    assert_eq!(charges(idem.store().pool(), &intent).await, 1);
}

/// C6, C9: a slow holder whose lease is taken over: its completion is `LeaseLost`, its business
/// insert rolls back, and exactly one business row exists.
#[tokio::test]
async fn c09_slow_holder_taken_over_rolls_back() {
    let (table, intent) = (
        table(),
        format!("slow-{}", idem_core::FencingToken::generate()),
    );
    let idem = engine(&table).await;
    let request = request(&idem, &intent);
    let Begin::Acquired(slow) = idem.begin(&request).await.expect("begin") else {
        panic!("fresh");
    };
    let mut tx = idem.store().pool().begin().await.expect("tx");
    insert_charge(&mut tx, &intent).await.expect("insert");
    tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
    let i = intent.clone();
    let taker = idem
        .run_in_transaction(&request, move |tx, _| {
            Box::pin(async move { insert_charge(tx, &i).await })
        })
        .await
        .expect("takeover");
    assert!(matches!(taker, Outcome::Executed(_)));
    let late = idem
        .store()
        .complete_in(
            &mut tx,
            &idem.completion(&slow, StoredResponse::new(201, "late")),
        )
        .await;
    assert!(matches!(late, Err(idem_core::Error::LeaseLost)), "{late:?}");
    tx.rollback().await.expect("rollback");
    assert_eq!(charges(idem.store().pool(), &intent).await, 1);
}
