//! The inbox's audit trail on SQLite: every clause of the `Audit` contract
//! (idem_inbox::Audit), each a scenario run on `SqliteAudit`, which must read the same as the
//! reference `MemoryAudit` (tests/memory_audit.rs runs the scenarios on it). Every SQLite trail
//! is a new store table of the shared test file, so tests never see each other's entries (a
//! purge included).
#![cfg(feature = "sqlite")]

use idem_core::{Error, FencingToken, StoreErrorKind};
use idem_inbox::testing::*;
use idem_inbox::{Audit, MemoryAudit, SqliteAudit};
use idem_sqlite::SqliteStore;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// The database file of this process: `IDEM_SQLITE_DB` if set, else a file in a temporary
/// directory that lives as long as the process.
fn db_path() -> PathBuf {
    if let Some(path) = std::env::var_os("IDEM_SQLITE_DB") {
        return PathBuf::from(path);
    }
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("temp dir"))
        .path()
        .join("idem-test.db")
}

/// A store on a new table of the shared file.
async fn store_on(table: &str) -> SqliteStore {
    SqliteStore::builder(db_path())
        .table(table)
        .readers(1)
        .open()
        .await
        .expect("open store")
}

/// A new trail: a new store table, and its audit table.
async fn sqlite() -> SqliteAudit {
    let store = store_on(&format!("audit_{}", FencingToken::generate())).await;
    SqliteAudit::open(&store).await.expect("open audit")
}

// On SQLite.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_first_delivery_creates_the_entry_and_later_ones_count() {
    first_delivery_creates_the_entry_and_later_ones_count(&sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_settled_processed_is_final_and_failed_does_not_overwrite_it() {
    settled_processed_is_final_and_failed_does_not_overwrite_it(&sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_conflicts_are_counted_without_changing_the_outcome() {
    conflicts_are_counted_without_changing_the_outcome(&sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_query_lists_a_source_in_its_time_range_oldest_first_up_to_the_limit() {
    query_lists_a_source_in_its_time_range_oldest_first_up_to_the_limit(&sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_purge_deletes_a_bounded_batch_first_received_before_the_time() {
    purge_deletes_a_bounded_batch_first_received_before_the_time(&sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_event_ids_of_any_bytes_round_trip_exactly() {
    event_ids_of_any_bytes_round_trip_exactly(&sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_two_sources_with_the_same_event_id_are_separate() {
    two_sources_with_the_same_event_id_are_separate(&sqlite().await).await;
}

/// Four stores on one file (a writer each), one table: the deliveries race on four
/// connections, and SQLite's locking with the primary key counts each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_sixteen_concurrent_deliveries_count_exactly_sixteen() {
    let table = format!("audit_{}", FencingToken::generate());
    let mut audits: Vec<Arc<dyn Audit>> = Vec::new();
    for _ in 0..4 {
        let store = store_on(&table).await;
        audits.push(Arc::new(
            SqliteAudit::open(&store).await.expect("open audit"),
        ));
    }
    sixteen_concurrent_deliveries_count_exactly_sixteen(audits).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_reads_the_same_as_the_reference() {
    let memory = mixed_history(&MemoryAudit::default()).await;
    let sqlite = mixed_history(&sqlite().await).await;
    assert_eq!(sqlite, memory);
    assert_eq!(memory[0].len(), 4);
}

/// Each store table has its own trail: `<table>_inbox_audit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_two_stores_on_one_file_keep_two_trails() {
    let token = FencingToken::generate();
    let (one, two) = (format!("one_{token}"), format!("two_{token}"));
    let first = SqliteAudit::open(&store_on(&one).await)
        .await
        .expect("open");
    let second = SqliteAudit::open(&store_on(&two).await)
        .await
        .expect("open");
    assert_eq!(first.table(), format!("{one}_inbox_audit"));
    first
        .delivered("stripe", b"evt", at(10))
        .await
        .expect("delivered");
    assert_eq!(entries(&first, "stripe").await.len(), 1);
    assert!(entries(&second, "stripe").await.is_empty());
    assert_eq!(second.purge(at(END), 10).await.expect("purge"), 0);
    assert_eq!(entries(&first, "stripe").await.len(), 1);
    // Opening again keeps what is there.
    let again = SqliteAudit::open(&store_on(&one).await)
        .await
        .expect("open");
    assert_eq!(entry(&again, "stripe").await.deliveries, 1);
}

/// A stored value the audit does not write (an unknown outcome, a negative time or count, text
/// for bytes) is `CorruptRecord`, never a panic nor a wrong entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_an_unreadable_row_is_corrupt_record_never_a_panic() {
    let store = store_on(&format!("audit_{}", FencingToken::generate())).await;
    let audit = SqliteAudit::open(&store).await.expect("open audit");
    let corruptions = [
        "outcome = 7",
        "outcome = -1",
        "outcome = 'processed'",
        "last_received = -1",
        "processed = 'soon'",
        "deliveries = -3",
        "event_id = 'text'",
    ];
    for set in corruptions {
        let table = audit.table().to_owned();
        store
            .try_call(move |db| db.execute_batch(&format!("DELETE FROM {table}")))
            .await
            .expect("empty");
        audit
            .delivered("stripe", b"evt", at(10))
            .await
            .expect("delivered");
        let table = audit.table().to_owned();
        store
            .try_call(move |db| db.execute_batch(&format!("UPDATE {table} SET {set}")))
            .await
            .expect("corrupt");
        let read = audit.query("stripe", at(0), at(END), 10).await;
        assert!(
            matches!(read, Err(Error::CorruptRecord(_))),
            "{set}: {read:?}"
        );
    }
}

#[tokio::test]
async fn sqlite_a_table_name_too_long_for_its_trail_is_invalid_input() {
    let store = store_on(&format!("a{}", "b".repeat(55))).await;
    let refused = SqliteAudit::open(&store).await;
    assert!(
        matches!(refused, Err(Error::InvalidInput { .. })),
        "{refused:?}"
    );
}

/// A store error keeps its nature: the table dropped under the trail is misconfigured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_missing_table_is_a_misconfigured_store_error() {
    let store = store_on(&format!("audit_{}", FencingToken::generate())).await;
    let audit = SqliteAudit::open(&store).await.expect("open audit");
    let table = audit.table().to_owned();
    store
        .try_call(move |db| db.execute_batch(&format!("DROP TABLE {table}")))
        .await
        .expect("drop");
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
