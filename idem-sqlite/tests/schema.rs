//! The schema two ways: the migrations the store applies in order when it opens (to create a
//! table or upgrade an old one), and `schema_sql`, the current schema in one script to apply by
//! hand. Both must build the same table, the script must be repeatable, and a database created
//! from it must open as up to date.

use idem_core::store::Deadline;
use idem_ops::Operator;
use idem_sqlite::rusqlite::{params, Connection};
use idem_sqlite::{schema_sql, SqliteStore, SCHEMA_VERSION};
use std::path::Path;

/// The table names every check runs with: the default, and one the `.sql` files' name is
/// replaced with.
const TABLES: [&str; 2] = ["idem_records", "payments_idem"];

/// What `schema_sql` printed in version 1: the first migration alone, with no migrations table
/// and no record of its version.
const V1_SCHEMA: &str = include_str!("../sql/migrations/0001_create_records.sql");

/// The version-1 script for `table`, as `schema_sql(table)` printed it in version 1.
fn v1_schema_sql(table: &str) -> String {
    V1_SCHEMA.replace("idem_records", table)
}

/// The migrations of versions 1 to 3 for `table`, in order, and those versions recorded: a
/// table as the version-3 release's store left it.
fn v3_tables_sql(table: &str) -> String {
    [
        include_str!("../sql/migrations_table.sql"),
        V1_SCHEMA,
        include_str!("../sql/migrations/0002_reservation_time.sql"),
        include_str!("../sql/migrations/0002_in_progress_index.sql"),
        include_str!("../sql/migrations/0003_completed_at.sql"),
        include_str!("../sql/migrations/0003_holder.sql"),
        include_str!("../sql/migrations/0003_key_index.sql"),
        "INSERT INTO idem_schema_migrations (table_name, version, applied_at) \
         VALUES ('idem_records', 1, 0), ('idem_records', 2, 0), ('idem_records', 3, 0);",
    ]
    .join("\n")
    .replace("idem_records", table)
}

/// Everything that defines the database's tables and indexes, one line per fact, sorted: every
/// object in `sqlite_master`, every table's columns (`pragma_table_info`: name, type, not null,
/// default, primary key, in order), and every index's flags (unique, origin, partial), key
/// columns (`pragma_index_xinfo`) and statement (whitespace collapsed, so a partial index's
/// `WHERE` counts).
fn shape(db: &Connection) -> Vec<String> {
    let mut lines = Vec::new();
    let objects: Vec<(String, String, String, Option<String>)> = db
        .prepare("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name")
        .expect("sqlite_master")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .expect("objects")
        .collect::<Result<_, _>>()
        .expect("objects");
    for (kind, name, table, sql) in objects {
        lines.push(format!("{kind} {name} on {table}"));
        match kind.as_str() {
            "table" => {
                let columns: Vec<String> = db
                    .prepare(
                        "SELECT cid, name, type, \"notnull\", dflt_value, pk \
                         FROM pragma_table_info(?1) ORDER BY cid",
                    )
                    .expect("table_info")
                    .query_map([&name], |r| {
                        Ok(format!(
                            "column {name}.{}: #{} {} notnull={} default={:?} pk={}",
                            r.get::<_, String>(1)?,
                            r.get::<_, i64>(0)?,
                            r.get::<_, String>(2)?,
                            r.get::<_, i64>(3)?,
                            r.get::<_, Option<String>>(4)?,
                            r.get::<_, i64>(5)?,
                        ))
                    })
                    .expect("columns")
                    .collect::<Result<_, _>>()
                    .expect("columns");
                lines.extend(columns);
            }
            "index" => {
                let flags: String = db
                    .query_row(
                        "SELECT format('unique=%d origin=%s partial=%d', \"unique\", origin, partial) \
                         FROM pragma_index_list(?1) WHERE name = ?2",
                        params![table, name],
                        |r| r.get(0),
                    )
                    .expect("index_list");
                lines.push(format!("index {name}: {flags}"));
                let keys: Vec<String> = db
                    .prepare(
                        "SELECT seqno, cid, name, \"desc\", coll, \"key\" \
                         FROM pragma_index_xinfo(?1) ORDER BY seqno",
                    )
                    .expect("index_xinfo")
                    .query_map([&name], |r| {
                        Ok(format!(
                            "index {name} #{}: cid={} {:?} desc={} coll={:?} key={}",
                            r.get::<_, i64>(0)?,
                            r.get::<_, i64>(1)?,
                            r.get::<_, Option<String>>(2)?,
                            r.get::<_, i64>(3)?,
                            r.get::<_, Option<String>>(4)?,
                            r.get::<_, i64>(5)?,
                        ))
                    })
                    .expect("keys")
                    .collect::<Result<_, _>>()
                    .expect("keys");
                lines.extend(keys);
                let sql = sql.map(|sql| sql.split_whitespace().collect::<Vec<_>>().join(" "));
                lines.push(format!("index {name} sql: {sql:?}"));
            }
            _ => {}
        }
    }
    lines.sort();
    lines
}

