//! One commit (C15) through a failover (C13, C4, C5, C6): a primary with a synchronous standby
//! of the test's own, the store given both hosts, every `run_in_transaction` in one commit
//! (reservation, effect and completion in one transaction). Clients charge fresh keys, each key
//! sent twice at once (a duplicate while the one transaction is open) and retried until
//! answered; the primary is killed or frozen and the standby promoted. With a synchronous
//! standby nothing acknowledged may be lost (docs/stores.md, Failover): every key is charged at
//! most once on the new primary, every answer a client got for a key is the same one, and every
//! call is answered within its budget. Also REPEATABLE READ one commit, and SERIALIZABLE with
//! two commits (conflicts retried by the clients). These held when written (regression probes).

mod common;
mod support;

use idem_core::{Answer, FencingToken, Idempotency, Outcome, Policy, StoredResponse};
use idem_postgres::sqlx::{self, AssertSqlSafe, Connection, PgConnection, Row};
use idem_postgres::{Isolation, PgIdempotency, PgStore};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::bench::{answered, tally, Charged};
use support::pg_pair::{PgPair, PrimaryFault};

const STORE_TIMEOUT: Duration = Duration::from_secs(2);
const STATEMENT_TIMEOUT: Duration = Duration::from_millis(1500);
const LOCK_TIMEOUT: Duration = Duration::from_millis(1000);
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(4);
const LEASE: Duration = Duration::from_secs(5);
const CALL_BUDGET: Duration = Duration::from_secs(4 + 3 * 2);
const MARGIN: Duration = Duration::from_secs(2);
const TASKS: usize = 16;
const CONNECTIONS: u32 = 8;
const RETRY_EVERY: Duration = Duration::from_millis(50);

async fn engine(
    url: &str,
    isolation: Isolation,
    one_commit: bool,
) -> (Idempotency<PgStore>, String) {
    let store = PgStore::builder()
        .isolation(isolation)
        .table(&format!("ocf_{}", FencingToken::generate()))
        .max_connections(CONNECTIONS)
        .acquire_timeout(STORE_TIMEOUT)
        .statement_timeout(STATEMENT_TIMEOUT)
        .lock_timeout(LOCK_TIMEOUT)
        .transaction_timeout(TRANSACTION_TIMEOUT)
        .idle_in_transaction_timeout(TRANSACTION_TIMEOUT)
        .connect(url)
        .await
        .expect("connect to the pair");
    store.migrate().await.expect("migrate");
    let charges = format!("charges_{}", FencingToken::generate());
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {charges} (id bigserial PRIMARY KEY, intent text NOT NULL)"
    )))
    .execute(store.pool())
    .await
    .expect("the charges table");
    let policy = Policy::default()
        .store_timeout(STORE_TIMEOUT)
        .lease(LEASE)
        .one_commit(one_commit);
    (
        Idempotency::with_policy(store, policy).expect("policy"),
        charges,
    )
}

async fn charge(idem: &Idempotency<PgStore>, charges: &str, key: &str) -> Charged {
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some(key))
        .body(b"{\"cents\":2500}")
        .build()
        .expect("request");
    let insert = format!("INSERT INTO {charges} (intent) VALUES ($1) RETURNING id");
    let intent = key.to_owned();
    idem.run_in_transaction(&request, move |tx, _lease| {
        Box::pin(async move {
            let (id,): (i64,) = sqlx::query_as(AssertSqlSafe(insert))
                .bind(intent)
                .fetch_one(&mut *tx)
                .await?;
            // A little work in the transaction, so that failures land inside it too.
            sqlx::query("SELECT pg_sleep(0.01)")
                .execute(&mut *tx)
                .await?;
            let (port,): (String,) = sqlx::query_as("SELECT current_setting('port')")
                .fetch_one(&mut *tx)
                .await?;
            Ok::<_, sqlx::Error>(StoredResponse::new(201, format!("{id} {port}")))
        })
    })
    .await
}

fn body(charged: &Charged) -> Option<String> {
    match charged {
        // A charge's answer (a stored 500 of an unknown outcome is a key kept, no charge).
        Ok(Outcome::Executed(r)) | Ok(Outcome::Answered(Answer::Replay(r))) if r.status == 201 => {
            Some(String::from_utf8_lossy(&r.body).into_owned())
        }
        _ => None,
    }
}

type Call = (String, Charged, Duration, Instant);

async fn one_commit_promotion(fault: PrimaryFault) {
    promotion(fault, Isolation::ReadCommitted, true).await;
}

