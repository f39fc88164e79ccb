//! One commit (C15) on a primary that stops taking writes (C13, C4): the old primary is made
//! read-only (`default_transaction_read_only = on`, what the store itself takes for a server
//! that refuses writes, src/hosts.rs `read_only`, and what `failover.rs` uses for a demoted
//! primary) and the standby is promoted. With two commits the store's own reservation meets
//! 25006 and the store moves to the new primary. With one commit every statement of the
//! execution runs in the effect's transaction: begun `READ WRITE`, which overrides the
//! server's read-only default, it once committed every execution on the server told to take
//! no writes, and the store never left it; its reservation, its first write, now meets 25006
//! there as the two-commit one does.

mod common;
mod support;

use idem_core::{FencingToken, Idempotency, Outcome, Policy};
use idem_postgres::sqlx::{self, AssertSqlSafe, Connection, PgConnection};
use idem_postgres::PgStore;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::bench::charge_reporting_port as charge;
use support::pg_pair::PgPair;

const STORE_TIMEOUT: Duration = Duration::from_secs(2);
const CONNECTIONS: u32 = 4;

/// C15, C13: a one-commit engine leaves a primary that stops taking writes, as a two-commit
/// one does, and never commits an execution there once it refuses writes. The standby streams
/// asynchronously: the old primary's commits return at once (with a synchronous one they wait
/// for a standby that was promoted, and the first call is in doubt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c15_one_commit_never_writes_to_an_asynchronous_primary_that_stopped_taking_writes() {
    read_only_primary(PgPair::start_async().await, true).await;
}

/// C13: the same with two commits (the store's own reservation meets the refusal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_two_commits_never_write_to_an_asynchronous_primary_that_stopped_taking_writes() {
    read_only_primary(PgPair::start_async().await, false).await;
}

async fn read_only_primary(pair: PgPair, one_commit: bool) {
    let url = PgPair::hosts_url(pair.primary_port, pair.standby_port);
    let store = PgStore::builder()
        .table(&format!("ro_{}", FencingToken::generate()))
        .max_connections(CONNECTIONS)
        .acquire_timeout(STORE_TIMEOUT)
        .statement_timeout(Duration::from_millis(1500))
        .lock_timeout(Duration::from_millis(1000))
        .connect(&url)
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
        .lease(Duration::from_secs(5))
        .one_commit(one_commit);
    let idem = Arc::new(Idempotency::with_policy(store, policy).expect("policy"));
    // The store's connections for transactions open on the primary.
    let mut before = Vec::new();
    for n in 0..CONNECTIONS {
        let (idem, charges) = (Arc::clone(&idem), charges.clone());
        before.push(tokio::spawn(async move {
            charge(&idem, &charges, &format!("before-{n}")).await
        }));
    }
    for charged in before {
        let charged = charged.await.expect("a charge");
        assert!(
            matches!(charged, Ok(Outcome::Executed(_))),
            "charged on the primary: {charged:?}"
        );
    }

    // The primary stops taking writes; the standby is promoted.
    let mut conn = PgConnection::connect(&PgPair::url(pair.primary_port))
        .await
        .expect("connect to the primary");
    for statement in [
        "ALTER SYSTEM SET default_transaction_read_only = on",
        "SELECT pg_reload_conf()",
    ] {
        sqlx::raw_sql(statement)
            .execute(&mut conn)
            .await
            .expect(statement);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (read_only,): (String,) = sqlx::query_as("SHOW default_transaction_read_only")
        .fetch_one(&mut conn)
        .await
        .expect("the setting");
    assert_eq!(read_only, "on", "the primary refuses writes by default now");
    pair.promote_standby().await;
    let promoted = Instant::now();

    // Calls after the promotion: none may commit on the read-only server.
    let mut on_the_old = Vec::new();
    let mut on_the_new = 0;
    let mut n = 0;
    while promoted.elapsed() < 3 * STORE_TIMEOUT {
        n += 1;
        let charged = charge(&idem, &charges, &format!("after-{n}")).await;
        if !matches!(charged, Ok(Outcome::Executed(_))) {
            eprintln!("after-{n}: {charged:?}");
        }
        if let Ok(Outcome::Executed(response)) = &charged {
            let body = String::from_utf8_lossy(&response.body).into_owned();
            if body.ends_with(&format!(" {}", pair.primary_port)) {
                on_the_old.push(format!("after-{n}: {body}"));
            } else {
                on_the_new += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // What the read-only server holds that the new primary does not.
    let (held,): (i64,) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT count(*) FROM {charges} WHERE intent LIKE 'after-%'"
    )))
    .fetch_one(&mut conn)
    .await
    .expect("charges on the old primary");
    conn.close().await.expect("close");
    eprintln!(
        "{:?} after the promotion: {} executions on the read-only old primary, {on_the_new} on \
         the new one; the old holds {held} charges made after it stopped taking writes",
        promoted.elapsed(),
        on_the_old.len()
    );
    assert!(
        on_the_old.is_empty() && held == 0,
        "executions committed on the server that stopped taking writes ({held} charges there), \
         which the new primary lacks: {on_the_old:?}"
    );
}