/// The versions `idem_schema_migrations` records for `table`, in order.
fn versions(db: &Connection, table: &str) -> Vec<i64> {
    db.prepare("SELECT version FROM idem_schema_migrations WHERE table_name = ?1 ORDER BY version")
        .expect("versions")
        .query_map([table], |r| r.get(0))
        .expect("versions")
        .collect::<Result<_, _>>()
        .expect("versions")
}

/// Every row of the migrations table (table, version, applied at).
fn migration_rows(db: &Connection) -> Vec<(String, i64, i64)> {
    db.prepare("SELECT table_name, version, applied_at FROM idem_schema_migrations ORDER BY 1, 2")
        .expect("rows")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("rows")
        .collect::<Result<_, _>>()
        .expect("rows")
}

/// Applies `schema_sql(table)` to the file at `path` by hand.
fn apply_by_hand(path: &Path, sql: &str) {
    Connection::open(path)
        .expect("open")
        .execute_batch(sql)
        .expect("the script applies");
}

fn every_version() -> Vec<i64> {
    (1..=SCHEMA_VERSION).collect()
}

#[tokio::test]
async fn the_migrations_and_the_schema_script_build_the_same_tables_and_indexes() {
    let dir = tempfile::tempdir().expect("dir");
    for table in TABLES {
        // The migrations from nothing, as the store creates a new file.
        let migrated = dir.path().join(format!("migrated-{table}.db"));
        SqliteStore::builder(&migrated)
            .table(table)
            .open()
            .await
            .expect("open creates");
        // The migrations from version 1, as the store upgrades an old table.
        let upgraded = dir.path().join(format!("upgraded-{table}.db"));
        apply_by_hand(&upgraded, &v1_schema_sql(table));
        SqliteStore::builder(&upgraded)
            .table(table)
            .open()
            .await
            .expect("open upgrades");
        // The migrations from version 3, as the store upgrades a table to records in doubt.
        let from_v3 = dir.path().join(format!("from-v3-{table}.db"));
        apply_by_hand(&from_v3, &v3_tables_sql(table));
        SqliteStore::builder(&from_v3)
            .table(table)
            .open()
            .await
            .expect("open upgrades from version 3");
        // The script, by hand.
        let scripted = dir.path().join(format!("scripted-{table}.db"));
        apply_by_hand(&scripted, &schema_sql(table));

        let [migrated, upgraded, from_v3, scripted] = [migrated, upgraded, from_v3, scripted]
            .map(|path| Connection::open(path).expect("open"));
        let expected = shape(&migrated);
        // What the comparison is about is there: the column, the partial index, the bookkeeping.
        let has = |wanted: &dyn Fn(&String) -> bool| expected.iter().any(wanted);
        let partial = format!("index {table}_in_progress: ");
        assert!(
            has(&|l| l.starts_with(&format!("column {table}.reserved_at:"))),
            "{expected:#?}"
        );
        assert!(
            has(&|l| l.starts_with(&partial) && l.ends_with("partial=1")),
            "{expected:#?}"
        );
        assert!(
            has(&|l| l.starts_with("column idem_schema_migrations.version:")),
            "{expected:#?}"
        );
        // Version 4: the mark of doubt, its partial index, the audit trail and its indexes.
        for column in ["doubt", "doubt_check_at"] {
            assert!(
                has(&|l| l.starts_with(&format!("column {table}.{column}:"))),
                "{expected:#?}"
            );
        }
        let in_doubt = format!("index {table}_in_doubt: ");
        assert!(
            has(&|l| l.starts_with(&in_doubt) && l.ends_with("partial=1")),
            "{expected:#?}"
        );
        for line in [
            format!("table {table}_reconciliations on {table}_reconciliations"),
            format!("index {table}_reconciliations_record on {table}_reconciliations"),
            format!("index {table}_reconciliations_kept on {table}_reconciliations"),
        ] {
            assert!(has(&|l| *l == line), "{line}: {expected:#?}");
        }
        assert_eq!(
            shape(&upgraded),
            expected,
            "{table}: upgraded from version 1"
        );
        assert_eq!(
            shape(&from_v3),
            expected,
            "{table}: upgraded from version 3"
        );
        assert_eq!(shape(&scripted), expected, "{table}: schema_sql");
        for db in [&migrated, &upgraded, &from_v3, &scripted] {
            assert_eq!(versions(db, table), every_version(), "{table}");
        }
    }
}

