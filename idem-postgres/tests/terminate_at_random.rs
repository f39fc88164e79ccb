//! Sessions ended at random under load (C4, C6, C7, C8, C15): three engines (processes' worth of
//! stores: two commits, one commit, two commits with a replay cache) charge keys of one small
//! key space at once, every charge written in its completion's transaction, while a killer ends
//! one of the servers' client sessions every few milliseconds (`pg_terminate_backend`: a
//! statement, a COMMIT, an idle connection). No key is charged twice, every answer that says
//! charged is the stored one, and no stored charge lacks its record. `TWO_HOSTS=1` gives the
//! stores the primary and its standby: each ended session then moves the store to the standby
//! and back, closing every connection (about half the throughput, no wrong answer).

mod common;
mod support;

use idem_core::{Answer, FencingToken, Idempotency, Outcome, Policy, ReplayCache, StoredResponse};
use idem_postgres::sqlx::{self, AssertSqlSafe, Connection, PgConnection, Row};
use idem_postgres::{PgIdempotency, PgStore};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::bench::Charged;
use support::pg_pair::PgPair;

const TASKS: usize = 18;

async fn engine(url: &str, table: &str, one_commit: bool, cache: bool) -> Idempotency<PgStore> {
    let store = PgStore::builder()
        .table(table)
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(2))
        .statement_timeout(Duration::from_millis(1500))
        .lock_timeout(Duration::from_millis(1000))
        .transaction_timeout(Duration::from_secs(3))
        .connect(url)
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    let policy = Policy::default()
        .store_timeout(Duration::from_secs(2))
        .lease(Duration::from_secs(3))
        .one_commit(one_commit);
    let mut builder = Idempotency::builder(store).policy(policy);
    if cache {
        builder = builder.replay_cache(ReplayCache::new(1_000, 1 << 20));
    }
    builder.build().expect("engine")
}

async fn charge(idem: &Idempotency<PgStore>, key: &str) -> Charged {
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some(key))
        .body(b"{\"cents\":2500}")
        .build()
        .expect("request");
    let intent = key.to_owned();
    idem.run_in_transaction(&request, move |tx, _lease| {
        Box::pin(async move {
            let (id,): (i64,) =
                sqlx::query_as("INSERT INTO tr_charges (intent) VALUES ($1) RETURNING id")
                    .bind(intent)
                    .fetch_one(&mut *tx)
                    .await?;
            Ok::<_, sqlx::Error>(StoredResponse::new(201, format!("charge {id}")))
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c04_c07_sessions_ended_at_random_never_charge_twice_nor_answer_another_charge() {
    let pair = PgPair::start().await;
    let url = PgPair::url(pair.primary_port);
    let table = format!("tr_{}", FencingToken::generate());
    let mut setup = PgConnection::connect(&url).await.expect("connect");
    sqlx::raw_sql("CREATE TABLE tr_charges (id bigserial PRIMARY KEY, intent text NOT NULL)")
        .execute(&mut setup)
        .await
        .expect("charges");
    let store_url = if std::env::var("TWO_HOSTS").is_ok() {
        PgPair::hosts_url(pair.primary_port, pair.standby_port)
    } else {
        url.clone()
    };
    let engines = Arc::new(vec![
        engine(&store_url, &table, false, false).await,
        engine(&store_url, &table, true, false).await,
        engine(&store_url, &table, false, true).await,
    ]);
    let stop = Arc::new(AtomicBool::new(false));
    let killer = {
        let (stop, url) = (Arc::clone(&stop), url.clone());
        tokio::spawn(async move {
            let mut conn = PgConnection::connect(&url).await.expect("connect");
            let mut ended = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let row = sqlx::raw_sql(
                    "SELECT count(pg_terminate_backend(pid)) FROM (SELECT pid FROM pg_stat_activity \
                     WHERE pid <> pg_backend_pid() AND backend_type = 'client backend' \
                     AND application_name = '' ORDER BY random() LIMIT 1) s",
                )
                .fetch_one(&mut conn)
                .await
                .expect("terminate");
                ended += u64::try_from(row.get::<i64, _>(0)).unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            ended
        })
    };
    let run = FencingToken::generate();
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (engines, stop) = (Arc::clone(&engines), Arc::clone(&stop));
        tasks.push(tokio::spawn(async move {
            let mut seen: Vec<(String, usize, Charged, Duration)> = Vec::new();
            let mut iteration = 0;
            while !stop.load(Ordering::Relaxed) {
                // Three tasks at a time on one key, each through another engine; twice each.
                let n = iteration / 2 * TASKS + task;
                iteration += 1;
                let key = format!("k-{run}-{}", n / 3);
                let which = n % 3;
                let started = Instant::now();
                let charged = charge(&engines[which], &key).await;
                seen.push((key, which, charged, started.elapsed()));
            }
            seen
        }));
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    stop.store(true, Ordering::Relaxed);
    let ended = killer.await.expect("killer");
    let mut calls = Vec::new();
    for task in tasks {
        calls.extend(task.await.expect("task"));
    }
    // Let every detached completion land.
    tokio::time::sleep(Duration::from_secs(4)).await;

    let mut conn = PgConnection::connect(&url).await.expect("connect");
    let charges: Vec<(String, i64)> = sqlx::raw_sql("SELECT intent, id FROM tr_charges")
        .fetch_all(&mut conn)
        .await
        .expect("charges")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut per_key: HashMap<String, Vec<i64>> = HashMap::new();
    for (intent, id) in &charges {
        per_key.entry(intent.clone()).or_default().push(*id);
    }
    let twice: Vec<_> = per_key.iter().filter(|(_, ids)| ids.len() > 1).collect();
    let records: HashMap<String, Option<Vec<u8>>> = sqlx::raw_sql(AssertSqlSafe(format!(
        "SELECT key, CASE WHEN state = 1 THEN response END FROM public.{table}"
    )))
    .fetch_all(&mut conn)
    .await
    .expect("records")
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect();
    let mut wrong = Vec::new();
    let mut tally: HashMap<String, usize> = HashMap::new();
    for (key, which, charged, took) in &calls {
        let label = match charged {
            Ok(Outcome::Executed(_)) => "executed".to_owned(),
            Ok(Outcome::Answered(Answer::Replay(_))) => "replayed".to_owned(),
            Ok(other) => format!("{other:?}").chars().take(20).collect(),
            Err(e) => format!("{e:?}").chars().take(24).collect(),
        };
        *tally.entry(label).or_default() += 1;
        let body = match charged {
            Ok(Outcome::Executed(r)) | Ok(Outcome::Answered(Answer::Replay(r))) => {
                String::from_utf8_lossy(&r.body).into_owned()
            }
            _ => continue,
        };
        let ids = per_key.get(key).cloned().unwrap_or_default();
        if !ids.iter().any(|id| body == format!("charge {id}")) {
            wrong.push((key.clone(), *which, body, ids, *took));
        }
    }
    let without_record: Vec<_> = per_key
        .keys()
        .filter(|key| !matches!(records.get(*key), Some(Some(_))))
        .collect();
    eprintln!(
        "{} calls, {ended} sessions ended, {} keys charged; {tally:?}",
        calls.len(),
        per_key.len()
    );
    assert!(ended > 0, "the killer ended no session: nothing was tested");
    assert!(twice.is_empty(), "charged twice: {twice:?}");
    assert!(
        wrong.is_empty(),
        "answers that are not the key's charge: {wrong:?}"
    );
    assert!(
        without_record.is_empty(),
        "charges without a completed record: {without_record:?}"
    );
}
