//! For crates that keep tables of their own beside the store's records (the inbox's audit
//! trail, the outbox): their statements sent as the store sends its own, and the store's
//! migration lock for creating their tables.

use crate::params::{execute, fetch_all, Param};
use crate::sql::strip_comments;
use crate::store::PgStore;
use idem_core::Error;
use sqlx::postgres::PgRow;
use sqlx::PgConnection;

impl PgStore {
    /// Runs `sql`, one statement with `$1..$n` placeholders, with `params` on `conn`: a
    /// connection of the store's [`pool`](Self::pool), or the effect's transaction
    /// (`&mut *tx`). It is sent as the store sends its own statements
    /// ([`StatementMode`](crate::StatementMode)): bound to a prepared statement, or, behind
    /// PgBouncer in transaction mode, with its parameters written into its text as literals.
    /// Returns how many rows it changed; an error is the store's ([`store_error`](crate::store_error)).
    ///
    /// `sql` may carry `--` comments (a `.sql` file's): they are removed to the end of their
    /// line before it is sent, so a `$n` in a comment is never filled in. Write no `--` inside
    /// a string literal of `sql`, and no `$n` that is not a placeholder: bind such values.
    ///
    /// ```no_run
    /// use idem_postgres::{Param, PgStore};
    /// # async fn demo(store: PgStore) -> Result<(), idem_core::Error> {
    /// let mut conn = store.pool().acquire().await.map_err(idem_postgres::store_error)?;
    /// let changed = store
    ///     .execute(
    ///         &mut conn,
    ///         "-- One delivery more. $1 the source.\nUPDATE deliveries SET n = n + 1 WHERE source = $1",
    ///         &[Param::Text("stripe")],
    ///     )
    ///     .await?;
    /// # let _ = changed;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn execute(
        &self,
        conn: &mut PgConnection,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<u64, Error> {
        execute(
            conn,
            self.inner.ops.mode,
            &strip_comments(sql).into(),
            params,
        )
        .await
    }

    /// [`execute`](Self::execute) for a statement that returns rows: its rows.
    ///
    /// ```no_run
    /// use idem_postgres::sqlx::Row;
    /// use idem_postgres::{Param, PgStore};
    /// # async fn demo(store: PgStore) -> Result<(), idem_core::Error> {
    /// let mut conn = store.pool().acquire().await.map_err(idem_postgres::store_error)?;
    /// let rows = store
    ///     .fetch_all(&mut conn, "SELECT n FROM deliveries WHERE source = $1", &[Param::Text("stripe")])
    ///     .await?;
    /// let counts: Vec<i64> = rows.iter().map(|row| row.get("n")).collect();
    /// # let _ = counts;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn fetch_all(
        &self,
        conn: &mut PgConnection,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<PgRow>, Error> {
        fetch_all(
            conn,
            self.inner.ops.mode,
            &strip_comments(sql).into(),
            params,
        )
        .await
    }

    /// Takes the store's migration lock, one migrator per schema across processes, in the
    /// transaction `tx` until it ends: for a crate that creates tables of its own in the
    /// store's [`schema`](Self::schema) (`CREATE TABLE IF NOT EXISTS` can still collide in the
    /// catalog when two processes run it at once), so that it never races another process
    /// doing the same, nor [`migrate`](Self::migrate). Outside a transaction the lock would be
    /// released as soon as it is taken.
    ///
    /// ```no_run
    /// use idem_postgres::{store_error, PgStore};
    /// # async fn demo(store: PgStore) -> Result<(), idem_core::Error> {
    /// let mut tx = store.pool().begin().await.map_err(store_error)?;
    /// store.lock_migrations(&mut tx).await?;
    /// let create = format!("CREATE TABLE IF NOT EXISTS \"{}\".deliveries (source text PRIMARY KEY, n bigint NOT NULL)", store.schema());
    /// store.execute(&mut tx, &create, &[]).await?;
    /// tx.commit().await.map_err(store_error)?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn lock_migrations(&self, tx: &mut PgConnection) -> Result<(), Error> {
        let inner = &self.inner;
        execute(
            tx,
            inner.ops.mode,
            &inner.ops.sql.migration_lock,
            &[Param::Text(&inner.config.schema)],
        )
        .await?;
        Ok(())
    }
}
