//! What the SQLite tests share: one database file per test binary, in a temporary directory.
#![allow(dead_code)]

use idem_sqlite::SqliteStore;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The test binary's database file. The directory lives as long as the process (it is under
/// `TMPDIR`, which `scripts/test` points at a directory it removes afterwards).
pub fn db_path() -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("temp dir"))
        .path()
        .join("idem-test.db")
}

/// A new store (four connections of its own) on the shared file.
pub async fn store() -> SqliteStore {
    SqliteStore::open(db_path()).await.expect("open store")
}

/// Creates the business table of the tests, once per file.
pub async fn with_charges(store: &SqliteStore) {
    store
        .call(|db| {
            db.execute_batch(
                "CREATE TABLE IF NOT EXISTS charges (
                    id INTEGER PRIMARY KEY,
                    intent TEXT NOT NULL,
                    cents INTEGER NOT NULL
                )",
            )
        })
        .await
        .expect("call")
        .expect("create charges");
}

/// How many charges were written for `intent`.
pub async fn charges(store: &SqliteStore, intent: &str) -> i64 {
    let intent = intent.to_owned();
    store
        .call(move |db| {
            db.query_row(
                "SELECT COUNT(*) FROM charges WHERE intent = ?1",
                [intent],
                |r| r.get(0),
            )
        })
        .await
        .expect("call")
        .expect("count")
}
