//! `SqliteAudit`: the inbox's audit trail in a table beside a SQLite store's records.

use crate::{event_key, Audit, AuditEntry, AuditOutcome};
use idem_core::store::{async_trait, timestamp_millis as millis};
use idem_core::{Error, StoreErrorKind, Timestamp};
use idem_sqlite::rusqlite::types::ValueRef;
use idem_sqlite::rusqlite::{self, params, Connection, Row, TransactionBehavior};
use idem_sqlite::{store_error, validate_table_name, SqliteStore};
use std::sync::Arc;
use tokio::sync::Mutex as AsyncMutex;

/// What the audit table's name adds to the store's table name.
const SUFFIX: &str = "_inbox_audit";
/// The audit table's name the `.sql` files are written with (the store's default table,
/// `idem_records`, and [`SUFFIX`]); its indexes' names begin with it.
const DEFAULT_TABLE: &str = "idem_records_inbox_audit";
/// The backend name of idem-sqlite's errors, for a read that did not finish.
const BACKEND: &str = "sqlite";

/// The audit trail's statements, with the audit table's name in place of the default.
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
    /// `table` is the store's table, already validated.
    fn for_table(table: &str) -> Self {
        let audit = format!("{table}{SUFFIX}");
        let sql = |text: &str| text.replace(DEFAULT_TABLE, &audit);
        Self {
            table: sql(include_str!("../../sql/sqlite/audit_table.sql")),
            index_source: sql(include_str!("../../sql/sqlite/audit_index_source.sql")),
            index_received: sql(include_str!("../../sql/sqlite/audit_index_received.sql")),
            delivered: sql(include_str!("../../sql/sqlite/audit_delivered.sql")),
            settled: sql(include_str!("../../sql/sqlite/audit_settled.sql")),
            conflicted: sql(include_str!("../../sql/sqlite/audit_conflicted.sql")),
            query: sql(include_str!("../../sql/sqlite/audit_query.sql")),
            purge: sql(include_str!("../../sql/sqlite/audit_purge.sql")),
        }
    }
}

/// The inbox's audit trail ([`Audit`]) in the store's SQLite file, in the table
/// `<store table>_inbox_audit` (`idem_records_inbox_audit` by default), so two stores on one
/// file keep two trails.
///
/// - One row per (source, event id). The id is the sender's, of any bytes and any length: the
///   row's key is its blake3 digest, and the id itself is kept exactly as sent.
/// - Every write is one statement on the store's writer, queued with the store's own writes
///   ([`SqliteStore::try_call`]); reads run on a connection of the audit's own
///   ([`SqliteStore::connect`]), so a long query never holds the writer nor the store's
///   readers. Neither runs on the async executor.
/// - Times are the ones the inbox passes, in ms since the Unix epoch; a stored value that is
///   not what the audit writes (a negative time, an unknown outcome) is
///   [`Error::CorruptRecord`].
///
/// Cloning is cheap: clones share the reading connection.
///
/// ```
/// use idem_inbox::{Audit, AuditOutcome, SqliteAudit};
/// use idem_core::Timestamp;
/// use idem_sqlite::SqliteStore;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_core::Error> {
/// # let dir = tempfile::tempdir().expect("temp dir");
/// let store = SqliteStore::open(dir.path().join("idem.db")).await?;
/// let audit = SqliteAudit::open(&store).await?; // table idem_records_inbox_audit
/// audit.delivered("stripe", b"evt_1", Timestamp::from_millis(10)).await?;
/// audit.delivered("stripe", b"evt_1", Timestamp::from_millis(20)).await?;
/// audit.settled("stripe", b"evt_1", AuditOutcome::Processed, Timestamp::from_millis(15)).await?;
/// let entries = audit.query("stripe", Timestamp::from_millis(0), Timestamp::from_millis(100), 10).await?;
/// assert_eq!((entries[0].deliveries, entries[0].outcome), (2, AuditOutcome::Processed));
/// # Ok(())
/// # }
/// ```
///
/// With an inbox: `Inbox::new(idem).with_audit(Arc::new(audit))`.
#[derive(Debug, Clone)]
pub struct SqliteAudit {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: SqliteStore,
    table: String,
    sql: Statements,
    /// The reading connection, opened at the first read (and again after a read panicked).
    reader: Arc<AsyncMutex<Option<Connection>>>,
}

