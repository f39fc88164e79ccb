//! `Transactional::settled`, the read of a record once no one-commit execution holds it, is a
//! transaction of several statements on the store's own connections (`BEGIN` with the gate's
//! shared lock, the row `FOR SHARE`, `COMMIT`). Cut off mid-way, or failing inside its
//! `BEGIN`, it must never leave its connection in a transaction for the store's next calls.

mod common;

use common::{pg_url, request, SCHEMA};
use idem_core::store::Transactional;
use idem_core::{Begin, FencingToken, Idempotency, Policy, StoredResponse};
use idem_postgres::sqlx::{self, AssertSqlSafe, Connection, PgConnection, Row};
use idem_postgres::PgStore;
use std::time::Duration;

/// A store of one connection on a table of its own, and its name.
async fn one_connection() -> (PgStore, String) {
    let table = format!("sc_{}", FencingToken::generate());
    let store = PgStore::builder()
        .schema(SCHEMA)
        .table(&table)
        .max_connections(1)
        .connect(&pg_url())
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    (store, table)
}

/// Another session that holds the store's table until `COMMIT`: `settled` waits there.
async fn holding(table: &str) -> PgConnection {
    let mut locker = PgConnection::connect(&pg_url()).await.expect("a session");
    sqlx::raw_sql(AssertSqlSafe(format!(
        "BEGIN; LOCK TABLE {SCHEMA}.\"{table}\" IN ACCESS EXCLUSIVE MODE"
    )))
    .execute(&mut locker)
    .await
    .expect("lock");
    locker
}

/// Ends the other session's transaction, and its locks with it.
async fn release(locker: &mut PgConnection) {
    sqlx::raw_sql("COMMIT")
        .execute(locker)
        .await
        .expect("unlock");
}

async fn records(session: &mut PgConnection, table: &str, key: &str) -> i64 {
    sqlx::raw_sql(AssertSqlSafe(format!(
        "SELECT count(*) FROM {SCHEMA}.\"{table}\" WHERE key = '{key}'"
    )))
    .fetch_one(session)
    .await
    .expect("count")
    .get(0)
}

/// C6, C8: `settled` cut off inside its transaction; the store's next reservation and
/// completion, answered, are committed (they ran in the open transaction, never committed,
/// and a retry would have run the effect again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c06_a_settled_read_cut_off_mid_transaction_leaves_no_transaction_open() {
    let (store, table) = one_connection().await;
    let idem = Idempotency::with_policy(store.clone(), Policy::default()).expect("policy");
    let key = format!("k-{}", FencingToken::generate());
    let req = request(&idem, &key);
    let mut locker = holding(&table).await;
    let cut = tokio::time::timeout(
        Duration::from_millis(150),
        store.settled(req.id(), Duration::from_secs(3)),
    )
    .await;
    assert!(cut.is_err(), "settled answered through the lock: {cut:?}");
    release(&mut locker).await;

    let Begin::Acquired(lease) = idem.begin(&req).await.expect("begin") else {
        panic!("a fresh key not acquired")
    };
    idem.complete(lease, StoredResponse::new(201, "charged"))
        .await
        .expect("complete");
    assert_eq!(
        records(&mut locker, &table, &key).await,
        1,
        "completed, seen"
    );
    drop((idem, store));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(records(&mut locker, &table, &key).await, 1, "and kept");
}

/// C13: the gate's lock timing out inside `settled`'s `BEGIN` (a one-commit transaction holds
/// the record) is that call's error, never the store's next calls' (`current transaction is
/// aborted` on a connection given back in an aborted transaction).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_gate_timeout_in_a_settled_read_leaves_the_store_serving() {
    let (store, table) = one_connection().await;
    let idem = Idempotency::with_policy(store.clone(), Policy::default()).expect("policy");
    let key = format!("k-{}", FencingToken::generate());
    let req = request(&idem, &key);
    // The gate's key, seen in pg_locks while `settled` waits for the table after taking it.
    let mut locker = holding(&table).await;
    let waiting = {
        let (store, id) = (store.clone(), req.id().clone());
        tokio::spawn(async move { store.settled(&id, Duration::from_secs(2)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let gate: i64 = sqlx::raw_sql(
        "SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks \
         WHERE locktype = 'advisory' AND mode = 'ShareLock' AND pid <> pg_backend_pid() LIMIT 1",
    )
    .fetch_one(&mut locker)
    .await
    .expect("the gate's lock")
    .get(0);
    release(&mut locker).await;
    waiting.await.expect("the read").expect("read once free");
    // Held exclusively, as a one-commit execution holds it.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "BEGIN; SELECT pg_advisory_xact_lock({gate})"
    )))
    .execute(&mut locker)
    .await
    .expect("the gate");
    let timed_out = store.settled(req.id(), Duration::from_millis(200)).await;
    assert!(timed_out.is_err(), "read through the gate: {timed_out:?}");
    release(&mut locker).await;
    for _ in 0..2 {
        let next = idem.begin(&req).await;
        assert!(next.is_ok(), "the store's next call: {next:?}");
    }
}
