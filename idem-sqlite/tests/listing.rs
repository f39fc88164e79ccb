//! What operators see on SQLite beyond the conformance suite: a table from schema version 1 is
//! migrated in place and its records list with an unknown age, and the listings read indexes,
//! never the whole table.

use idem_core::store::Deadline;
use idem_core::store::Store;
use idem_core::{IdempotencyKey, RecordId, Scope};
use idem_ops::{ListQuery, ListedState, Operator};
use idem_sqlite::rusqlite::{params, Connection};
use idem_sqlite::{SqliteStore, SCHEMA_VERSION};
use std::time::Duration;

const V1_SCHEMA: &str = include_str!("../sql/migrations/0001_create_records.sql");

/// A file holding a version-1 table with an in-progress row (lease an hour away) and a
/// completed one, as a release before version 2 left them (in WAL mode, as every release
/// puts its file).
fn version_1_file(path: &std::path::Path) {
    let db = Connection::open(path).expect("open");
    let mode: String = db
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .expect("WAL");
    assert_eq!(mode, "wal");
    db.execute_batch(include_str!("../sql/migrations_table.sql"))
        .expect("migrations table");
    db.execute_batch(V1_SCHEMA).expect("v1 schema");
    db.execute(
        "INSERT INTO idem_schema_migrations (table_name, version, applied_at) VALUES ('idem_records', 1, 0)",
        [],
    )
    .expect("record v1");
    let far = 4_102_444_800_000_i64; // 2100-01-01
    let completed = idem_core::StoredResponse::new(201, "{}")
        .encode()
        .expect("encode");
    for (key, state, response) in [("old-running", 0, None), ("old-done", 1, Some(completed))] {
        db.execute(
            "INSERT INTO idem_records (consumer, route, key, fingerprint, token, state, deadline, response) \
             VALUES ('acct', 'POST /charges', ?1, zeroblob(32), zeroblob(16), ?2, ?3, ?4)",
            params![key, state, far, response],
        )
        .expect("v1 row");
    }
}

#[tokio::test]
async fn a_version_1_table_is_migrated_and_its_records_list_without_an_age() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("v1.db");
    version_1_file(&path);
    let store = SqliteStore::open(&path).await.expect("open migrates");

    let pending = store
        .list(
            &ListQuery::in_progress(Duration::from_secs(365 * 24 * 3600)),
            Deadline::default(),
        )
        .await
        .expect("list");
    let [record] = pending.records.as_slice() else {
        panic!("{pending:?}");
    };
    assert_eq!(record.id.key(), "old-running");
    assert_eq!(record.reserved_at, None, "its age is unknown, so it is old");

    let done = store
        .list(
            &ListQuery::completed("acct").expect("consumer"),
            Deadline::default(),
        )
        .await
        .expect("list");
    assert_eq!(done.records.len(), 1);
    assert!(matches!(
        done.records[0].state,
        ListedState::Completed { status: 201, .. }
    ));
    let stats = store.stats(Deadline::default()).await.expect("stats");
    assert_eq!((stats.in_progress, stats.completed), (1, 1));
    assert_eq!(
        stats.oldest_in_progress, None,
        "no in-progress record has a time"
    );

    let version: i64 = Connection::open(&path)
        .expect("open")
        .query_row(
            "SELECT max(version) FROM idem_schema_migrations WHERE table_name = 'idem_records'",
            [],
            |row| row.get(0),
        )
        .expect("version");
    assert_eq!(version, SCHEMA_VERSION);
    let id = RecordId::new(
        Scope::new("acct", "POST /charges").expect("scope"),
        IdempotencyKey::new("old-done").expect("key"),
    );
    assert!(store
        .lookup(&id, Deadline::default())
        .await
        .expect("lookup")
        .is_some());
}

