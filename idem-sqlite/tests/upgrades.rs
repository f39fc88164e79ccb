//! Upgrading tables that are not quite what a release left: the repeatable schema script run
//! on a version-1 or version-3 table by a shell that goes on after an error, a version-1 table
//! whose new column something else already added, a version-3 table with rows upgraded to
//! records in doubt (version 4), and a table rolled back from version 4.

use idem_core::store::Deadline;
use idem_core::store::StoreExt;
use idem_core::Request;
use idem_ops::{ListQuery, Operator};
use idem_sqlite::rusqlite::{params, Connection};
use idem_sqlite::{schema_sql, SqliteStore};
use std::path::Path;
use std::time::Duration;

/// A version-1 file as the version-1 release's store left it (WAL, version 1 recorded).
fn version_1_file(path: &Path) {
    let db = Connection::open(path).expect("open");
    let _: String = db
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .expect("WAL");
    db.execute_batch(include_str!("../sql/migrations_table.sql"))
        .expect("migrations table");
    db.execute_batch(include_str!("../sql/migrations/0001_create_records.sql"))
        .expect("v1");
    db.execute(
        "INSERT INTO idem_schema_migrations (table_name, version, applied_at) VALUES ('idem_records', 1, 0)",
        [],
    )
    .expect("record v1");
}

/// Runs a script the way the `sqlite3` shell runs `idem migrate --print | sqlite3 idem.db`
/// (without `-bail`): a statement that fails is reported and the next one runs.
fn run_like_the_sqlite3_shell(db: &Connection, sql: &str) -> Vec<String> {
    // The script's statements hold no `;` of their own: drop the comment lines, split.
    let code: String = sql
        .lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    code.split(';')
        .filter(|statement| !statement.trim().is_empty())
        .filter_map(|statement| db.execute_batch(statement).err().map(|e| e.to_string()))
        .collect()
}

/// The repeatable script applied to a version-1 table (an operator who pipes
/// `idem migrate --print` into `sqlite3` on an existing database): the index statement fails,
/// so the version rows do not claim version 2, and opening the store upgrades the table.
#[tokio::test]
async fn the_script_on_a_version_1_table_never_records_version_2_without_its_column() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("v1.db");
    version_1_file(&path);
    let errors = run_like_the_sqlite3_shell(
        &Connection::open(&path).expect("open"),
        &schema_sql("idem_records"),
    );
    assert!(
        !errors.is_empty(),
        "the index needs the column the table lacks"
    );
    let store = SqliteStore::builder(&path).open().await.expect("opens");
    let request = Request::builder("acct", "POST", "/charges")
        .key(Some("k1"))
        .body(b"1")
        .build()
        .expect("request");
    let reserved = store
        .reservation(&request, Duration::from_secs(60), Deadline::default())
        .await;
    assert!(
        reserved.is_ok(),
        "the store opened as up to date but cannot reserve: {reserved:?}"
    );
}

/// A version-1 table whose `reserved_at` column exists but not the in-progress index (the
/// column added by hand, or by a tool that ran version 2's ALTER alone): the upgrade skips only
/// the column, and builds the index.
#[tokio::test]
async fn a_column_already_there_is_skipped_and_the_rest_of_its_version_runs() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("half.db");
    version_1_file(&path);
    Connection::open(&path)
        .expect("open")
        .execute_batch(
            "ALTER TABLE idem_records ADD COLUMN reserved_at INTEGER NOT NULL DEFAULT 0;",
        )
        .expect("column by hand");
    let store = SqliteStore::builder(&path).open().await.expect("opens");
    store
        .list(&ListQuery::in_progress(Duration::ZERO), Deadline::default())
        .await
        .expect("list");
    drop(store);
    let db = Connection::open(&path).expect("open");
    let index: i64 = db
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = ?1",
            params!["idem_records_in_progress"],
            |r| r.get(0),
        )
        .expect("index");
    let version: i64 = db
        .query_row("SELECT max(version) FROM idem_schema_migrations", [], |r| {
            r.get(0)
        })
        .expect("version");
    assert_eq!(
        version,
        idem_sqlite::SCHEMA_VERSION,
        "upgraded to the current version"
    );
    assert_eq!(index, 1, "version 2 recorded without its index");
}

