//! The store follows a failover away from a primary that went silent (C13, C4, C6): as
//! `failover.rs`, but the primary is frozen (SIGSTOP on every process of it: its sockets stay
//! open, nothing answers) instead of killed, and the synchronous standby is promoted while it
//! is frozen. Every call is answered within its budget, nothing is charged twice, no completion
//! is lost, and the store charges again on the new primary by itself.

mod common;
mod support;

use idem_core::{Answer, FencingToken, Idempotency, Outcome, Policy, StoredResponse};
use idem_postgres::sqlx::{self, AssertSqlSafe, Connection, PgConnection, Row};
use idem_postgres::{PgIdempotency, PgStore};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::bench::{answered, tally, Charged};
use support::pg_pair::PgPair;

/// The engine's deadline for one store call.
const STORE_TIMEOUT: Duration = Duration::from_secs(2);
/// The store's own deadlines, below it.
const STATEMENT_TIMEOUT: Duration = Duration::from_millis(1500);
const LOCK_TIMEOUT: Duration = Duration::from_millis(1000);
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(4);
/// Short enough for a key cut off mid-execution to be retried within the test.
const LEASE: Duration = Duration::from_secs(5);
/// One call's budget: the effect is bounded by the transaction timeout, the steps around it by
/// the store timeout (the slowest paths take three of them besides the effect).
const CALL_BUDGET: Duration = Duration::from_secs(4 + 3 * 2);
/// What a loaded machine may add to a call's budget.
const MARGIN: Duration = Duration::from_secs(2);
const TASKS: usize = 32;
const CONNECTIONS: u32 = 8;
const RETRY_EVERY: Duration = Duration::from_millis(50);

/// A store on `url` and an engine over it, on a table of its own; the charges table beside it.
async fn engine(url: &str) -> (Idempotency<PgStore>, String) {
    let store = PgStore::builder()
        .table(&format!("f_{}", FencingToken::generate()))
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
    let policy = Policy::default().store_timeout(STORE_TIMEOUT).lease(LEASE);
    (
        Idempotency::with_policy(store, policy).expect("policy"),
        charges,
    )
}

/// One charge of `key`: its row in `charges`, in the transaction of the completion.
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
            let (port,): (String,) = sqlx::query_as("SELECT current_setting('port')")
                .fetch_one(&mut *tx)
                .await?;
            Ok::<_, sqlx::Error>(StoredResponse::new(201, format!("{id} {port}")))
        })
    })
    .await
}

/// The key of an answer that says the charge happened.
fn charged_key(charged: &Charged) -> bool {
    matches!(
        charged,
        Ok(Outcome::Executed(_)) | Ok(Outcome::Answered(Answer::Replay(_)))
    )
}