#[tokio::test]
async fn listings_read_an_index_never_the_whole_table() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("plan.db");
    SqliteStore::open(&path).await.expect("open");
    let db = Connection::open(&path).expect("open");
    for (statement, index) in [
        (
            include_str!("../sql/list_in_progress.sql"),
            "idem_records_in_progress",
        ),
        (
            include_str!("../sql/list_completed.sql"),
            "sqlite_autoindex_idem_records_1",
        ),
    ] {
        let plan: Vec<String> = db
            .prepare(&format!("EXPLAIN QUERY PLAN {statement}"))
            .expect("explain")
            .query_map(params![0, -1, "", "", "", 10], |row| {
                row.get::<_, String>(3)
            })
            .expect("plan")
            .collect::<Result<_, _>>()
            .expect("rows");
        let plan = plan.join("; ");
        assert!(plan.contains(index), "{plan}");
        assert!(!plan.contains("TEMP B-TREE"), "a listing sorts: {plan}");
    }
    // A lookup by key alone (`idem inspect KEY`) reads the key index in its order.
    let plan: Vec<String> = db
        .prepare(&format!(
            "EXPLAIN QUERY PLAN {}",
            include_str!("../sql/list_key.sql")
        ))
        .expect("explain")
        .query_map(params!["k", "", "", 10], |row| row.get::<_, String>(3))
        .expect("plan")
        .collect::<Result<_, _>>()
        .expect("rows");
    let plan = plan.join("; ");
    assert!(plan.contains("idem_records_key"), "{plan}");
    assert!(
        !plan.contains("TEMP B-TREE"),
        "a lookup by key sorts: {plan}"
    );
}

#[tokio::test]
async fn opening_without_migrations_creates_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let missing = dir.path().join("missing.db");
    let err = SqliteStore::builder(&missing)
        .migrate(false)
        .open()
        .await
        .expect_err("no file");
    assert!(matches!(err, idem_core::Error::Store(_)), "{err:?}");
    assert!(
        !missing.exists(),
        "a mistyped path must not create a database"
    );

    let old = dir.path().join("v1.db");
    version_1_file(&old);
    let err = SqliteStore::builder(&old)
        .migrate(false)
        .open()
        .await
        .expect_err("version 1");
    assert!(err.to_string().contains("schema version 1"), "{err}");
    let version: i64 = Connection::open(&old)
        .expect("open")
        .query_row(
            "SELECT max(version) FROM idem_schema_migrations",
            [],
            |row| row.get(0),
        )
        .expect("version");
    assert_eq!(version, 1, "the schema was left alone");

    let current = dir.path().join("current.db");
    SqliteStore::open(&current).await.expect("create");
    SqliteStore::builder(&current)
        .migrate(false)
        .open()
        .await
        .expect("a current table opens");
    let err = SqliteStore::builder(&current)
        .table("other")
        .migrate(false)
        .open()
        .await
        .expect_err("no such table");
    assert!(err.to_string().contains("no idem table other"), "{err}");
}

#[tokio::test]
async fn opening_without_migrations_refuses_a_file_not_in_wal_mode_and_leaves_it_unchanged() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("other.db");
    let journal_mode = |db: &Connection| -> String {
        db.query_row("PRAGMA journal_mode", [], |row| row.get(0))
            .expect("journal mode")
    };
    {
        let db = Connection::open(&path).expect("open");
        db.execute_batch("CREATE TABLE app (x); INSERT INTO app VALUES (1);")
            .expect("an application's table");
        assert_eq!(journal_mode(&db), "delete");
    }
    let err = SqliteStore::builder(&path)
        .migrate(false)
        .open()
        .await
        .expect_err("not an idem database");
    assert!(
        matches!(
            err,
            idem_core::Error::InvalidInput {
                field: idem_core::Field::Config,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("is not a database an idem store has opened"),
        "{err}"
    );
    let db = Connection::open(&path).expect("open");
    assert_eq!(journal_mode(&db), "delete", "opening switched the file");
    let rows: i64 = db
        .query_row("SELECT count(*) FROM app", [], |row| row.get(0))
        .expect("the application's table");
    assert_eq!(rows, 1);
    let tables: i64 = db
        .query_row("SELECT count(*) FROM sqlite_master", [], |row| row.get(0))
        .expect("tables");
    assert_eq!(tables, 1, "opening created a table");
}

/// Rolling back to a release of schema version 1 means deleting the version-2 row (the
/// column stays); the next upgrade records version 2 again instead of failing on the column.
#[tokio::test]
async fn a_table_rolled_back_to_version_1_upgrades_again() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("rolled-back.db");
    SqliteStore::open(&path)
        .await
        .expect("create at the current version");
    Connection::open(&path)
        .expect("open")
        .execute(
            "DELETE FROM idem_schema_migrations WHERE table_name = 'idem_records' AND version = 2",
            [],
        )
        .expect("roll back");
    let store = SqliteStore::open(&path).await.expect("upgrades again");
    let stats = store.stats(Deadline::default()).await.expect("stats");
    assert_eq!(stats.total(), 0);
    let version: i64 = Connection::open(&path)
        .expect("open")
        .query_row(
            "SELECT max(version) FROM idem_schema_migrations",
            [],
            |row| row.get(0),
        )
        .expect("version");
    assert_eq!(version, SCHEMA_VERSION);
}

