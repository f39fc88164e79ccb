//! The store behind PgBouncer in transaction mode, on a database whose default isolation is
//! SERIALIZABLE (C5, C13): PgBouncer hands each of the store's transactions whichever server
//! connection is free, so nothing a client connection set for its session follows it. The
//! store's statements and the effect's transaction still run at READ COMMITTED: concurrent
//! retrying clients on the same keys get their answers (executed, in flight, replayed), never
//! a serialization failure, and every key is charged exactly once.

mod common;
mod support;

use common::{pg_url, SCHEMA};
use idem_core::{Error, FencingToken, Policy, RunError, StoreErrorKind, StoredResponse};
use idem_postgres::sqlx::{self, AssertSqlSafe, Connection, PgConnection};
use idem_postgres::{PgIdempotency, PgStore, StatementMode};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::bench::{answered, tally, Bench, Charged};
use support::private_bouncer::PrivateBouncer;

const TASKS: usize = 16;
const KEYS_PER_TASK: usize = 10;
const RETRY_EVERY: Duration = Duration::from_millis(20);
const STORE_TIMEOUT: Duration = Duration::from_secs(2);
/// Every call is one store round trip or a short transaction.
const CALL_DEADLINE: Duration = Duration::from_secs(3);

/// C5, C13: a SERIALIZABLE database default behind PgBouncer never turns an answer into a
/// serialization failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c05_behind_pgbouncer_a_serializable_default_never_fails_an_answer() {
    // The shared PgBouncer must be there too: this one mirrors it.
    let _ = common::bouncer_url();
    let database = format!("idem_ser_{}", FencingToken::generate());
    admin(&format!("CREATE DATABASE {database}")).await;
    admin(&format!(
        "ALTER DATABASE {database} SET default_transaction_isolation = 'serializable'"
    ))
    .await;
    let server_url = pg_url();
    let bouncer = PrivateBouncer::start(&server_url, &database, 16).await;
    let mut check = PgConnection::connect(bouncer.url()).await.expect("connect");
    let isolation: (String,) = sqlx::query_as(AssertSqlSafe("SHOW transaction_isolation"))
        .persistent(false)
        .fetch_one(&mut check)
        .await
        .expect("the database default");
    assert_eq!(isolation.0, "serializable", "the fault is in place");
    drop(check);

    let builder = PgStore::builder()
        .statements(StatementMode::Simple)
        .max_connections(4);
    let policy = Policy::default().store_timeout(STORE_TIMEOUT);
    let bench = Arc::new(Bench::new(bouncer.url(), SCHEMA, builder, policy).await);
    let run = FencingToken::generate();

    // Two clients per key, at once, each retrying until it is answered for good.
    let mut clients = Vec::new();
    for task in 0..TASKS {
        let bench = Arc::clone(&bench);
        clients.push(tokio::spawn(async move {
            let mut calls = Vec::new();
            for n in 0..KEYS_PER_TASK {
                let key = format!("ser-{run}-{}-{n}", task / 2);
                let request = bench.request(&key);
                let until = Instant::now() + Duration::from_secs(10);
                loop {
                    let started = Instant::now();
                    let charged = charge(&bench, &request, &key).await;
                    let done = answered(&charged);
                    calls.push((charged, started.elapsed()));
                    if done || Instant::now() >= until {
                        break;
                    }
                    tokio::time::sleep(RETRY_EVERY).await;
                }
            }
            calls
        }));
    }
    let mut calls = Vec::new();
    for client in clients {
        calls.extend(client.await.expect("a client"));
    }
    let conflicts = calls
        .iter()
        .filter(|(charged, _)| {
            matches!(charged, Err(RunError::Idem(Error::Store(e)))
                if e.kind() == StoreErrorKind::TransactionConflict)
        })
        .count();
    let slowest = calls
        .iter()
        .map(|(_, took)| *took)
        .max()
        .unwrap_or_default();
    eprintln!(
        "{} calls over {} keys: {:?}; {conflicts} serialization failures; slowest {slowest:?}",
        calls.len(),
        TASKS / 2 * KEYS_PER_TASK,
        tally(calls.iter().map(|(charged, _)| charged))
    );
    let charges = bench.charges_by_intent().await;
    let wrong: Vec<_> = (0..TASKS / 2)
        .flat_map(|pair| (0..KEYS_PER_TASK).map(move |n| format!("ser-{run}-{pair}-{n}")))
        .filter(|key| charges.get(key) != Some(&1))
        .collect();
    drop(bench);
    drop(bouncer);
    admin(&format!("DROP DATABASE {database} WITH (FORCE)")).await;

    assert_eq!(conflicts, 0, "no answer is a serialization failure");
    assert!(wrong.is_empty(), "keys not charged exactly once: {wrong:?}");
    assert!(
        slowest <= CALL_DEADLINE + RETRY_EVERY,
        "every call answered within the deadline, the slowest took {slowest:?}"
    );
}

/// The charge, in the transaction of the engine's transactional closure; the simple protocol,
/// which PgBouncer in transaction mode carries.
async fn charge(bench: &Bench, request: &idem_core::Request, key: &str) -> Charged {
    let insert = format!(
        "INSERT INTO {} (intent) VALUES ('{key}') RETURNING id",
        bench.charges
    );
    bench
        .idem
        .run_in_transaction(request, move |tx, _lease| {
            Box::pin(async move {
                sqlx::raw_sql(AssertSqlSafe(insert))
                    .execute(&mut *tx)
                    .await?;
                Ok::<_, sqlx::Error>(StoredResponse::new(201, "charged"))
            })
        })
        .await
}

/// Runs `statement` on the server itself, outside any transaction.
async fn admin(statement: &str) {
    let mut conn = PgConnection::connect(&pg_url()).await.expect("connect");
    sqlx::raw_sql(AssertSqlSafe(statement.to_owned()))
        .execute(&mut conn)
        .await
        .expect(statement);
}
