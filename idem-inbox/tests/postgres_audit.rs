//! The inbox's audit trail on PostgreSQL: every clause of the `Audit` contract
//! (idem_inbox::Audit), each a scenario run on `PgAudit` (the same scenarios as
//! tests/sqlite_audit.rs, and tests/memory_audit.rs on the reference `MemoryAudit`), and a
//! mixed history that must read the same as on the reference. Every trail is a new store table
//! of the test schema; the server is `IDEM_PG_URL` (a missing server is a failure, never a
//! skip), and PgBouncer `IDEM_PGBOUNCER_URL` for the simple protocol.
#![cfg(feature = "postgres")]

use idem_core::{Error, FencingToken, StoreErrorKind};
use idem_inbox::testing::*;
use idem_inbox::{Audit, MemoryAudit, PgAudit};
use idem_postgres::sqlx::{self, AssertSqlSafe};
use idem_postgres::{Isolation, PgStore, StatementMode};
use std::sync::Arc;

/// The schema every test table lives in (the store's own tests use it too).
const SCHEMA: &str = "idem_test";

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run `bash scripts/test`, which starts PostgreSQL and PgBouncer, or set it to a server of your own")
    })
}

/// The PostgreSQL server.
fn pg_url() -> String {
    env("IDEM_PG_URL")
}

/// The PgBouncer (transaction mode) in front of it.
fn bouncer_url() -> String {
    env("IDEM_PGBOUNCER_URL")
}

/// A store on a new table of [`SCHEMA`], migrated, with a small pool.
async fn store_on(url: &str, mode: StatementMode) -> PgStore {
    let table = format!("t_{}", FencingToken::generate());
    let mut builder = PgStore::builder()
        .schema(SCHEMA)
        .table(&table)
        .statements(mode)
        .isolation(Isolation::ReadCommitted)
        .max_connections(8);
    if mode == StatementMode::Simple {
        // Behind PgBouncer in transaction mode: the change feed's LISTEN needs the server.
        builder = builder.listener_url(&pg_url());
    }
    let store = builder.connect(url).await.expect("connect");
    store.migrate().await.expect("migrate");
    store
}

/// A store on a new table of the test schema, through the server (prepared statements).
async fn store() -> PgStore {
    store_on(&pg_url(), StatementMode::Prepared).await
}

/// A new trail: a new store table, and its audit table.
async fn pg() -> PgAudit {
    PgAudit::open(&store().await).await.expect("open audit")
}

/// A new trail through PgBouncer in transaction mode: the simple protocol, values as literals.
async fn bouncer() -> PgAudit {
    let store = store_on(&bouncer_url(), StatementMode::Simple).await;
    PgAudit::open(&store).await.expect("open audit")
}

/// Runs `sql` on the store's pool.
async fn run(store: &PgStore, sql: String) {
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(store.pool())
        .await
        .expect("statement");
}