/// One record whose holder this version cannot read (a future format, a hand edit, a value
/// of another type) is still listed and inspected, its holder unreadable and bounded; the
/// others list as before, and the engine's reads ignore it.
#[tokio::test]
async fn an_unreadable_holder_takes_no_listing_down() {
    use idem_core::testing::{request, unique_consumer};
    use idem_core::{Begin, Idempotency, Policy};
    use idem_ops::Noted;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("holder.db");
    let store = SqliteStore::open(&path).await.expect("open");
    let idem = Idempotency::with_policy(
        store.clone(),
        Policy::default().lease(Duration::from_secs(3600)),
    )
    .expect("valid policy");
    let consumer = unique_consumer("holder");
    let mut ids = Vec::new();
    for key in ["text", "number", "fine"] {
        let req = request(&consumer, key, b"{}");
        let Begin::Acquired(_) = idem.begin(&req).await.expect("begin") else {
            panic!("a fresh key is acquired");
        };
        ids.push(req.id().clone());
    }
    let db = Connection::open(&path).expect("open");
    let hostile = format!("h9 {}", "\u{7}".repeat(10_000));
    db.execute(
        "UPDATE idem_records SET holder = ?1 WHERE key = 'text'",
        params![hostile],
    )
    .expect("hand edit");
    db.execute(
        "UPDATE idem_records SET holder = 42 WHERE key = 'number'",
        [],
    )
    .expect("hand edit");
    let page = store
        .list(
            &ListQuery::in_progress(Duration::ZERO).limit(10),
            Deadline::default(),
        )
        .await
        .expect("a listing despite the holders");
    assert_eq!(page.records.len(), 3, "{page:?}");
    for record in &page.records {
        match record.id.key() {
            "fine" => assert!(matches!(record.holder, Noted::Known(_)), "{record:?}"),
            _ => match &record.holder {
                Noted::Unreadable(why) => assert!(why.len() < 400, "{why}"),
                other => panic!("unreadable: {other:?}"),
            },
        }
    }
    let inspected = store
        .inspect(&ids[0], Deadline::default())
        .await
        .expect("inspect")
        .expect("there");
    assert!(matches!(inspected.provenance.holder, Noted::Unreadable(_)));
    assert!(store
        .lookup(&ids[1], Deadline::default())
        .await
        .expect("lookup")
        .is_some());
}

/// C11 across processes: a takeover through a handle that records another holder records the
/// taker and a later time; a start over after the retention clears the completion time and
/// records the new holder.
#[tokio::test]
async fn c11_a_takeover_by_another_process_records_the_taker() {
    let dir = tempfile::tempdir().expect("dir");
    let first = SqliteStore::open(dir.path().join("holders.db"))
        .await
        .expect("open");
    let other = idem_ops::Holder::new("web-2.example", 4242, 7, Some(99));
    let second = first.with_holder(&other);
    idem_ops::testing::c11_a_takeover_and_a_start_over_record_the_new_holder(first, second, &other)
        .await;
}
