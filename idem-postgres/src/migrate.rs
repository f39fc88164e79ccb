//! The versioned schema: applied by [`PgStore::migrate`](crate::PgStore::migrate), and printable
//! to run from your own migration tool.

use crate::config::{validate_identifier, validate_table_name};
use crate::error::{is_lock_timeout, store_error};
use crate::params::{execute, fetch_all, Param, StatementMode};
use crate::sql::{
    for_table, INDEX_DROP_DEADLINE, INDEX_DROP_IN_PROGRESS, INDEX_IN_DOUBT, INDEX_KEY,
    INDEX_RESERVED, MIGRATION_FILES,
};
use crate::store::PgStore;
use idem_core::Error;
use sqlx::{AssertSqlSafe, Row};
use std::time::Duration;

/// The schema version this crate writes.
pub const SCHEMA_VERSION: i64 = 6;

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
    /// [`StoreErrorKind::Unavailable`](idem_core::StoreErrorKind::Unavailable). The listing
    /// index is then built `CONCURRENTLY`, without blocking traffic, by one process at a time:
    /// a process that finds another building returns at once. Such a build waits for every
    /// transaction older than itself in the database (a `pg_dump`, a long report), so on a large
    /// or busy database run it as a deploy step (`idem migrate`) before the instances start;
    /// they then find it done. The same goes for the index of a lookup by key and the one of the
    /// records in doubt; the audit trail of records in doubt is a new table, created with its
    /// indexes by its migration. A build that fails (a `statement_timeout`, a cancel) is logged
    /// (target `idem`, warn) and does not fail the call: the table works without the index
    /// (listings of pending records read it whole), and the next call builds it again.
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
            return Err(Error::SchemaVersion {
                table: qualified,
                found: applied,
                expected: SCHEMA_VERSION,
            });
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

    /// Builds the listing indexes (in progress by age, records by key, in doubt by age) that are
    /// missing, or
    /// again where an interrupted build left one invalid: `CONCURRENTLY`, outside any
    /// transaction, one builder at a time across processes.
    /// A process that finds another building returns at once. A build that fails (a
    /// `statement_timeout`, a cancel) is logged and left for a later call: the table works
    /// without the index (listings of pending records read it whole meanwhile), so start-up does
    /// not depend on it.
    async fn build_indexes(&self) -> Result<(), Error> {
        let inner = &self.inner;
        let (schema, table) = (&inner.config.schema, &inner.config.table);
        let qualified = format!("{schema}.{table}");
        let mode = inner.ops.mode;
        // READ COMMITTED whatever the pool's default: between statements this transaction holds
        // no snapshot, so the concurrent build never waits for it.
        let mut holder = inner
            .pool
            .begin_with("BEGIN ISOLATION LEVEL READ COMMITTED")
            .await
            .map_err(store_error)?;
        let locked = fetch_all(
            &mut holder,
            mode,
            &inner.ops.sql.index_lock,
            &[Param::Text(&qualified)],
        )
        .await?;
        let locked: bool = match locked.first() {
            Some(row) => row.try_get(0).map_err(store_error)?,
            None => false,
        };
        if !locked {
            tracing::debug!(target: "idem", table = %qualified, "another process builds the listing indexes");
            return holder.rollback().await.map_err(store_error);
        }
        let indexes = [
            (
                "reserved",
                &inner.ops.sql.index_drop_reserved,
                &inner.ops.sql.index_reserved,
            ),
            (
                "key",
                &inner.ops.sql.index_drop_key,
                &inner.ops.sql.index_key,
            ),
            (
                "in_doubt",
                &inner.ops.sql.index_drop_in_doubt,
                &inner.ops.sql.index_in_doubt,
            ),
        ];
        for (suffix, drop_sql, create_sql) in indexes {
            let valid = self.index_state(&mut holder, suffix).await?;
            // Under the lock, an invalid index is not being built by anyone: an interrupted
            // build.
            let statements: &[&str] = match valid {
                Some(true) => &[],
                Some(false) => &[&**drop_sql, &**create_sql],
                None => &[&**create_sql],
            };
            self.build_index(&qualified, suffix, statements).await?;
        }
        // The indexes of versions before 5 on columns the completion changes (they keep it from
        // being a HOT update), once the index that replaces them is there.
        if self.index_state(&mut holder, "reserved").await? == Some(true) {
            let old = [
                ("deadline", &inner.ops.sql.index_drop_deadline),
                ("in_progress", &inner.ops.sql.index_drop_in_progress),
            ];
            for (suffix, drop_sql) in old {
                if self.index_state(&mut holder, suffix).await?.is_some() {
                    self.build_index(&qualified, suffix, &[&**drop_sql]).await?;
                }
            }
        }
        holder.commit().await.map_err(store_error)
    }

    /// Whether the index `<table>_<suffix>` exists (`None` if not), and is valid.
    async fn index_state(
        &self,
        conn: &mut sqlx::PgConnection,
        suffix: &str,
    ) -> Result<Option<bool>, Error> {
        let (schema, table) = (&self.inner.config.schema, &self.inner.config.table);
        let name = format!("\"{schema}\".\"{table}_{suffix}\"");
        let rows = fetch_all(
            conn,
            self.inner.ops.mode,
            &self.inner.ops.sql.index_valid,
            &[Param::Text(&name)],
        )
        .await?;
        match rows.first() {
            Some(row) => Ok(Some(row.try_get(0).map_err(store_error)?)),
            None => Ok(None),
        }
    }

    /// Runs `statements` (a concurrent build, after a drop of an invalid index) on a
    /// connection of their own; a failed build is logged, not returned.
    async fn build_index(
        &self,
        qualified: &str,
        suffix: &str,
        statements: &[&str],
    ) -> Result<(), Error> {
        let inner = &self.inner;
        if !statements.is_empty() {
            // A connection of its own, without the store's deadlines (building an index on a
            // large table takes as long as it takes), closed afterwards rather than given back.
            let mut builder = inner.conns.get_fresh().await?;
            builder.session_changed();
            let mut built = Ok(());
            if inner.ops.mode == StatementMode::Prepared {
                built = sqlx::raw_sql("SET statement_timeout = 0; SET lock_timeout = 0")
                    .execute(builder.conn())
                    .await
                    .map(drop)
                    .map_err(store_error);
            }
            for statement in statements {
                if built.is_err() {
                    break;
                }
                built = sqlx::raw_sql(AssertSqlSafe((*statement).to_owned()))
                    .execute(builder.conn())
                    .await
                    .map(drop)
                    .map_err(store_error);
            }
            builder.close();
            if let Err(error) = built {
                tracing::warn!(
                    target: "idem",
                    table = %qualified,
                    index = suffix,
                    %error,
                    "idem.migrate: an index was not built; the table works without it, and the next migrate builds it"
                );
            }
        }
        Ok(())
    }
}