async fn promotion(fault: PrimaryFault, isolation: Isolation, one_commit: bool) {
    let pair = PgPair::start().await;
    let url = PgPair::hosts_url(pair.primary_port, pair.standby_port);
    let (idem, charges) = engine(&url, isolation, one_commit).await;
    let idem = Arc::new(idem);
    let charges = Arc::new(charges);
    let run = FencingToken::generate();
    let stop = Arc::new(AtomicBool::new(false));

    let mut clients = Vec::new();
    for task in 0..TASKS {
        let (idem, charges, stop) = (Arc::clone(&idem), Arc::clone(&charges), Arc::clone(&stop));
        clients.push(tokio::spawn(async move {
            let mut calls: Vec<Call> = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("ocf-{run}-{task}-{n}");
                n += 1;
                let until = Instant::now() + Duration::from_secs(30);
                loop {
                    // The request and a duplicate of it at once.
                    let started = Instant::now();
                    let (a, b) = tokio::join!(
                        async {
                            let c = charge(&idem, &charges, &key).await;
                            (c, started.elapsed())
                        },
                        async {
                            let c = charge(&idem, &charges, &key).await;
                            (c, started.elapsed())
                        }
                    );
                    let done = answered(&a.0) || answered(&b.0);
                    calls.push((key.clone(), a.0, a.1, started));
                    calls.push((key.clone(), b.0, b.1, started));
                    if done || Instant::now() >= until {
                        break;
                    }
                    tokio::time::sleep(RETRY_EVERY).await;
                }
                let started = Instant::now();
                let again = charge(&idem, &charges, &key).await;
                calls.push((key.clone(), again, started.elapsed(), started));
            }
            calls
        }));
    }

    tokio::time::sleep(Duration::from_millis(1500)).await;
    let frozen = pair.fail_primary(fault).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    pair.promote_standby().await;
    let promoted = Instant::now();
    // Load on the new primary for a while.
    tokio::time::sleep(Duration::from_secs(6)).await;
    stop.store(true, Ordering::Relaxed);
    let mut calls = Vec::new();
    for client in clients {
        calls.extend(client.await.expect("a client"));
    }

    let mut conn = PgConnection::connect(&PgPair::url(pair.standby_port))
        .await
        .expect("connect to the new primary");
    let ids: HashMap<String, Vec<i64>> = sqlx::raw_sql(AssertSqlSafe(format!(
        "SELECT intent, array_agg(id) FROM {charges} GROUP BY intent"
    )))
    .fetch_all(&mut conn)
    .await
    .expect("charges")
    .iter()
    .map(|row| (row.get::<String, _>(0), row.get::<Vec<i64>, _>(1)))
    .collect();
    let table = idem.store().table();
    let completed: HashSet<String> = sqlx::raw_sql(AssertSqlSafe(format!(
        "SELECT key FROM {table} WHERE state = 1"
    )))
    .fetch_all(&mut conn)
    .await
    .expect("records")
    .iter()
    .map(|row| row.get::<String, _>(0))
    .collect();
    conn.close().await.expect("close");
    drop(frozen);
    eprintln!(
        "failover ({fault:?}, {isolation:?}, one commit {one_commit}): {} calls on {} keys; answers {:?}",
        calls.len(),
        ids.len(),
        tally(calls.iter().map(|(_, answer, _, _)| answer))
    );

    let mut slowest: Vec<_> = calls
        .iter()
        .map(|(k, a, took, started)| {
            (
                *took,
                support::bench::kind(a),
                k.clone(),
                started.checked_duration_since(promoted),
            )
        })
        .collect();
    slowest.sort_by_key(|s| std::cmp::Reverse(s.0));
    eprintln!("slowest: {:?}", &slowest[..slowest.len().min(5)]);
    let twice: Vec<_> = ids.iter().filter(|(_, v)| v.len() > 1).collect();
    let mut bodies: HashMap<&String, HashSet<String>> = HashMap::new();
    for (key, answer, _, _) in &calls {
        if let Some(b) = body(answer) {
            bodies.entry(key).or_default().insert(b);
        }
    }
    let two_answers: Vec<_> = bodies.iter().filter(|(_, b)| b.len() > 1).collect();
    let told_but_lost: Vec<_> = bodies
        .iter()
        .filter(|(key, b)| {
            let held = ids.get(**key).cloned().unwrap_or_default();
            b.iter()
                .any(|b| !held.iter().any(|id| b.starts_with(&format!("{id} "))))
        })
        .map(|(k, b)| (k, b, ids.get(*k)))
        .collect();
    let charged: HashSet<String> = ids.keys().cloned().collect();
    let without_record: Vec<_> = charged.difference(&completed).collect();
    let slow: Vec<_> = calls
        .iter()
        .filter(|(_, _, took, _)| *took > CALL_BUDGET + MARGIN)
        .map(|(k, a, took, started)| {
            (
                k,
                support::bench::kind(a),
                *took,
                started.checked_duration_since(promoted),
            )
        })
        .collect();
    assert!(twice.is_empty(), "charged more than once: {twice:?}");
    assert!(
        two_answers.is_empty(),
        "a key answered with two different charges: {two_answers:?}"
    );
    assert!(
        told_but_lost.is_empty(),
        "charges answered to a client and lost in the failover: {told_but_lost:?}"
    );
    assert!(
        without_record.is_empty(),
        "charges without their record: {without_record:?}"
    );
    assert!(slow.is_empty(), "calls past their budget: {slow:?}");
}

/// C15, C13: one-commit executions in flight when the primary is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c15_one_commit_through_a_killed_primary_and_a_promotion() {
    one_commit_promotion(PrimaryFault::Killed).await;
}

/// C15, C13: one-commit executions in flight when the primary goes silent (SIGSTOP).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c15_one_commit_through_a_frozen_primary_and_a_promotion() {
    one_commit_promotion(PrimaryFault::Frozen).await;
}

/// C15, C13: one commit at REPEATABLE READ through a frozen primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c15_repeatable_read_one_commit_through_a_frozen_primary() {
    promotion(PrimaryFault::Frozen, Isolation::RepeatableRead, true).await;
}

/// C15, C13: one commit at REPEATABLE READ through a killed primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c15_repeatable_read_one_commit_through_a_killed_primary() {
    promotion(PrimaryFault::Killed, Isolation::RepeatableRead, true).await;
}

/// C6, C13: two commits at SERIALIZABLE (conflicts retried by clients) through a frozen primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c06_serializable_through_a_frozen_primary() {
    promotion(PrimaryFault::Frozen, Isolation::Serializable, false).await;
}

/// C6, C13: two commits at SERIALIZABLE through a killed primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c06_serializable_through_a_killed_primary() {
    promotion(PrimaryFault::Killed, Isolation::Serializable, false).await;
}