#[tokio::test]
async fn the_schema_script_can_be_applied_again() {
    let dir = tempfile::tempdir().expect("dir");
    for table in TABLES {
        let sql = schema_sql(table);
        let db = Connection::open_in_memory().expect("open");
        db.execute_batch(&sql).expect("once");
        let (once, rows) = (shape(&db), migration_rows(&db));
        db.execute_batch(&sql).expect("twice");
        assert_eq!(shape(&db), once, "{table}");
        assert_eq!(
            migration_rows(&db),
            rows,
            "{table}: the recorded versions are kept"
        );

        // On a database the store created, the script changes nothing either.
        let path = dir.path().join(format!("store-{table}.db"));
        SqliteStore::builder(&path)
            .table(table)
            .open()
            .await
            .expect("open creates");
        let db = Connection::open(&path).expect("open");
        let (before, rows) = (shape(&db), migration_rows(&db));
        db.execute_batch(&sql).expect("on the store's database");
        assert_eq!(shape(&db), before, "{table}");
        assert_eq!(migration_rows(&db), rows, "{table}");
    }
}

#[tokio::test]
async fn a_database_created_from_the_schema_script_opens_up_to_date_and_runs_no_migration() {
    let dir = tempfile::tempdir().expect("dir");
    for table in TABLES {
        let path = dir.path().join(format!("hand-{table}.db"));
        apply_by_hand(&path, &schema_sql(table));
        let (before, rows) = {
            let db = Connection::open(&path).expect("open");
            assert_eq!(
                versions(&db, table),
                every_version(),
                "{table}: the script records its versions under the table's name"
            );
            (shape(&db), migration_rows(&db))
        };
        // Version 2's ALTER TABLE would fail on the existing column, and recording a version
        // again on the primary key: opening succeeds only if no migration runs.
        let store = SqliteStore::builder(&path)
            .table(table)
            .open()
            .await
            .expect("a database created from schema_sql opens");
        store
            .stats(Deadline::default())
            .await
            .expect("the table is usable");
        drop(store);
        let db = Connection::open(&path).expect("open");
        assert_eq!(shape(&db), before, "{table}: opening changed the schema");
        assert_eq!(
            migration_rows(&db),
            rows,
            "{table}: opening ran a migration"
        );

        // Once a store has opened it (and put it in WAL mode), it opens without migrations.
        SqliteStore::builder(&path)
            .table(table)
            .migrate(false)
            .open()
            .await
            .expect("a current table opens without migrations");
    }
}

#[tokio::test]
async fn a_table_applied_by_hand_from_the_version_1_script_is_upgraded_when_opened() {
    let dir = tempfile::tempdir().expect("dir");
    for table in TABLES {
        let path = dir.path().join(format!("v1-{table}.db"));
        apply_by_hand(&path, &v1_schema_sql(table));
        Connection::open(&path)
            .expect("open")
            .execute(
                &format!(
                    "INSERT INTO {table} (consumer, route, key, fingerprint, token, state, deadline, response) \
                     VALUES ('acct', 'POST /charges', 'k', zeroblob(32), zeroblob(16), 0, 4102444800000, NULL)"
                ),
                [],
            )
            .expect("v1 row");
        let store = SqliteStore::builder(&path)
            .table(table)
            .open()
            .await
            .expect("a version-1 table with no recorded version is upgraded");
        let stats = store.stats(Deadline::default()).await.expect("stats");
        assert_eq!(stats.in_progress, 1, "{table}: the row is kept");
        drop(store);
        let db = Connection::open(&path).expect("open");
        assert_eq!(versions(&db, table), every_version(), "{table}");
        let reserved_at: i64 = db
            .query_row(&format!("SELECT reserved_at FROM {table}"), [], |r| {
                r.get(0)
            })
            .expect("the column was added");
        assert_eq!(reserved_at, 0, "{table}: an old row's age is unknown");
    }
}
