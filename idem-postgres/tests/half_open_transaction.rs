//! A half-open connection during the effect's transaction (C13, C8): the connection breaks on
//! the client's side right after the completion statement reached the server, which ran it and
//! now sits "idle in transaction" holding the record's row, hearing nothing (no FIN: the
//! client's host vanished, a NAT forgot the flow). The caller gets a 503 within the deadline;
//! the server ends that session by the transaction's idle deadline, so the row is free again,
//! the key is given back (nothing committed), and the retry runs, once, soon after: never a
//! 409 until the server's TCP keepalive notices, hours later.

mod common;
mod support;

use common::{pg_url, SCHEMA};
use fault_proxy::Orphan;
use idem_core::{FencingToken, Policy, StoredResponse};
use idem_postgres::sqlx::{self, AssertSqlSafe, Connection, PgConnection, Row};
use idem_postgres::{PgIdempotency, PgStore};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::bench::{kind, tally, unavailable, Bench, Charged};

const STORE_TIMEOUT: Duration = Duration::from_millis(700);
const STATEMENT_TIMEOUT: Duration = Duration::from_millis(500);
const LOCK_TIMEOUT: Duration = Duration::from_millis(400);
const IDLE_IN_TRANSACTION: Duration = Duration::from_millis(250);
/// Longer than the test: a key given back early is the store's doing, not the lease's.
const LEASE: Duration = Duration::from_secs(20);
const RETRY_EVERY: Duration = Duration::from_millis(100);
/// The first call: the completion's failure, a bounded rollback, a bounded release.
const ANSWER_WITHIN: Duration = Duration::from_millis(2_200);

/// C13: a half-open connection in the effect's transaction is a 503 within the deadline, and
/// the retry runs once within two store timeouts: the orphaned session does not hold the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_half_open_connection_in_the_effects_transaction_never_holds_the_key() {
    let builder = PgStore::builder()
        .max_connections(4)
        .statement_timeout(STATEMENT_TIMEOUT)
        .lock_timeout(LOCK_TIMEOUT)
        .idle_in_transaction_timeout(IDLE_IN_TRANSACTION);
    let policy = Policy::default().store_timeout(STORE_TIMEOUT).lease(LEASE);
    let bench = Arc::new(Bench::new(&pg_url(), SCHEMA, builder, policy).await);
    let key = format!("half-open-{}", FencingToken::generate());
    let request = bench.request(&key);

    // The effect charges, then arms the fault: the next message naming the key is the
    // completion's, on the transaction's connection.
    let (insert, intent) = bench.insert(&request);
    let proxy = Arc::clone(&bench.proxy);
    let started = Instant::now();
    let first: Charged = bench
        .idem
        .run_in_transaction(&request, move |tx, _lease| {
            Box::pin(async move {
                let (id,): (i64,) = sqlx::query_as(AssertSqlSafe(insert))
                    .bind(intent.clone())
                    .fetch_one(&mut *tx)
                    .await?;
                proxy.set(Orphan::at(intent.into_bytes()));
                Ok::<_, sqlx::Error>(StoredResponse::new(201, format!("charge {id}")))
            })
        })
        .await;
    let answered_after = started.elapsed();
    eprintln!("first call: {} after {answered_after:?}", kind(&first));
    assert_eq!(bench.proxy.orphaned(), 1, "the fault was injected");
    assert!(
        unavailable(&first),
        "a broken transaction is a store-unavailable 503: {first:?}"
    );
    assert!(
        answered_after <= ANSWER_WITHIN,
        "answered within the deadline, took {answered_after:?}"
    );

    let fault_ended = Instant::now();
    let attempts = bench
        .charge_until_answered(&request, RETRY_EVERY, Duration::from_secs(6))
        .await;
    let recovered = fault_ended.elapsed();
    let answers: Vec<_> = attempts.iter().map(|(charged, _)| charged).collect();
    eprintln!(
        "retries: {:?}, answered after {recovered:?}; orphaned sessions left: {}",
        tally(answers.iter().copied()),
        orphaned_sessions(&bench).await
    );
    let (last, _) = attempts.last().expect("an attempt");
    assert!(
        matches!(last, Ok(idem_core::Outcome::Executed(_))),
        "the retry runs: {last:?}"
    );
    assert!(
        recovered <= 2 * STORE_TIMEOUT,
        "the retry ran within two store timeouts, took {recovered:?}"
    );
    let slowest = attempts
        .iter()
        .map(|(_, took)| *took)
        .max()
        .unwrap_or_default();
    assert!(
        slowest <= ANSWER_WITHIN + RETRY_EVERY,
        "every retry answered within the deadline, the slowest took {slowest:?}"
    );
    assert_eq!(bench.charges_of(&request).await, 1, "charged exactly once");
}

/// How many sessions still sit in a transaction on the store's table.
async fn orphaned_sessions(bench: &Bench) -> usize {
    let mut conn = PgConnection::connect(&bench.direct_url)
        .await
        .expect("connect");
    let table = bench.records.replace('"', "");
    let table = table.rsplit('.').next().unwrap_or(&table).to_owned();
    let query = format!(
        "SELECT COUNT(*) FROM pg_stat_activity \
         WHERE state LIKE 'idle in transaction%' AND query LIKE '%{table}%'"
    );
    let row = sqlx::raw_sql(AssertSqlSafe(query))
        .fetch_one(&mut conn)
        .await
        .expect("pg_stat_activity");
    usize::try_from(row.try_get::<i64, _>(0).expect("a count")).expect("a count")
}