/// A version-3 file as the version-3 release's store left it (WAL, versions 1 to 3 recorded),
/// with an in-progress row (lease far away) and a completed one, each with its reservation
/// time, holder and (for the completed one) completion time.
fn version_3_file(path: &Path) {
    let db = Connection::open(path).expect("open");
    let _: String = db
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .expect("WAL");
    db.execute_batch(include_str!("../sql/migrations_table.sql"))
        .expect("migrations table");
    for step in [
        include_str!("../sql/migrations/0001_create_records.sql"),
        include_str!("../sql/migrations/0002_reservation_time.sql"),
        include_str!("../sql/migrations/0002_in_progress_index.sql"),
        include_str!("../sql/migrations/0003_completed_at.sql"),
        include_str!("../sql/migrations/0003_holder.sql"),
        include_str!("../sql/migrations/0003_key_index.sql"),
    ] {
        db.execute_batch(step).expect("a version 1..3 step");
    }
    for version in 1..=3 {
        db.execute(
            "INSERT INTO idem_schema_migrations (table_name, version, applied_at) VALUES ('idem_records', ?1, 0)",
            params![version],
        )
        .expect("record the version");
    }
    let far = 4_102_444_800_000_i64; // 2100-01-01
    let completed = idem_core::StoredResponse::new(201, "{\"id\":1}")
        .encode()
        .expect("encode");
    let holder = idem_ops::Holder::new("web-1", 7, 1, None).encode();
    for (key, state, response, completed_at) in [
        ("v3-running", 0, None, None),
        ("v3-done", 1, Some(completed), Some(1_700_000_000_500_i64)),
    ] {
        db.execute(
            "INSERT INTO idem_records (consumer, route, key, fingerprint, token, state, deadline, response, reserved_at, completed_at, holder) \
             VALUES ('acct', 'POST /charges', ?1, zeroblob(32), zeroblob(16), ?2, ?3, ?4, 1700000000000, ?5, ?6)",
            params![key, state, far, response, completed_at, holder],
        )
        .expect("v3 row");
    }
}

fn id(key: &str) -> idem_core::RecordId {
    idem_core::RecordId::new(
        idem_core::Scope::new("acct", "POST /charges").expect("scope"),
        idem_core::IdempotencyKey::new(key).expect("key"),
    )
}

/// Version 4 (records in doubt) on a version-3 table with rows: the columns are added empty
/// (no old record is in doubt), the in-doubt index and the audit table are created, every row
/// is kept as it was, and the upgraded table takes records in doubt and their decisions.
#[tokio::test]
async fn a_version_3_table_with_rows_is_upgraded_to_4_and_keeps_them() {
    use idem_core::store::RecordState;
    use idem_core::{Failure, Idempotency, StoredResponse};
    use idem_ops::reconcile::{Decided, Finding};
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("v3.db");
    version_3_file(&path);
    let store = SqliteStore::open(&path).await.expect("opens and upgrades");

    let stats = store.stats(Deadline::default()).await.expect("stats");
    assert_eq!(
        (stats.in_progress, stats.completed, stats.in_doubt),
        (1, 1, 0),
        "{stats:?}"
    );
    let done = store
        .inspect(&id("v3-done"), Deadline::default())
        .await
        .expect("inspect")
        .expect("the completed row is kept");
    assert!(matches!(
        &done.record.state,
        RecordState::Completed { response, .. } if response.status == 201 && response.body == b"{\"id\":1}"
    ));
    assert_eq!((done.doubt, done.check_at), (None, None));
    assert_eq!(
        done.provenance.completed_at,
        Some(idem_core::Timestamp::from_millis(1_700_000_000_500))
    );
    assert!(matches!(done.provenance.holder, idem_ops::Noted::Known(_)));
    let running = store
        .inspect(&id("v3-running"), Deadline::default())
        .await
        .expect("inspect")
        .expect("the in-progress row is kept");
    assert!(running.record.is_in_progress());
    assert!(store
        .list(&ListQuery::in_doubt(), Deadline::default())
        .await
        .expect("list")
        .records
        .is_empty());

    {
        let db = Connection::open(&path).expect("open");
        let versions: Vec<i64> = db
            .prepare("SELECT version FROM idem_schema_migrations WHERE table_name = 'idem_records' ORDER BY version")
            .expect("versions")
            .query_map([], |r| r.get(0))
            .expect("versions")
            .collect::<Result<_, _>>()
            .expect("versions");
        assert_eq!(versions, [1, 2, 3, 4]);
        let marked: i64 = db
            .query_row(
                "SELECT count(*) FROM idem_records WHERE doubt IS NOT NULL OR doubt_check_at IS NOT NULL",
                [],
                |r| r.get(0),
            )
            .expect("the columns were added");
        assert_eq!(marked, 0, "no old record is in doubt");
        let rows: i64 = db
            .query_row("SELECT count(*) FROM idem_records", [], |r| r.get(0))
            .expect("rows");
        assert_eq!(rows, 2);
        let objects: i64 = db
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name IN \
                 ('idem_records_in_doubt', 'idem_records_reconciliations', \
                  'idem_records_reconciliations_record', 'idem_records_reconciliations_kept')",
                [],
                |r| r.get(0),
            )
            .expect("objects");
        assert_eq!(objects, 4, "version 4's index, table and its indexes");
    }

    // The upgraded table takes a record in doubt, and a decision with its audit entry.
    let idem = Idempotency::new(store.clone());
    let charge = Request::builder("acct", "POST", "/charges")
        .key(Some("v4-doubt"))
        .body(b"{}")
        .build()
        .expect("request");
    let first = idem
        .run(&charge, |_ctx| async {
            Err::<StoredResponse, _>(Failure::unknown("timed out"))
        })
        .await;
    assert!(first.is_err());
    let case = idem_ops::reconcile::in_doubt(&idem, charge.id())
        .await
        .expect("read")
        .expect("in doubt");
    let settled = idem_ops::reconcile::resolve(
        &idem,
        &case,
        Finding::settled(StoredResponse::new(201, "real")),
        "op",
    )
    .await
    .expect("resolve");
    assert!(
        matches!(settled, Some(Decided::Settled { .. })),
        "{settled:?}"
    );
    assert_eq!(
        store
            .reconciliations(charge.id(), Deadline::default())
            .await
            .expect("trail")
            .len(),
        1
    );
    assert_eq!(
        store
            .stats(Deadline::default())
            .await
            .expect("stats")
            .completed,
        2
    );
}

