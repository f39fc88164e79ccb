//! The versioned schema: applied by [`PgStore::migrate`](crate::PgStore::migrate), and printable
//! to run from your own migration tool.

use crate::config::validate_identifier;
use crate::error::store_error;
use crate::params::{execute, fetch_all, Param};
use crate::sql::{for_table, MIGRATION_FILES};
use crate::store::PgStore;
use idem_core::{Error, Field};
use sqlx::{AssertSqlSafe, Row};

/// The schema version this crate writes.
pub const SCHEMA_VERSION: i64 = 2;

impl PgStore {
    /// Applies the migrations the store's table is missing, in one transaction, under an
    /// advisory lock per schema (several processes may call it at once), and records them in
    /// `<schema>.idem_schema_migrations`. Creates the schema if it does not exist. A table
    /// migrated by a newer version of this crate is refused. Call it once at start-up, or
    /// run [`schema_sql`] from your own migration tool instead.
    pub async fn migrate(&self) -> Result<(), Error> {
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
}

/// The whole schema for `schema.table`, to apply from your own migration tool (the names are
/// checked by [`validate_identifier`]).
///
/// ```
/// let sql = idem_postgres::schema_sql("billing", "idem_records")?;
/// assert!(sql.contains("CREATE TABLE IF NOT EXISTS \"billing\".\"idem_records\""));
/// # Ok::<(), idem_core::Error>(())
/// ```
pub fn schema_sql(schema: &str, table: &str) -> Result<String, Error> {
    validate_identifier(schema)?;
    validate_identifier(table)?;
    Ok(MIGRATION_FILES
        .iter()
        .map(|(_, sql)| for_table(sql, schema, table))
        .collect::<Vec<_>>()
        .join("\n"))
}
