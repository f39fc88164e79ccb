//! `PgAudit`: the inbox's audit trail in a table beside a PostgreSQL store's records.

use crate::{event_key, Audit, AuditEntry, AuditOutcome};
use idem_core::store::async_trait;
use idem_core::store::timestamp_millis;
use idem_core::{Error, Timestamp};
use idem_postgres::sqlx::postgres::PgRow;
use idem_postgres::sqlx::{self, AssertSqlSafe, Row};
use idem_postgres::{store_error, validate_identifier, Param, PgStore};

/// What the audit table's name adds to the store's table name.
const SUFFIX: &str = "_inbox_audit";
/// The names the `.sql` files are written with.
const DEFAULT_TABLE: &str = "idem_records_inbox_audit";
const DEFAULT_SOURCE_INDEX: &str = "idem_records_inbox_audit_source";
const DEFAULT_RECEIVED_INDEX: &str = "idem_records_inbox_audit_received";

/// The audit trail's statements, for one schema and store table.
#[derive(Debug)]
struct Statements {
    table: String,
    index_source: String,
    index_received: String,
    delivered: String,
    settled: String,
    conflicted: String,
    query: String,
    purge: String,
}

impl Statements {
    /// `schema` and `table` (the store's) must name identifiers that
    /// [`names`] accepted. The statements keep their comments: [`PgStore::execute`] removes
    /// them from each it sends; the schema's, sent as they are, carry them to the server,
    /// which ignores them.
    fn new(schema: &str, table: &str) -> Self {
        let sql = |text: &str| for_audit(text, schema, table);
        Self {
            table: sql(include_str!("../../sql/postgres/audit_table.sql")),
            index_source: sql(include_str!("../../sql/postgres/audit_index_source.sql")),
            index_received: sql(include_str!("../../sql/postgres/audit_index_received.sql")),
            delivered: sql(include_str!("../../sql/postgres/audit_delivered.sql")),
            settled: sql(include_str!("../../sql/postgres/audit_settled.sql")),
            conflicted: sql(include_str!("../../sql/postgres/audit_conflicted.sql")),
            query: sql(include_str!("../../sql/postgres/audit_query.sql")),
            purge: sql(include_str!("../../sql/postgres/audit_purge.sql")),
        }
    }
}

/// The audit table's name and its indexes' for the store's `table`, each checked by
/// [`validate_identifier`]: PostgreSQL would cut a name over 63 bytes, and two cut names
/// could meet.
fn names(table: &str) -> Result<[String; 3], Error> {
    let audit = format!("{table}{SUFFIX}");
    let names = [
        audit.clone(),
        format!("{audit}_source"),
        format!("{audit}_received"),
    ];
    for name in &names {
        validate_identifier(name)?;
    }
    Ok(names)
}

/// Puts `"schema"."<table>_inbox_audit"` in place of the table and `"<table>_inbox_audit_…"` in
/// place of the index names (an index lives in its table's schema), in one pass each through
/// marks, so a store table whose name contains the defaults is still put in place once.
fn for_audit(sql: &str, schema: &str, table: &str) -> String {
    const SOURCE: &str = "\u{1}source\u{1}";
    const RECEIVED: &str = "\u{1}received\u{1}";
    const TABLE: &str = "\u{1}table\u{1}";
    let audit = format!("{table}{SUFFIX}");
    sql.replace(DEFAULT_SOURCE_INDEX, SOURCE)
        .replace(DEFAULT_RECEIVED_INDEX, RECEIVED)
        .replace(DEFAULT_TABLE, TABLE)
        .replace(SOURCE, &format!("\"{audit}_source\""))
        .replace(RECEIVED, &format!("\"{audit}_received\""))
        .replace(TABLE, &format!("\"{schema}\".\"{audit}\""))
}