/// The repeatable script on a version-3 table (piped into `sqlite3` on an existing database):
/// the in-doubt index needs a column the table lacks, so the version rows do not claim version
/// 4, and opening the store upgrades the table.
#[tokio::test]
async fn the_script_on_a_version_3_table_never_records_version_4_without_its_columns() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("v3-script.db");
    version_3_file(&path);
    let db = Connection::open(&path).expect("open");
    let errors = run_like_the_sqlite3_shell(&db, &schema_sql("idem_records"));
    assert!(!errors.is_empty(), "the in-doubt index needs its column");
    let recorded: i64 = db
        .query_row("SELECT max(version) FROM idem_schema_migrations", [], |r| {
            r.get(0)
        })
        .expect("version");
    assert_eq!(recorded, 3, "version 4 recorded without its columns");
    drop(db);
    let store = SqliteStore::builder(&path).open().await.expect("opens");
    assert_eq!(
        store
            .stats(Deadline::default())
            .await
            .expect("stats")
            .total(),
        2
    );
    assert!(store
        .list(&ListQuery::in_doubt(), Deadline::default())
        .await
        .expect("the in-doubt listing reads the new columns")
        .records
        .is_empty());
}

/// Rolling back to a release of schema version 3 means deleting the version-4 row (the columns,
/// the index and the audit table stay); the next upgrade records version 4 again instead of
/// failing on the columns, and a record in doubt and its trail are kept through it.
#[tokio::test]
async fn a_table_rolled_back_to_version_3_upgrades_again_and_keeps_its_records_in_doubt() {
    use idem_core::{Failure, Idempotency, StoredResponse};
    use idem_ops::reconcile::Finding;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("rolled-back-4.db");
    let store = SqliteStore::open(&path).await.expect("create");
    let idem = Idempotency::new(store.clone());
    let charge = Request::builder("acct", "POST", "/charges")
        .key(Some("doubt"))
        .body(b"{}")
        .build()
        .expect("request");
    let first = idem
        .run(&charge, |_ctx| async {
            Err::<StoredResponse, _>(Failure::unknown("timed out"))
        })
        .await;
    assert!(first.is_err());
    let case = idem_ops::reconcile::in_doubt(&idem, charge.id())
        .await
        .expect("read")
        .expect("in doubt");
    idem_ops::reconcile::resolve(&idem, &case, Finding::still_unknown(), "op")
        .await
        .expect("defer");
    drop((idem, store));
    Connection::open(&path)
        .expect("open")
        .execute(
            "DELETE FROM idem_schema_migrations WHERE table_name = 'idem_records' AND version = 4",
            [],
        )
        .expect("roll back");

    let store = SqliteStore::open(&path).await.expect("upgrades again");
    let idem = Idempotency::new(store.clone());
    let kept = idem_ops::reconcile::in_doubt(&idem, charge.id())
        .await
        .expect("read")
        .expect("still in doubt");
    assert_eq!(kept.doubt.attempts, 1);
    assert_eq!(
        store
            .reconciliations(charge.id(), Deadline::default())
            .await
            .expect("trail")
            .len(),
        1
    );
    let version: i64 = Connection::open(&path)
        .expect("open")
        .query_row("SELECT max(version) FROM idem_schema_migrations", [], |r| {
            r.get(0)
        })
        .expect("version");
    assert_eq!(version, idem_sqlite::SCHEMA_VERSION);
}
