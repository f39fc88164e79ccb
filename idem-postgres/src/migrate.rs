//! The versioned schema: applied by [`PgStore::migrate`](crate::PgStore::migrate), and printable
//! to run from your own migration tool.

use crate::config::{validate_identifier, validate_table};
use crate::error::{is_lock_timeout, store_error};
use crate::params::{execute, fetch_all, Param};
use crate::sql::{for_table, INDEX_IN_PROGRESS, MIGRATION_FILES};
use crate::store::PgStore;
use idem_core::{Error, Field};
use sqlx::{AssertSqlSafe, Row};
use std::time::Duration;

/// The schema version this crate writes.
pub const SCHEMA_VERSION: i64 = 2;

/// How often a migration tries again to take a table lock another transaction holds (each try
/// waits at most `migration_lock_timeout.sql`'s 100 ms, then pauses).
const LOCK_ATTEMPTS: u32 = 60;
/// The pause between two tries.
const LOCK_PAUSE: Duration = Duration::from_millis(500);

impl PgStore {
    /// Applies the migrations the store's table is missing, in one transaction, under an
    /// advisory lock per schema (several processes may call it at once), and records them in
    /// `<schema>.idem_schema_migrations`; then builds the indexes that are missing, concurrently.
    /// Creates the schema if it does not exist. A table migrated by a newer version of this crate
    /// is refused. Call it once at start-up, or run [`schema_sql`] from your own migration tool
    /// instead.
    ///
    /// Safe on a live table: a migration waits at most 100 ms for a table lock another
    /// transaction holds (reads and writes of the table queue behind a waiting `ALTER TABLE`),
    /// then lets go and tries again, for about half a minute before it gives up with
    /// [`StoreErrorKind::Unavailable`](idem_core::StoreErrorKind::Unavailable); indexes are built
    /// `CONCURRENTLY`, without blocking traffic. An index build that was interrupted (a crash, a
    /// cancelled statement) is dropped and built again by the next call.
    pub async fn migrate(&self) -> Result<(), Error> {
        let mut attempt = 1;
        loop {
            match self.migrate_tables().await {
                Err(error) if is_lock_timeout(&error) && attempt < LOCK_ATTEMPTS => {
                    attempt += 1;
                    tokio::time::sleep(LOCK_PAUSE).await;
                }
                result => break result?,
            }
        }
        self.build_indexes().await
    }

    async fn migrate_tables(&self) -> Result<(), Error> {
        let inner = &self.inner;
        let (schema, table) = (&inner.config.schema, &inner.config.table);
        let qualified = format!("{schema}.{table}");
        let mode = inner.ops.mode;
        let mut tx = inner.pool.begin().await.map_err(store_error)?;
        execute(
            &mut tx,
            mode,
            &inner.ops.sql.migration_lock,
            &[Param::Text(schema)],
        )
        .await?;
        execute(&mut tx, mode, &inner.ops.sql.migration_lock_timeout, &[]).await?;
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE SCHEMA IF NOT EXISTS \"{schema}\"; {}",
            inner.ops.sql.migrations_table
        )))
        .execute(&mut *tx)
        .await
        .map_err(store_error)?;
        let rows = fetch_all(
            &mut tx,
            mode,
            &inner.ops.sql.migrations_applied,
            &[Param::Text(&qualified)],
        )
        .await?;
        let applied: i64 = match rows.first() {
            Some(row) => row.try_get(0).map_err(store_error)?,
            None => 0,
        };
        if applied > SCHEMA_VERSION {
            return Err(Error::invalid(
                Field::Config,
                format!("table {qualified} has schema version {applied}; this idem-postgres knows up to {SCHEMA_VERSION}"),
            ));
        }
        for (version, sql) in MIGRATION_FILES.iter().filter(|(v, _)| *v > applied) {
            sqlx::raw_sql(AssertSqlSafe(for_table(sql, schema, table)))
                .execute(&mut *tx)
                .await
                .map_err(store_error)?;
            execute(
                &mut tx,
                mode,
                &inner.ops.sql.migration_record,
                &[Param::Text(&qualified), Param::Int(*version)],
            )
            .await?;
        }
        tx.commit().await.map_err(store_error)
    }

    /// Builds the in-progress index if it is missing, or again if an interrupted build left it
    /// invalid; outside any transaction, `CONCURRENTLY`.
    async fn build_indexes(&self) -> Result<(), Error> {
        let inner = &self.inner;
        let (schema, table) = (&inner.config.schema, &inner.config.table);
        let name = format!("\"{schema}\".\"{table}_in_progress\"");
        let mut conn = inner.pool.acquire().await.map_err(store_error)?;
        let rows = fetch_all(
            &mut conn,
            inner.ops.mode,
            &inner.ops.sql.index_valid,
            &[Param::Text(&name)],
        )
        .await?;
        let valid: Option<bool> = match rows.first() {
            Some(row) => Some(row.try_get(0).map_err(store_error)?),
            None => None,
        };
        let statements: &[&str] = match valid {
            Some(true) => &[],
            Some(false) => &[
                &inner.ops.sql.index_drop_in_progress,
                &inner.ops.sql.index_in_progress,
            ],
            None => &[&inner.ops.sql.index_in_progress],
        };
        for statement in statements {
            sqlx::raw_sql(AssertSqlSafe((*statement).to_owned()))
                .execute(&mut *conn)
                .await
                .map_err(store_error)?;
        }
        Ok(())
    }
}

/// The whole schema for `schema.table`, to apply from your own migration tool (the names are
/// checked by [`validate_identifier`]; the table leaves room for its index names, at most 51
/// bytes). One script that runs in a transaction and can run again. Its last statement builds
/// the in-progress index with a plain `CREATE INDEX`, which blocks writes to the table while it
/// reads it: instant on a new table; on a large live one, run it with `CONCURRENTLY` outside a
/// transaction instead, as [`PgStore::migrate`] does.
///
/// ```
/// let sql = idem_postgres::schema_sql("billing", "idem_records")?;
/// assert!(sql.contains("CREATE TABLE IF NOT EXISTS \"billing\".\"idem_records\""));
/// assert!(sql.contains("CREATE INDEX IF NOT EXISTS \"idem_records_in_progress\""));
/// # Ok::<(), idem_core::Error>(())
/// ```
pub fn schema_sql(schema: &str, table: &str) -> Result<String, Error> {
    validate_identifier(schema)?;
    validate_table(table)?;
    // The concurrent build cannot run in a transaction, where a migration tool runs a script.
    let index = INDEX_IN_PROGRESS.replace("CREATE INDEX CONCURRENTLY", "CREATE INDEX");
    Ok(MIGRATION_FILES
        .iter()
        .map(|(_, sql)| *sql)
        .chain([index.as_str()])
        .map(|sql| {
            format!(
                "{};",
                for_table(sql, schema, table)
                    .trim_end()
                    .trim_end_matches(';')
            )
        })
        .collect::<Vec<_>>()
        .join("\n"))
}