/// The inbox's audit trail ([`Audit`]) in PostgreSQL, in the table `<store table>_inbox_audit`
/// of the store's schema (`public.idem_records_inbox_audit` by default), so two stores keep
/// two trails.
///
/// - One row per (source, event id). The id is the sender's, of any bytes and any length: the
///   row's key is its blake3 digest, and the id itself is kept exactly as sent (`bytea`).
/// - Every operation is one statement on the store's pool ([`PgStore::pool`]), sent as the
///   store sends its own ([`PgStore::execute`]: [`StatementMode`](idem_postgres::StatementMode)),
///   so it also runs behind PgBouncer. A first delivery racing another is decided by the
///   primary key: both count.
/// - Times are `bigint` milliseconds since the Unix epoch: the ones the inbox passes (its
///   clock; the server's is not needed), kept exactly as given and compared as integers, the
///   same as in the SQLite store. A stored value the audit does not write (a negative time, an
///   unknown outcome) is [`Error::CorruptRecord`].
///
/// Cloning is cheap: clones share the pool.
///
/// ```no_run
/// use idem_inbox::{Audit, AuditOutcome, PgAudit};
/// use idem_core::Timestamp;
/// use idem_postgres::PgStore;
/// # async fn demo() -> Result<(), idem_core::Error> {
/// let store = PgStore::connect("postgres://app@localhost/payments").await?;
/// store.migrate().await?;
/// let audit = PgAudit::open(&store).await?; // public.idem_records_inbox_audit
/// audit.delivered("stripe", b"evt_1", Timestamp::from_millis(10)).await?;
/// audit.settled("stripe", b"evt_1", AuditOutcome::Processed, Timestamp::from_millis(15)).await?;
/// let entries = audit.query("stripe", Timestamp::from_millis(0), Timestamp::from_millis(100), 10).await?;
/// assert_eq!(entries[0].outcome, AuditOutcome::Processed);
/// # Ok(())
/// # }
/// ```
///
/// With an inbox: `Inbox::new(idem).with_audit(Arc::new(audit))`.
#[derive(Debug, Clone)]
pub struct PgAudit {
    store: PgStore,
    table: String,
    sql: std::sync::Arc<Statements>,
}

impl PgAudit {
    /// The audit trail of `store`: creates the table `<store table>_inbox_audit` and its
    /// indexes in the store's schema if they do not exist, in one transaction under the store's
    /// migration lock ([`PgStore::lock_migrations`]: several processes may open at once). The
    /// schema must exist (the store's [`migrate`](PgStore::migrate) creates it). The table's
    /// and indexes' names must pass [`validate_identifier`] (a store table of at most 42
    /// bytes), else [`Error::InvalidInput`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), idem_core::Error> {
    /// let store = idem_postgres::PgStore::builder().schema("billing").table("webhooks")
    ///     .connect("postgres://app@localhost/payments").await?;
    /// store.migrate().await?;
    /// let audit = idem_inbox::PgAudit::open(&store).await?;
    /// assert_eq!(audit.table(), "\"billing\".\"webhooks_inbox_audit\"");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn open(store: &PgStore) -> Result<PgAudit, Error> {
        let (schema, table) = (store.schema(), store.table_name());
        let [audit_table, ..] = names(table)?;
        let sql = Statements::new(schema, table);
        let mut tx = store.pool().begin().await.map_err(store_error)?;
        store.lock_migrations(&mut tx).await?;
        for statement in [&sql.table, &sql.index_source, &sql.index_received] {
            sqlx::raw_sql(AssertSqlSafe(statement.clone()))
                .execute(&mut *tx)
                .await
                .map_err(store_error)?;
        }
        tx.commit().await.map_err(store_error)?;
        Ok(PgAudit {
            store: store.clone(),
            table: format!("\"{schema}\".\"{audit_table}\""),
            sql: std::sync::Arc::new(sql),
        })
    }

    /// The schema-qualified table the trail lives in, quoted
    /// (`"public"."idem_records_inbox_audit"`).
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Runs one statement on a connection of the pool; returns how many rows it changed.
    async fn execute(&self, sql: &str, params: &[Param<'_>]) -> Result<u64, Error> {
        let mut conn = self.store.pool().acquire().await.map_err(store_error)?;
        self.store.execute(&mut conn, sql, params).await
    }
}

#[async_trait]
impl Audit for PgAudit {
    async fn delivered(&self, source: &str, event_id: &[u8], at: Timestamp) -> Result<(), Error> {
        let key = event_key(event_id);
        self.execute(
            &self.sql.delivered,
            &[
                Param::Text(source),
                Param::Bytes(&key),
                Param::Bytes(event_id),
                Param::Int(timestamp_millis(at)),
            ],
        )
        .await?;
        Ok(())
    }

