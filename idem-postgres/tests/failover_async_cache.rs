//! As failover.rs, with asynchronous replication and a replay cache: the promotion may lose
//! the last commits (docs/stores.md), but every answer given after the promotion is what the
//! new primary holds, and nothing is charged twice on it.

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
        Idempotency::builder(store)
            .policy(policy)
            .replay_cache(idem_core::ReplayCache::new(100_000, 64 << 20))
            .build()
            .expect("policy"),
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

/// C13: the primary dies under load, the standby is promoted; the store follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c07_answers_after_an_asynchronous_promotion_are_the_new_primary_s() {
    let pair = PgPair::start_async().await;
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
            let mut calls: Vec<(String, Charged, Duration, Instant)> = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("fo-{run}-{task}-{n}");
                n += 1;
                let until = Instant::now() + Duration::from_secs(30);
                loop {
                    let started = Instant::now();
                    let charged = charge(&idem, &charges, &key).await;
                    let done = answered(&charged);
                    calls.push((key.clone(), charged, started.elapsed(), started));
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
    pair.kill_primary().await;
    let killed = Instant::now();
    // What a failover manager takes to notice.
    tokio::time::sleep(Duration::from_millis(500)).await;
    pair.promote_standby().await;
    let promoted = Instant::now();
    let promoted_at = promoted;

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
    tokio::time::sleep(Duration::from_secs(1)).await;
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

    let ids: HashMap<String, Vec<i64>> = sqlx::raw_sql(AssertSqlSafe(format!(
        "SELECT intent, array_agg(id) FROM {charges} GROUP BY intent"
    )))
    .fetch_all(
        &mut PgConnection::connect(&PgPair::url(pair.standby_port))
            .await
            .expect("c"),
    )
    .await
    .expect("ids")
    .iter()
    .map(|row| (row.get::<String, _>(0), row.get::<Vec<i64>, _>(1)))
    .collect();
    let twice: Vec<_> = per_intent.iter().filter(|(_, n)| **n > 1).collect();
    let mut stale = Vec::new();
    for (key, answer, _, started) in &calls {
        if *started < promoted_at {
            continue;
        }
        let body = match answer {
            Ok(Outcome::Executed(r)) | Ok(Outcome::Answered(Answer::Replay(r))) => {
                String::from_utf8_lossy(&r.body).into_owned()
            }
            _ => continue,
        };
        let held = ids.get(key).cloned().unwrap_or_default();
        if !held.iter().any(|id| body.starts_with(&format!("{id} ")))
            || !body.ends_with(&pair.standby_port.to_string())
        {
            stale.push((key.clone(), body, held, started.duration_since(promoted_at)));
        }
    }
    eprintln!(
        "async failover: {} calls on {} keys, recovered {recovered:?}; answers {:?}; {} stale",
        calls.len(),
        per_intent.len(),
        tally(calls.iter().map(|(_, answer, _, _)| answer)),
        stale.len()
    );
    let _ = (&completed, killed);
    assert!(
        twice.is_empty(),
        "charged more than once on the new primary: {twice:?}"
    );
    assert!(
        stale.is_empty(),
        "answers after the promotion that the new primary does not hold: {:?}",
        &stale[..stale.len().min(10)]
    );
}