/// C13: the primary dies under load, the standby is promoted; the store follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c13_the_store_leaves_a_frozen_primary_for_the_promoted_standby_under_load() {
    let pair = PgPair::start().await;
    let url = PgPair::hosts_url(pair.primary_port, pair.standby_port);
    let (idem, charges) = engine(&url).await;
    let idem = Arc::new(idem);
    let charges = Arc::new(charges);
    let run = FencingToken::generate();
    let stop = Arc::new(AtomicBool::new(false));

    // Clients charge fresh keys one after another, retrying each until it is answered, then
    // send it once more (a client's retry of an answered request: a replay).
    let mut clients = Vec::new();
    for task in 0..TASKS {
        let (idem, charges, stop) = (Arc::clone(&idem), Arc::clone(&charges), Arc::clone(&stop));
        clients.push(tokio::spawn(async move {
            let mut calls: Vec<(String, Charged, Duration)> = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("fo-{run}-{task}-{n}");
                n += 1;
                let until = Instant::now() + Duration::from_secs(30);
                loop {
                    let started = Instant::now();
                    let charged = charge(&idem, &charges, &key).await;
                    let done = answered(&charged);
                    calls.push((key.clone(), charged, started.elapsed()));
                    if done || Instant::now() >= until {
                        break;
                    }
                    tokio::time::sleep(RETRY_EVERY).await;
                }
                let started = Instant::now();
                let again = charge(&idem, &charges, &key).await;
                calls.push((key.clone(), again, started.elapsed()));
            }
            calls
        }));
    }

    tokio::time::sleep(Duration::from_millis(1500)).await;
    let frozen = Frozen(pair.freeze_primary());
    let killed = Instant::now();
    // What a failover manager takes to notice.
    tokio::time::sleep(Duration::from_millis(500)).await;
    pair.promote_standby().await;
    let promoted = Instant::now();

    // A probe on keys of its own: how long after the promotion the store charges again.
    let mut probes = 0;
    let recovered = loop {
        probes += 1;
        let charged = charge(&idem, &charges, &format!("probe-{run}-{probes}")).await;
        if answered(&charged) {
            break promoted.elapsed();
        }
        assert!(
            promoted.elapsed() < Duration::from_secs(30),
            "the store never followed the promotion: {charged:?}"
        );
        tokio::time::sleep(RETRY_EVERY).await;
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let mut calls = Vec::new();
    for client in clients {
        calls.extend(client.await.expect("a client"));
    }

    // Read on the new primary, straight.
    let mut conn = PgConnection::connect(&PgPair::url(pair.standby_port))
        .await
        .expect("connect to the new primary");
    let per_intent: HashMap<String, i64> = sqlx::raw_sql(AssertSqlSafe(format!(
        "SELECT intent, count(*) FROM {charges} GROUP BY intent"
    )))
    .fetch_all(&mut conn)
    .await
    .expect("charges")
    .iter()
    .map(|row| (row.get::<String, _>(0), row.get::<i64, _>(1)))
    .collect();
    let table = idem.store().table();
    let completed: HashSet<String> = sqlx::raw_sql(AssertSqlSafe(format!(
        "SELECT key FROM {table} WHERE state = 1 AND doubt IS NULL"
    )))
    .fetch_all(&mut conn)
    .await
    .expect("records")
    .iter()
    .map(|row| row.get::<String, _>(0))
    .collect();
    conn.close().await.expect("close");
    drop(frozen);

    let twice: Vec<_> = per_intent.iter().filter(|(_, n)| **n > 1).collect();
    let charged: HashSet<String> = per_intent.keys().cloned().collect();
    let without_record: Vec<_> = charged.difference(&completed).collect();
    let without_charge: Vec<_> = completed.difference(&charged).collect();
    let told_but_lost: Vec<_> = calls
        .iter()
        .filter(|(key, answer, _)| charged_key(answer) && !charged.contains(key))
        .map(|(key, _, _)| key)
        .collect();
    let slowest = calls
        .iter()
        .map(|(_, _, took)| *took)
        .max()
        .unwrap_or_default();
    eprintln!(
        "failover: {} calls on {} keys, {} duplicates, slowest {slowest:?}, recovered \
         {recovered:?} after the promotion ({:?} after the kill, {probes} probes); answers {:?}",
        calls.len(),
        per_intent.len(),
        twice.len(),
        killed.elapsed().saturating_sub(promoted.elapsed()) + recovered,
        tally(calls.iter().map(|(_, answer, _)| answer))
    );
    assert!(twice.is_empty(), "charged more than once: {twice:?}");
    assert!(
        without_record.is_empty() && without_charge.is_empty(),
        "lost completions: charges without their record {without_record:?}, records without \
         their charge {without_charge:?}"
    );
    assert!(
        told_but_lost.is_empty(),
        "charges answered to a client and lost in the failover: {told_but_lost:?}"
    );
    assert!(
        slowest <= CALL_BUDGET + MARGIN,
        "every call answered within its budget, the slowest took {slowest:?}"
    );
    assert!(
        recovered <= 2 * STORE_TIMEOUT,
        "charging again within two budgets of the promotion, took {recovered:?}"
    );
}

/// The frozen primary's processes, killed when the test ends (however it ends).
struct Frozen(Vec<i32>);

impl Drop for Frozen {
    fn drop(&mut self) {
        PgPair::kill_frozen(&self.0);
    }
}
