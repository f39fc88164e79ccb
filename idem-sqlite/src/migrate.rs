//! The versioned schema: the migrations the store applies when it opens, and the current
//! schema in one repeatable script to run by hand.

use crate::error::{is_busy, store_error};
use crate::sql::{for_table, Step, MIGRATIONS, MIGRATIONS_TABLE, SCHEMA};
use idem_core::Error;
use rusqlite::{params, Connection, TransactionBehavior};
use std::time::{SystemTime, UNIX_EPOCH};

/// The schema version this crate writes.
pub const SCHEMA_VERSION: i64 = 4;

/// Applies the migrations `table` is missing, in one write transaction, and records them in
/// `idem_schema_migrations`. A table migrated by a newer version of this crate is refused.
pub(crate) fn migrate(conn: &mut Connection, table: &str) -> Result<(), Error> {
    // Up to date (the usual case): a read, no write lock, so opening never waits for writers.
    if applied_version(conn, table).ok() == Some(SCHEMA_VERSION) {
        return Ok(());
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(store_error)?;
    tx.execute_batch(MIGRATIONS_TABLE).map_err(store_error)?;
    let applied = applied_version(&tx, table)?;
    if applied > SCHEMA_VERSION {
        return Err(Error::SchemaVersion {
            table: table.to_owned(),
            found: applied,
            expected: SCHEMA_VERSION,
        });
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    for (version, steps) in MIGRATIONS.iter().filter(|(v, _)| *v > applied) {
        for step in *steps {
            let sql = match step {
                Step::Sql(sql) => sql,
                Step::AddColumn { column, .. } if has_column(&tx, table, column)? => continue,
                Step::AddColumn { sql, .. } => sql,
            };
            tx.execute_batch(&for_table(sql, table))
                .map_err(store_error)?;
        }
        tx.execute(
            include_str!("../sql/migration_record.sql"),
            params![table, version, now],
        )
        .map_err(store_error)?;
    }
    tx.commit().map_err(store_error)
}

/// Whether `table` has `column` (a step that adds it has nothing to do).
fn has_column(conn: &Connection, table: &str, column: &str) -> Result<bool, Error> {
    conn.query_row(
        "SELECT count(*) FROM pragma_table_info(?1) WHERE name = ?2",
        params![table, column],
        |row| row.get::<_, i64>(0),
    )
    .map(|n| n > 0)
    .map_err(store_error)
}

/// Checks, without writing, that `table` is at [`SCHEMA_VERSION`].
pub(crate) fn require_current(conn: &Connection, table: &str) -> Result<(), Error> {
    match applied_version(conn, table) {
        Ok(SCHEMA_VERSION) => Ok(()),
        Err(error) if is_busy(&error) => Err(error),
        Ok(found) => Err(Error::SchemaVersion {
            table: table.to_owned(),
            found,
            expected: SCHEMA_VERSION,
        }),
        Err(_) => Err(Error::SchemaVersion {
            table: table.to_owned(),
            found: 0,
            expected: SCHEMA_VERSION,
        }),
    }
}

/// The highest migration applied to `table` (0 for none); an error if the migrations table
/// does not exist yet.
fn applied_version(conn: &Connection, table: &str) -> Result<i64, Error> {
    conn.query_row(
        include_str!("../sql/migrations_applied.sql"),
        params![table],
        |row| row.get(0),
    )
    .map_err(store_error)
}

/// The current schema for `table` (at [`SCHEMA_VERSION`]), to apply by hand or from your own
/// migration tool; `idem migrate --print` prints it. Validate the name with
/// [`validate_table_name`](crate::validate_table_name) first.
///
/// Every statement is `IF NOT EXISTS` or `INSERT OR IGNORE`, so the script can be applied again
/// without error, and it records the table's versions in `idem_schema_migrations`: a store
/// opened on the database afterwards finds the table up to date and runs no migration (it only
/// puts the file in WAL mode, which a script run inside a transaction cannot do). It creates a
/// missing table; it does not upgrade one from an older version (opening the store does, with
/// the migrations).
///
/// ```
/// use idem_sqlite::rusqlite::Connection;
/// let sql = idem_sqlite::schema_sql("payments_idem");
/// assert!(sql.contains("CREATE TABLE IF NOT EXISTS payments_idem"));
/// assert!(sql.contains("INSERT OR IGNORE INTO idem_schema_migrations"));
///
/// let db = Connection::open_in_memory().expect("open");
/// db.execute_batch(&sql).expect("applies");
/// db.execute_batch(&sql).expect("applies again");
/// let version: i64 = db
///     .query_row(
///         "SELECT max(version) FROM idem_schema_migrations WHERE table_name = 'payments_idem'",
///         [],
///         |row| row.get(0),
///     )
///     .expect("recorded");
/// assert_eq!(version, idem_sqlite::SCHEMA_VERSION);
/// ```
pub fn schema_sql(table: &str) -> String {
    for_table(SCHEMA, table)
}