/// The whole schema for `schema.table`, to apply from your own migration tool (the names are
/// checked by [`validate_identifier`]; the table leaves room for the names derived from it, its
/// indexes and `<table>_reconciliations`, at most 47 bytes). One script that runs in a
/// transaction and can run again. Its `ALTER TABLE` holds the table's exclusive lock until the
/// commit and its last statements build the listing indexes with a plain `CREATE INDEX`, so the
/// table's reads and writes wait for the whole script: instant on a new or small table; on a
/// large live one use [`PgStore::migrate`], which waits for locks briefly and builds the indexes
/// `CONCURRENTLY`.
///
/// ```
/// let sql = idem_postgres::schema_sql("billing", "idem_records")?;
/// assert!(sql.contains("CREATE TABLE IF NOT EXISTS \"billing\".\"idem_records\""));
/// assert!(sql.contains("CREATE INDEX IF NOT EXISTS \"idem_records_reserved\""));
/// assert!(sql.contains("CREATE TABLE IF NOT EXISTS \"billing\".\"idem_records_reconciliations\""));
/// # Ok::<(), idem_core::Error>(())
/// ```
pub fn schema_sql(schema: &str, table: &str) -> Result<String, Error> {
    validate_identifier(schema)?;
    validate_table_name(table)?;
    // The concurrent build cannot run in a transaction, where a migration tool runs a script.
    let index = INDEX_RESERVED.replace("CREATE INDEX CONCURRENTLY", "CREATE INDEX");
    let key_index = INDEX_KEY.replace("CREATE INDEX CONCURRENTLY", "CREATE INDEX");
    let doubt_index = INDEX_IN_DOUBT.replace("CREATE INDEX CONCURRENTLY", "CREATE INDEX");
    // The indexes of versions before 5 on columns the completion changes go.
    let drop_deadline = INDEX_DROP_DEADLINE.replace("DROP INDEX CONCURRENTLY", "DROP INDEX");
    let drop_in_progress = INDEX_DROP_IN_PROGRESS.replace("DROP INDEX CONCURRENTLY", "DROP INDEX");
    Ok(MIGRATION_FILES
        .iter()
        .map(|(_, sql)| *sql)
        .chain([
            index.as_str(),
            key_index.as_str(),
            doubt_index.as_str(),
            drop_deadline.as_str(),
            drop_in_progress.as_str(),
        ])
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