// On PostgreSQL.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_first_delivery_creates_the_entry_and_later_ones_count() {
    first_delivery_creates_the_entry_and_later_ones_count(&pg().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_settled_processed_is_final_and_failed_does_not_overwrite_it() {
    settled_processed_is_final_and_failed_does_not_overwrite_it(&pg().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_conflicts_are_counted_without_changing_the_outcome() {
    conflicts_are_counted_without_changing_the_outcome(&pg().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_query_lists_a_source_in_its_time_range_oldest_first_up_to_the_limit() {
    query_lists_a_source_in_its_time_range_oldest_first_up_to_the_limit(&pg().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_purge_deletes_a_bounded_batch_first_received_before_the_time() {
    purge_deletes_a_bounded_batch_first_received_before_the_time(&pg().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_event_ids_of_any_bytes_round_trip_exactly() {
    event_ids_of_any_bytes_round_trip_exactly(&pg().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_two_sources_with_the_same_event_id_are_separate() {
    two_sources_with_the_same_event_id_are_separate(&pg().await).await;
}

/// 16 tasks on one trail, on the pool's connections at once: the primary key decides the race
/// of first deliveries, and every delivery counts once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_sixteen_concurrent_deliveries_count_exactly_sixteen() {
    let audit: Arc<dyn Audit> = Arc::new(pg().await);
    sixteen_concurrent_deliveries_count_exactly_sixteen(vec![audit]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_reads_the_same_as_the_reference() {
    let memory = mixed_history(&MemoryAudit::default()).await;
    let pg = mixed_history(&pg().await).await;
    assert_eq!(pg, memory);
    assert_eq!(memory[0].len(), 4);
}

/// Behind PgBouncer (the simple protocol, every value written as a literal): odd ids, counts
/// and outcomes read back the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_simple_protocol_event_ids_of_any_bytes_round_trip_exactly() {
    event_ids_of_any_bytes_round_trip_exactly(&bouncer().await).await;
    settled_processed_is_final_and_failed_does_not_overwrite_it(&bouncer().await).await;
    let memory = mixed_history(&MemoryAudit::default()).await;
    assert_eq!(mixed_history(&bouncer().await).await, memory);
}

/// Several processes open the trail at once: the table is created once, no catalog collision.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_concurrent_opens_create_the_table_once() {
    let store = store().await;
    let opens: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { PgAudit::open(&store).await })
        })
        .collect();
    let mut audits = Vec::new();
    for open in opens {
        audits.push(open.await.expect("task").expect("open audit"));
    }
    audits[0]
        .delivered("stripe", b"evt", at(10))
        .await
        .expect("delivered");
    assert_eq!(entry(&audits[7], "stripe").await.deliveries, 1);
    let records = store.table(); // "idem_test"."t_…"
    let expected = format!(
        "{}_inbox_audit\"",
        records.strip_suffix('"').expect("quoted")
    );
    assert_eq!(audits[0].table(), expected);
}

/// Each store table has its own trail: `<table>_inbox_audit` in the store's schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_two_stores_keep_two_trails() {
    let (first_store, second_store) = (store().await, store().await);
    let first = PgAudit::open(&first_store).await.expect("open");
    let second = PgAudit::open(&second_store).await.expect("open");
    first
        .delivered("stripe", b"evt", at(10))
        .await
        .expect("delivered");
    assert_eq!(entries(&first, "stripe").await.len(), 1);
    assert!(entries(&second, "stripe").await.is_empty());
    assert_eq!(second.purge(at(END), 10).await.expect("purge"), 0);
    assert_eq!(entries(&first, "stripe").await.len(), 1);
    // Opening again keeps what is there.
    let again = PgAudit::open(&first_store).await.expect("open");
    assert_eq!(entry(&again, "stripe").await.deliveries, 1);
}

/// A stored value the audit does not write (an unknown outcome, a negative time or count) is
/// `CorruptRecord`, never a panic nor a wrong entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_an_unreadable_row_is_corrupt_record_never_a_panic() {
    let store = store().await;
    let audit = PgAudit::open(&store).await.expect("open audit");
    let corruptions = [
        "outcome = 7",
        "outcome = -1",
        "last_received = -1",
        "processed = -5",
        "deliveries = -3",
        "conflicts = -1",
    ];
    for set in corruptions {
        run(&store, format!("DELETE FROM {}", audit.table())).await;
        audit
            .delivered("stripe", b"evt", at(10))
            .await
            .expect("delivered");
        run(&store, format!("UPDATE {} SET {set}", audit.table())).await;
        let read = audit.query("stripe", at(0), at(END), 10).await;
        assert!(
            matches!(read, Err(Error::CorruptRecord(_))),
            "{set}: {read:?}"
        );
    }
}

#[tokio::test]
async fn pg_a_table_name_too_long_for_its_trail_is_invalid_input() {
    let store = PgStore::builder()
        .schema(SCHEMA)
        .table(&format!("t{}", "x".repeat(42)))
        .max_connections(1)
        .connect(&pg_url())
        .await
        .expect("connect");
    let refused = PgAudit::open(&store).await;
    assert!(
        matches!(refused, Err(Error::InvalidInput { .. })),
        "{refused:?}"
    );
}

/// A store error keeps its nature: the table dropped under the trail is misconfigured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_a_missing_table_is_a_misconfigured_store_error() {
    let store = store().await;
    let audit = PgAudit::open(&store).await.expect("open audit");
    run(&store, format!("DROP TABLE {}", audit.table())).await;
    for error in [
        audit
            .delivered("s", b"e", at(1))
            .await
            .expect_err("no table"),
        audit
            .query("s", at(0), at(END), 1)
            .await
            .expect_err("no table"),
    ] {
        assert_eq!(
            error.as_store().map(|e| e.kind()),
            Some(StoreErrorKind::Misconfigured)
        );
    }
}