impl SqliteAudit {
    /// The audit trail of `store`: creates the table `<store table>_inbox_audit` and its
    /// indexes if they do not exist, on the store's writer. The table's name must pass
    /// [`validate_table_name`] (a store table of at most 51 bytes), else
    /// [`Error::InvalidInput`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem_core::Error> {
    /// # let dir = tempfile::tempdir().expect("temp dir");
    /// let store = idem_sqlite::SqliteStore::builder(dir.path().join("idem.db")).table("webhooks").open().await?;
    /// let audit = idem_inbox::SqliteAudit::open(&store).await?;
    /// assert_eq!(audit.table(), "webhooks_inbox_audit");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn open(store: &SqliteStore) -> Result<SqliteAudit, Error> {
        let table = format!("{}{SUFFIX}", store.table());
        validate_table_name(&table)?;
        let sql = Statements::for_table(store.table());
        let schema = [
            sql.table.clone(),
            sql.index_source.clone(),
            sql.index_received.clone(),
        ];
        // IMMEDIATE: take the write lock first, so a concurrent opener waits for it (busy
        // timeout) instead of failing to upgrade a read.
        store
            .try_call(move |db| {
                let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
                for statement in &schema {
                    tx.execute(statement, [])?;
                }
                tx.commit()
            })
            .await?;
        Ok(SqliteAudit {
            inner: Arc::new(Inner {
                store: store.clone(),
                table,
                sql,
                reader: Arc::new(AsyncMutex::new(None)),
            }),
        })
    }

    /// The table the trail lives in.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// Runs one write on the store's writer, off the executor; returns how many rows changed.
    async fn write<F>(&self, work: F) -> Result<usize, Error>
    where
        F: FnOnce(&Connection, &Statements) -> rusqlite::Result<usize> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        self.inner
            .store
            .try_call(move |db| work(db, &inner.sql))
            .await
    }

    /// Runs `work` on the reading connection, on the blocking pool. A connection whose read
    /// panicked is dropped; the next read opens another.
    async fn read<T, F>(&self, work: F) -> Result<T, Error>
    where
        F: FnOnce(&Connection, &Inner) -> Result<T, Error> + Send + 'static,
        T: Send + 'static,
    {
        let mut slot = Arc::clone(&self.inner.reader).lock_owned().await;
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            let conn = match slot.take() {
                Some(conn) => conn,
                None => inner.store.connect()?,
            };
            let result = work(&conn, &inner);
            *slot = Some(conn);
            result
        })
        .await
        .map_err(|e| {
            Error::store(
                BACKEND,
                StoreErrorKind::Unavailable,
                format!("SQLite audit read did not finish: {e}"),
            )
        })?
    }
}

#[async_trait]
impl Audit for SqliteAudit {
    async fn delivered(&self, source: &str, event_id: &[u8], at: Timestamp) -> Result<(), Error> {
        let (source, key, id) = (source.to_owned(), event_key(event_id), event_id.to_vec());
        self.write(move |db, sql| {
            db.prepare_cached(&sql.delivered)?
                .execute(params![source, &key[..], id, millis(at)])
        })
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
        let (source, key) = (source.to_owned(), event_key(event_id));
        self.write(move |db, sql| {
            db.prepare_cached(&sql.settled)?.execute(params![
                source,
                &key[..],
                outcome.code(),
                millis(at)
            ])
        })
        .await?;
        Ok(())
    }

    async fn conflicted(&self, source: &str, event_id: &[u8], _at: Timestamp) -> Result<(), Error> {
        let (source, key) = (source.to_owned(), event_key(event_id));
        self.write(move |db, sql| {
            db.prepare_cached(&sql.conflicted)?
                .execute(params![source, &key[..]])
        })
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
        let source = source.to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(move |conn, inner| {
            let mut stmt = conn.prepare_cached(&inner.sql.query).map_err(store_error)?;
            let mut rows = stmt
                .query(params![source, millis(from), millis(to), limit])
                .map_err(store_error)?;
            let mut found = Vec::new();
            while let Some(row) = rows.next().map_err(store_error)? {
                found.push(decode(row, &source)?);
            }
            Ok(found)
        })
        .await
    }

