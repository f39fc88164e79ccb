//! A frozen process (C9, C13): a child process (this test binary, re-run in child mode) is
//! stopped with SIGSTOP while it holds a record, and the parent, another process on the same
//! server, retries the same request. A frozen holder renews nothing and answers nothing, but
//! its session stays open: the server sees an idle transaction, never a dead client.

mod common;

use common::{charges, pg_url, SCHEMA};
use idem_core::{Answer, Begin, Idempotency, Outcome, Policy, Request, StoredResponse};
use idem_postgres::sqlx;
use idem_postgres::{PgIdempotency, PgStore};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LEASE: Duration = Duration::from_millis(1500);
/// The child's store deadline for an idle transaction (`idle_in_transaction_timeout`).
const IDLE: Duration = Duration::from_secs(3);
const CHILD_ENV: &str = "IDEM_PG_FREEZE_CHILD";

fn request(idem: &Idempotency<PgStore>, intent: &str) -> Request {
    idem.request("acct_freeze", "POST", "/charges")
        .key(Some(intent))
        .body(b"{\"cents\":4200}")
        .build()
        .expect("request")
}

async fn engine(table: &str) -> Idempotency<PgStore> {
    let store = PgStore::builder()
        .schema(SCHEMA)
        .table(table)
        .max_connections(4)
        .idle_in_transaction_timeout(IDLE)
        .connect(&pg_url())
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    common::business_table(store.pool()).await;
    Idempotency::with_policy(store, Policy::default().lease(LEASE)).expect("policy")
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

/// The child's side: `mode|table|intent`. `before-commit`: it completes its record inside its
/// own transaction (`complete_in`, the guard's form), prints `READY` before its COMMIT, and
/// waits there. `one-commit`: its one-commit effect writes its row, prints `READY` and waits.
/// The parent stops it at that moment.
#[tokio::test]
#[ignore = "child process of the freeze tests: run by them with IDEM_PG_FREEZE_CHILD set"]
async fn freeze_child() {
    let spec = std::env::var(CHILD_ENV).expect("run by the freeze tests");
    let mut parts = spec.splitn(3, '|');
    let (mode, table, intent) = (
        parts.next().expect("mode"),
        parts.next().expect("table"),
        parts.next().expect("intent").to_owned(),
    );
    let intent = intent.as_str();
    let idem = engine(table).await;
    if mode == "one-commit" || mode == "two-commit" {
        let request = request(&idem, intent).with_one_commit(mode == "one-commit");
        let owned = intent.to_owned();
        let ran = idem
            .run_in_transaction(&request, move |tx, _| {
                Box::pin(async move {
                    let charged = insert_charge(tx, &owned).await;
                    println!("READY");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    charged
                })
            })
            .await;
        // The parent may have stopped reading.
        let _ = writeln!(std::io::stdout(), "DONE {ran:?}");
        tokio::time::sleep(Duration::from_secs(120)).await;
        return;
    }
    let Begin::Acquired(lease) = idem.begin(&request(&idem, intent)).await.expect("begin") else {
        panic!("the child is first");
    };
    let mut tx = idem.store().pool().begin().await.expect("tx");
    let response = insert_charge(&mut tx, intent).await.expect("insert");
    idem.store()
        .complete_in(&mut tx, &idem.completion(&lease, response))
        .await
        .expect("complete_in");
    println!("READY");
    tokio::time::sleep(Duration::from_secs(120)).await;
    let _ = tx.commit().await;
}

/// A child process, stopped and killed when dropped (a failing test leaves none behind).
struct Frozen(Child);

impl Frozen {
    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.0.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {}", self.0.id());
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the child until it prints READY, then stops it with SIGSTOP.
fn run_child_and_freeze(mode: &str, table: &str, intent: &str) -> Frozen {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--ignored",
            "--exact",
            "freeze_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, format!("{mode}|{table}|{intent}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    let child = Frozen(child);
    let ready = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|line| line.contains("READY"));
    assert!(ready, "the child did not reach its freeze point");
    child.signal("-STOP");
    child
}

/// C9, C13: a process frozen (SIGSTOP) after its completion ran in its transaction and before
/// its COMMIT holds the record's row, and renews nothing. Its session is alive to the server
/// (the kernel still answers for it), so only a deadline the server enforces ends it: the
/// store's idle-in-transaction deadline, which the completion sets for the rest of the
/// caller's transaction as it sets the lock deadline. Then the orphan is taken over like any
/// other, and the effect runs once; without it every retry is answered in flight for as long
/// as the process stays frozen.
#[tokio::test]
async fn c09_c13_a_holder_frozen_before_its_commit_is_taken_over_in_bounded_time() {
    let table = format!("freeze_{}", idem_core::FencingToken::generate());
    let intent = format!("frozen-{}", idem_core::FencingToken::generate());
    let idem = engine(&table).await;
    let frozen = run_child_and_freeze("before-commit", &table, &intent);
    let stopped = Instant::now();

    let request = request(&idem, &intent);
    let bound = LEASE + IDLE + Duration::from_secs(5);
    let mut in_flight = 0;
    let lease = loop {
        let asked = Instant::now();
        let begun = idem.begin(&request).await;
        assert!(
            asked.elapsed() < Duration::from_secs(6),
            "a duplicate is answered within the store budget, took {:?}: {begun:?}",
            asked.elapsed()
        );
        match begun {
            Ok(Begin::Acquired(lease)) => break lease,
            Ok(Begin::Answered(Answer::InFlight { .. })) | Err(_) => {
                assert!(
                    stopped.elapsed() < bound,
                    "the frozen holder's record was never taken over within {bound:?} \
                     ({in_flight} in-flight answers, the last {begun:?})"
                );
                in_flight += 1;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Ok(other) => panic!("nothing completed the record: {other:?}"),
        }
    };
    let mut tx = idem.store().pool().begin().await.expect("tx");
    let response = insert_charge(&mut tx, &intent).await.expect("insert");
    idem.store()
        .complete_in(&mut tx, &idem.completion(&lease, response))
        .await
        .expect("complete_in");
    tx.commit().await.expect("commit");

    // The frozen process wakes up: its transaction is gone, its charge with it.
    frozen.signal("-CONT");
    drop(frozen);
    assert_eq!(charges(idem.store().pool(), &intent).await, 1, "one charge");
    assert!(
        matches!(
            idem.begin(&request).await.expect("replay"),
            Begin::Answered(Answer::Replay(_))
        ),
        "the takeover's answer is replayed"
    );
}

/// C15, C5, C13: a one-commit execution frozen (SIGSTOP) in its effect holds its gate (its
/// transaction's advisory locks) and an uncommitted row; nothing is visible. Duplicates from
/// another process are answered in flight at once, never wait on the row, and once the
/// server's idle deadline has ended the frozen session (nothing committed) the retry runs,
/// once: the woken process commits nothing.
#[tokio::test]
async fn c15_c05_a_one_commit_execution_frozen_in_its_effect_is_in_flight_then_leaves_nothing() {
    let table = format!("freeze_{}", idem_core::FencingToken::generate());
    let intent = format!("frozen1-{}", idem_core::FencingToken::generate());
    let idem = engine(&table).await;
    let frozen = run_child_and_freeze("one-commit", &table, &intent);
    let stopped = Instant::now();

    let request = request(&idem, &intent).with_one_commit(true);
    let bound = IDLE + Duration::from_secs(5);
    let mut in_flight = 0;
    let mut slowest = Duration::ZERO;
    let outcome = loop {
        let asked = Instant::now();
        let i = intent.clone();
        let outcome = idem
            .run_in_transaction(&request, move |tx, _| {
                Box::pin(async move { insert_charge(tx, &i).await })
            })
            .await;
        slowest = slowest.max(asked.elapsed());
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "a duplicate is answered at once, took {:?}: {outcome:?}",
            asked.elapsed()
        );
        match outcome {
            Ok(Outcome::Answered(Answer::InFlight { .. })) => {
                assert!(
                    stopped.elapsed() < bound,
                    "the frozen execution still holds its key after {bound:?}"
                );
                in_flight += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => break other,
        }
    };
    assert!(
        matches!(outcome, Ok(Outcome::Executed(_))),
        "the retry ran: {outcome:?}"
    );
    eprintln!(
        "retry ran {:?} after the freeze ({in_flight} in-flight answers, slowest {slowest:?})",
        stopped.elapsed()
    );
    frozen.signal("-CONT");
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(frozen);
    assert_eq!(charges(idem.store().pool(), &intent).await, 1, "one charge");
}

/// C6, C8, C9: a two-commit execution frozen in its effect past its lease and the server's idle
/// deadline, with nobody retrying meanwhile: woken, its transaction is gone (nothing
/// committed), and the key must not be burnt with a stored answer for an effect that rolled
/// back: the retry runs, once.
#[tokio::test]
async fn c08_c09_a_two_commit_execution_frozen_past_its_idle_deadline_leaves_the_key_free() {
    let table = format!("freeze_{}", idem_core::FencingToken::generate());
    let intent = format!("frozen2-{}", idem_core::FencingToken::generate());
    let idem = engine(&table).await;
    let frozen = run_child_and_freeze("two-commit", &table, &intent);
    tokio::time::sleep(IDLE + Duration::from_secs(2)).await;
    frozen.signal("-CONT");
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(frozen);
    assert_eq!(
        charges(idem.store().pool(), &intent).await,
        0,
        "nothing committed"
    );
    let request = request(&idem, &intent);
    let i = intent.clone();
    let outcome = idem
        .run_in_transaction(&request, move |tx, _| {
            Box::pin(async move { insert_charge(tx, &i).await })
        })
        .await;
    eprintln!("the retry after the woken execution: {outcome:?}");
    assert!(matches!(outcome, Ok(Outcome::Executed(_))), "{outcome:?}");
    assert_eq!(charges(idem.store().pool(), &intent).await, 1, "one charge");
}