    async fn settled(
        &self,
        source: &str,
        event_id: &[u8],
        outcome: AuditOutcome,
        at: Timestamp,
    ) -> Result<(), Error> {
        let key = event_key(event_id);
        self.execute(
            &self.sql.settled,
            &[
                Param::Text(source),
                Param::Bytes(&key),
                Param::Int(outcome.code()),
                Param::Int(timestamp_millis(at)),
            ],
        )
        .await?;
        Ok(())
    }

    async fn conflicted(&self, source: &str, event_id: &[u8], _at: Timestamp) -> Result<(), Error> {
        let key = event_key(event_id);
        self.execute(
            &self.sql.conflicted,
            &[Param::Text(source), Param::Bytes(&key)],
        )
        .await?;
        Ok(())
    }

    async fn query(
        &self,
        source: &str,
        from: Timestamp,
        to: Timestamp,
        limit: usize,
    ) -> Result<Vec<AuditEntry>, Error> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut conn = self.store.pool().acquire().await.map_err(store_error)?;
        let rows = self
            .store
            .fetch_all(
                &mut conn,
                &self.sql.query,
                &[
                    Param::Text(source),
                    Param::Int(timestamp_millis(from)),
                    Param::Int(timestamp_millis(to)),
                    Param::Int(limit),
                ],
            )
            .await?;
        rows.iter().map(|row| decode(row, source)).collect()
    }

    async fn purge(&self, before: Timestamp, limit: usize) -> Result<usize, Error> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let purged = self
            .execute(
                &self.sql.purge,
                &[Param::Int(timestamp_millis(before)), Param::Int(limit)],
            )
            .await?;
        Ok(usize::try_from(purged).unwrap_or(usize::MAX))
    }
}

/// Decodes a row of `audit_query.sql`; anything the audit does not write is `CorruptRecord`.
fn decode(row: &PgRow, source: &str) -> Result<AuditEntry, Error> {
    // Every field is then set from the row.
    let mut entry = AuditEntry::new(source, b"", Timestamp::from_millis(0));
    entry.event_id = row.try_get("event_id").map_err(corrupt_or_store)?;
    entry.first_received = time(column(row, "first_received")?, "first_received")?;
    entry.last_received = time(column(row, "last_received")?, "last_received")?;
    let processed: Option<i64> = row.try_get("processed").map_err(corrupt_or_store)?;
    entry.processed = processed.map(|ms| time(ms, "processed")).transpose()?;
    entry.deliveries = count(column(row, "deliveries")?, "deliveries")?;
    entry.conflicts = count(column(row, "conflicts")?, "conflicts")?;
    let code: i16 = row.try_get("outcome").map_err(corrupt_or_store)?;
    entry.outcome = AuditOutcome::from_code(i64::from(code))
        .ok_or_else(|| corrupt(format!("outcome {code}")))?;
    Ok(entry)
}

fn column(row: &PgRow, name: &str) -> Result<i64, Error> {
    row.try_get(name).map_err(corrupt_or_store)
}

fn time(ms: i64, name: &str) -> Result<Timestamp, Error> {
    u64::try_from(ms)
        .map(Timestamp::from_millis)
        .map_err(|_| corrupt(format!("{name} {ms} before 1970")))
}

fn count(n: i64, name: &str) -> Result<u64, Error> {
    u64::try_from(n).map_err(|_| corrupt(format!("negative {name} {n}")))
}

fn corrupt_or_store(error: sqlx::Error) -> Error {
    match error {
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
            corrupt(format!("column does not decode: {error}"))
        }
        other => store_error(other),
    }
}

fn corrupt(why: String) -> Error {
    Error::CorruptRecord(format!("postgres audit row: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_put_in_place_once() {
        let sql = Statements::new("billing", "idem_records_inbox_audit");
        assert!(sql.table.contains(
            "\nCREATE TABLE IF NOT EXISTS \"billing\".\"idem_records_inbox_audit_inbox_audit\" ("
        ));
        assert!(
            sql.index_source.ends_with(
                "\nCREATE INDEX IF NOT EXISTS \"idem_records_inbox_audit_inbox_audit_source\"\n\
                 ON \"billing\".\"idem_records_inbox_audit_inbox_audit\" (source, first_received, event_key)\n"
            ),
            "{}",
            sql.index_source
        );
        assert_eq!(
            sql.purge
                .matches("\"billing\".\"idem_records_inbox_audit_inbox_audit\"")
                .count(),
            2
        );
        assert!(names(&"t".repeat(42)).is_ok());
        assert!(names(&"t".repeat(43)).is_err());
    }
}
