//! Upgrading tables that are not quite what a release left: the repeatable schema script run
//! on a version-1 table by a shell that goes on after an error, and a version-1 table whose new
//! column something else already added.

use idem_core::store::{ListQuery, Operator, Store};
use idem_core::Request;
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
    let reserved = store.reserve(&request, Duration::from_secs(60)).await;
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
        .list(&ListQuery::in_progress(Duration::ZERO))
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
