//! What the SQLite tests share: one database file per test process (or the file named by
//! `IDEM_SQLITE_DB`, so that several processes share one), and the conformance harness.
#![allow(dead_code)]

use idem_core::store::Completion;
use idem_core::testing::{Harness, Script, TransactHarness, TransactionalHarness};
use idem_core::{Error, FencingToken, RecordId};
use idem_sqlite::rusqlite::TransactionBehavior;
use idem_sqlite::SqliteEffect;
use idem_sqlite::SqliteStore;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The database file of this process: `IDEM_SQLITE_DB` if set, else a file in a temporary
/// directory that lives as long as the process (under `TMPDIR`, which `scripts/test` points at
/// a directory it removes afterwards).
pub(crate) fn db_path() -> PathBuf {
    if let Some(path) = std::env::var_os("IDEM_SQLITE_DB") {
        return PathBuf::from(path);
    }
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("temp dir"))
        .path()
        .join("idem-test.db")
}

/// A new store on the shared file, on the default table.
pub(crate) async fn store() -> SqliteStore {
    SqliteStore::open(db_path()).await.expect("open store")
}

/// The conformance harness: every store is a new table of the shared file, so scenarios, test
/// binaries and processes never see each other's records (a purge included).
pub(crate) struct Sqlite;

#[idem_core::store::async_trait]
impl Harness for Sqlite {
    type Store = SqliteStore;

    async fn store(&self) -> SqliteStore {
        let table = format!("conf_{}", FencingToken::generate());
        let store = SqliteStore::builder(db_path())
            .table(&table)
            .readers(2)
            .open()
            .await
            .expect("open store");
        store
            .try_call(|db| {
                db.execute_batch("CREATE TABLE IF NOT EXISTS conf_charges (intent TEXT NOT NULL)")
            })
            .await
            .expect("business table");
        store
    }

    async fn corrupt_response(&self, store: &SqliteStore, id: &RecordId) {
        let (id, table) = (id.clone(), store.table().to_owned());
        let changed = store
            .try_call(move |db| {
                db.execute(
                    &format!("UPDATE {table} SET response = X'00FF00' WHERE consumer = ?1 AND route = ?2 AND key = ?3"),
                    [id.consumer(), id.route(), id.key()],
                )
            })
            .await
            .expect("update");
        assert_eq!(changed, 1);
    }

    async fn corrupt_in_progress(&self, store: &SqliteStore, id: &RecordId) -> bool {
        let (id, table) = (id.clone(), store.table().to_owned());
        let changed = store
            .try_call(move |db| {
                db.execute(
                    &format!("UPDATE {table} SET response = X'00FF00' WHERE consumer = ?1 AND route = ?2 AND key = ?3 AND state = 0"),
                    [id.consumer(), id.route(), id.key()],
                )
            })
            .await
            .expect("update");
        assert_eq!(changed, 1, "an in-progress record");
        true
    }
}

#[idem_core::store::async_trait]
impl TransactionalHarness for Sqlite {
    async fn effect_then_complete(
        &self,
        store: &SqliteStore,
        intent: &str,
        completion: Completion,
        commit: bool,
    ) -> Result<(), Error> {
        let (writer, intent) = (store.clone(), intent.to_owned());
        store
            .call(move |db| {
                let fail = |e| Error::store("sqlite", idem_core::StoreErrorKind::Other, e);
                let tx = db
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(fail)?;
                tx.execute("INSERT INTO conf_charges (intent) VALUES (?1)", [&intent])
                    .map_err(fail)?;
                writer.complete_in(&tx, &completion)?;
                if commit {
                    tx.commit().map_err(fail)?;
                }
                Ok(())
            })
            .await?
    }

    async fn business_rows(&self, store: &SqliteStore, intent: &str) -> usize {
        let intent = intent.to_owned();
        let rows: i64 = store
            .try_call(move |db| {
                db.query_row(
                    "SELECT COUNT(*) FROM conf_charges WHERE intent = ?1",
                    [intent],
                    |r| r.get(0),
                )
            })
            .await
            .expect("count");
        usize::try_from(rows).expect("a count")
    }
}

/// The conformance harness on stores opened for one commit (each the only store reserving in
/// its new table): everything else must behave exactly as on any store, the engine's
/// in-process claims included.
pub(crate) struct SqliteOneCommit;

#[idem_core::store::async_trait]
impl Harness for SqliteOneCommit {
    type Store = SqliteStore;

    async fn store(&self) -> SqliteStore {
        Sqlite.store_for(true).await
    }

    async fn corrupt_response(&self, store: &SqliteStore, id: &RecordId) {
        Sqlite.corrupt_response(store, id).await
    }

    async fn corrupt_in_progress(&self, store: &SqliteStore, id: &RecordId) -> bool {
        Sqlite.corrupt_in_progress(store, id).await
    }
}

#[idem_core::store::async_trait]
impl TransactHarness for Sqlite {
    /// For one commit, a store that holds its (new) table alone.
    async fn store_for(&self, one_commit: bool) -> SqliteStore {
        let table = format!("conf_{}", FencingToken::generate());
        let store = SqliteStore::builder(db_path())
            .table(&table)
            .readers(2)
            .one_commit(one_commit)
            .open()
            .await
            .expect("open store");
        store
            .try_call(|db| {
                db.execute_batch("CREATE TABLE IF NOT EXISTS conf_charges (intent TEXT NOT NULL)")
            })
            .await
            .expect("business table");
        store
    }

    fn effect(&self, intent: &str, script: Script) -> SqliteEffect<String> {
        let intent = intent.to_owned();
        Box::new(move |tx, _lease| {
            tx.execute("INSERT INTO conf_charges (intent) VALUES (?1)", [&intent])
                .map_err(|e| e.to_string())?;
            script.started();
            script.wait_blocking();
            script.end()
        })
    }

    /// A store opened for one commit is the only one reserving in its table.
    fn shared_by_processes(&self, one_commit: bool) -> bool {
        !one_commit
    }
}

/// Creates the business table of the tests, once per file.
pub(crate) async fn with_charges(store: &SqliteStore) {
    store
        .try_call(|db| {
            db.execute_batch(
                "CREATE TABLE IF NOT EXISTS charges (
                    id INTEGER PRIMARY KEY,
                    intent TEXT NOT NULL,
                    cents INTEGER NOT NULL
                )",
            )
        })
        .await
        .expect("create charges");
}

/// How many charges were written for `intent`.
pub(crate) async fn charges(store: &SqliteStore, intent: &str) -> i64 {
    let intent = intent.to_owned();
    store
        .try_call(move |db| {
            db.query_row(
                "SELECT COUNT(*) FROM charges WHERE intent = ?1",
                [intent],
                |r| r.get(0),
            )
        })
        .await
        .expect("count")
}

/// Creates the multi-process tests' `charges`, one row per charge and its intent (the key),
/// no amount, if missing: the children of those tests insert into it.
pub(crate) async fn with_intent_charges(store: &SqliteStore) {
    store
        .try_call(|db| {
            db.execute_batch(
                "CREATE TABLE IF NOT EXISTS charges (id INTEGER PRIMARY KEY, intent TEXT NOT NULL)",
            )
        })
        .await
        .expect("charges");
}