    async fn purge(&self, before: Timestamp, limit: usize) -> Result<usize, Error> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.write(move |db, sql| {
            db.prepare_cached(&sql.purge)?
                .execute(params![millis(before), limit])
        })
        .await
    }
}

/// Decodes a row of `audit_query.sql`; anything the audit does not write is `CorruptRecord`.
fn decode(row: &Row<'_>, source: &str) -> Result<AuditEntry, Error> {
    // Every field is then set from the row.
    let mut entry = AuditEntry::new(source, b"", Timestamp::from_millis(0));
    entry.event_id = match value(row, 0)? {
        ValueRef::Blob(bytes) => bytes.to_vec(),
        other => {
            return Err(corrupt(format!(
                "event_id column holds {:?}",
                other.data_type()
            )))
        }
    };
    entry.first_received = time(integer(row, 1, "first_received")?, "first_received")?;
    entry.last_received = time(integer(row, 2, "last_received")?, "last_received")?;
    entry.processed = match value(row, 3)? {
        ValueRef::Null => None,
        ValueRef::Integer(ms) => Some(time(ms, "processed")?),
        other => {
            return Err(corrupt(format!(
                "processed column holds {:?}",
                other.data_type()
            )))
        }
    };
    entry.deliveries = count(integer(row, 4, "deliveries")?, "deliveries")?;
    entry.conflicts = count(integer(row, 5, "conflicts")?, "conflicts")?;
    let code = integer(row, 6, "outcome")?;
    entry.outcome =
        AuditOutcome::from_code(code).ok_or_else(|| corrupt(format!("outcome {code}")))?;
    Ok(entry)
}

fn value<'r>(row: &'r Row<'_>, index: usize) -> Result<ValueRef<'r>, Error> {
    row.get_ref(index).map_err(store_error)
}

fn integer(row: &Row<'_>, index: usize, name: &str) -> Result<i64, Error> {
    match value(row, index)? {
        ValueRef::Integer(n) => Ok(n),
        other => Err(corrupt(format!(
            "{name} column holds {:?}",
            other.data_type()
        ))),
    }
}

fn time(ms: i64, name: &str) -> Result<Timestamp, Error> {
    u64::try_from(ms)
        .map(Timestamp::from_millis)
        .map_err(|_| corrupt(format!("negative {name} {ms}")))
}

fn count(n: i64, name: &str) -> Result<u64, Error> {
    u64::try_from(n).map_err(|_| corrupt(format!("negative {name} {n}")))
}

fn corrupt(why: String) -> Error {
    Error::CorruptRecord(format!("sqlite audit row: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan of one of the statements, its details joined.
    fn plan(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> String {
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .expect("explain");
        let details = stmt
            .query_map(params, |row| row.get::<_, String>(3))
            .expect("plan")
            .collect::<Result<Vec<_>, _>>()
            .expect("plan rows");
        details.join(" | ")
    }

    /// A page of a source's entries is read in its order from the source index (no sort); a
    /// purge batch is found through the first_received index (no scan, no sort).
    #[test]
    fn query_and_purge_read_their_indexes() {
        let conn = Connection::open_in_memory().expect("db");
        let sql = Statements::for_table("webhooks");
        for statement in [&sql.table, &sql.index_source, &sql.index_received] {
            conn.execute(statement, []).expect("schema");
        }
        let query = plan(&conn, &sql.query, params!["s", 0, 9, 5]);
        assert!(
            query.contains("INDEX webhooks_inbox_audit_source") && !query.contains("TEMP B-TREE"),
            "{query}"
        );
        let purge = plan(&conn, &sql.purge, params![9, 5]);
        assert!(
            purge.contains("INDEX webhooks_inbox_audit_received")
                && !purge.contains("TEMP B-TREE")
                && !purge.contains("SCAN"),
            "{purge}"
        );
    }
}
