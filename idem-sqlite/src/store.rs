//! `SqliteStore`: the embedded store.

use crate::config::{validate_table_name, SqliteConfig, Synchronous};
use crate::migrate::migrate;
use crate::ops;
use crate::pool::Pool;
use crate::sql::Statements;
use idem_core::{
    async_trait, Begin, Clock, Error, Field, Lease, Record, RecordId, Request, Store,
    StoredResponse, Timestamp,
};
use rusqlite::{Connection, Transaction};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An idem [`Store`] in a SQLite file, with completion inside the caller's transaction.
///
/// - The reservation commits on its own, before the effect, with one compare-and-set statement
///   (C4); replays and in-flight answers read without taking the write lock (C5).
/// - [`complete_in`](Self::complete_in) writes the completion in the transaction of the business
///   effect, so both commit or vanish together (C6). The closure form is
///   [`SqliteIdempotency::run_in_transaction`](crate::SqliteIdempotency::run_in_transaction).
/// - Every rusqlite call runs on Tokio's blocking pool with a pooled connection, one hop per
///   operation, never on the async executor: the store is used from within a Tokio runtime. The database is in WAL mode with a busy timeout.
/// - Time is the process clock (C11), injectable with [`SqliteStoreBuilder::clock`].
///
/// Cloning is cheap: clones share the connections.
///
/// ```
/// use idem_sqlite::SqliteStore;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_core::Error> {
/// let dir = tempfile::tempdir().expect("temp dir");
/// let store = SqliteStore::builder(dir.path().join("idem.db"))
///     .table("payments_idem")
///     .connections(2)
///     .open()
///     .await?;
/// assert_eq!(store.table(), "payments_idem");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: Pool,
    sql: Statements,
    config: SqliteConfig,
}

/// Settings for [`SqliteStore`]; see [`SqliteStore::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct SqliteStoreBuilder {
    config: SqliteConfig,
}

impl SqliteStoreBuilder {
    /// The table name (default `idem_records`), checked by
    /// [`validate_table_name`](crate::validate_table_name).
    pub fn table(mut self, table: &str) -> Self {
        self.config.table = table.to_owned();
        self
    }

    /// How many connections the store keeps (default 4, at least 1): at most this many of its
    /// calls run at once; the others wait asynchronously for a connection.
    pub fn connections(mut self, connections: usize) -> Self {
        self.config.connections = connections;
        self
    }

    /// How long a statement waits for another connection's write lock (default 5 s).
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.config.busy_timeout = timeout;
        self
    }

    /// SQLite's `synchronous` setting (default [`Synchronous::Normal`]).
    pub fn synchronous(mut self, synchronous: Synchronous) -> Self {
        self.config.synchronous = synchronous;
        self
    }

    /// Where `now` comes from (default: the system clock).
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.config.clock = Arc::new(clock);
        self
    }

    /// Opens the connections and applies the schema, on Tokio's blocking pool.
    pub async fn open(self) -> Result<SqliteStore, Error> {
        tokio::task::spawn_blocking(move || self.open_blocking())
            .await
            .map_err(|e| {
                Error::unavailable(format!("opening the SQLite store did not finish: {e}"))
            })?
    }

    /// Opens the connections and applies the schema on the calling thread (for programs without
    /// an async runtime, or before one starts).
    pub fn open_blocking(self) -> Result<SqliteStore, Error> {
        let config = self.config;
        validate_table_name(&config.table)?;
        if config.connections == 0 {
            return Err(Error::invalid(Field::Config, "at least one connection"));
        }
        let connections = open_connections(&config)?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                pool: Pool::new(connections),
                sql: Statements::for_table(&config.table),
                config,
            }),
        })
    }
}

/// Opens the first connection, brings the schema up to date, then opens the others. SQLite
/// answers "busy" without waiting when another process switches a new file to WAL at the same
/// moment, so a busy open is retried until the busy timeout has passed.
fn open_connections(config: &SqliteConfig) -> Result<Vec<Connection>, Error> {
    let started = Instant::now();
    loop {
        let attempt = || -> Result<Vec<Connection>, Error> {
            let mut first = connect(config)?;
            migrate(&mut first, &config.table)?;
            let mut connections = vec![first];
            for _ in 1..config.connections {
                connections.push(connect(config)?);
            }
            Ok(connections)
        };
        match attempt() {
            Err(error) if is_busy(&error) && started.elapsed() < config.busy_timeout => {
                std::thread::sleep(Duration::from_millis(10));
            }
            result => return result,
        }
    }
}

fn is_busy(error: &Error) -> bool {
    match error {
        Error::StoreUnavailable(source) => matches!(
            source
                .downcast_ref::<rusqlite::Error>()
                .and_then(rusqlite::Error::sqlite_error_code),
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
        ),
        _ => false,
    }
}

/// Opens one connection with the store's settings: WAL, busy timeout, synchronous.
fn connect(config: &SqliteConfig) -> Result<Connection, Error> {
    let conn = Connection::open(&config.path).map_err(Error::unavailable)?;
    conn.busy_timeout(config.busy_timeout)
        .map_err(Error::unavailable)?;
    // Switching the journal mode needs an exclusive lock, so it is only asked for when the
    // file is not in WAL mode yet: opening must not fail while another process writes.
    let journal_mode = |sql: &str| -> Result<String, Error> {
        conn.query_row(sql, [], |row| row.get(0))
            .map_err(Error::unavailable)
    };
    let mut mode = journal_mode("PRAGMA journal_mode")?;
    if !mode.eq_ignore_ascii_case("wal") {
        mode = journal_mode("PRAGMA journal_mode = WAL")?;
    }
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::invalid(
            Field::Config,
            format!("{} cannot use WAL (journal mode {mode}); an in-memory database is not shared between connections", config.path.display()),
        ));
    }
    conn.pragma_update(None, "synchronous", config.synchronous.pragma_value())
        .map_err(Error::unavailable)?;
    Ok(conn)
}

impl SqliteStore {
    /// Starts configuring a store on the SQLite file at `path` (created if missing).
    pub fn builder(path: impl Into<PathBuf>) -> SqliteStoreBuilder {
        SqliteStoreBuilder {
            config: SqliteConfig::new(path.into()),
        }
    }

    /// Opens a store at `path` with the default settings.
    pub async fn open(path: impl Into<PathBuf>) -> Result<Self, Error> {
        Self::builder(path).open().await
    }

    /// The table the records live in.
    pub fn table(&self) -> &str {
        &self.inner.config.table
    }

    /// Opens a new connection to the store's database with the store's settings (WAL, busy
    /// timeout, synchronous), for a program's own business transactions.
    pub fn connect(&self) -> Result<Connection, Error> {
        connect(&self.inner.config)
    }

    /// Runs `work` on one of the store's connections, off the async executor: for a program's
    /// own SQL (schema, reads) on the same database.
    pub async fn call<T, F>(&self, work: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Connection) -> T + Send + 'static,
        T: Send + 'static,
    {
        self.inner.pool.call(work).await
    }

    /// Completes the record **inside the caller's transaction** (C6): commit `tx` and the
    /// effect and the completion are both there; roll it back and neither is.
    /// [`Error::LeaseLost`] means another attempt holds the record: roll `tx` back.
    ///
    /// `response` is stored as given: pass it through
    /// [`Idempotency::prepare`](idem_core::Idempotency::prepare) first, or use
    /// [`SqliteIdempotency::complete_in`](crate::SqliteIdempotency::complete_in) which does.
    /// This is a blocking call: run it where the transaction runs (a blocking thread).
    pub fn complete_in(
        &self,
        tx: &Transaction<'_>,
        lease: &Lease,
        response: &StoredResponse,
        retain_for: Duration,
    ) -> Result<(), Error> {
        let now = self.inner.config.clock.now();
        ops::complete(tx, &self.inner.sql, now, lease, response, retain_for)
    }

    /// Releases the record on `conn` (used after a rolled-back effect).
    pub(crate) fn release_on(&self, conn: &Connection, lease: &Lease) -> Result<(), Error> {
        ops::release(conn, &self.inner.sql, lease)
    }

    /// Runs one operation of `ops` on a pooled connection, with the store's statements and clock.
    async fn on_connection<T, F>(&self, work: F) -> Result<T, Error>
    where
        F: FnOnce(&Connection, &Inner) -> Result<T, Error> + Send + 'static,
        T: Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        self.inner.pool.call(move |conn| work(conn, &inner)).await?
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn reserve(&self, request: &Request, lease_for: Duration) -> Result<Begin, Error> {
        let request = request.clone();
        self.on_connection(move |conn, inner| {
            ops::reserve(
                conn,
                &inner.sql,
                inner.config.clock.as_ref(),
                &request,
                lease_for,
            )
        })
        .await
    }

    async fn complete(
        &self,
        lease: &Lease,
        response: &StoredResponse,
        retain_for: Duration,
    ) -> Result<(), Error> {
        let (lease, response) = (lease.clone(), response.clone());
        self.on_connection(move |conn, inner| {
            let now = inner.config.clock.now();
            ops::complete(conn, &inner.sql, now, &lease, &response, retain_for)
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<(), Error> {
        let lease = lease.clone();
        self.on_connection(move |conn, inner| ops::release(conn, &inner.sql, &lease))
            .await
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<Timestamp, Error> {
        let lease = lease.clone();
        self.on_connection(move |conn, inner| {
            ops::renew(
                conn,
                &inner.sql,
                inner.config.clock.now(),
                &lease,
                lease_for,
            )
        })
        .await
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, Error> {
        self.on_connection(move |conn, inner| {
            ops::purge_expired(conn, &inner.sql, inner.config.clock.now(), limit)
        })
        .await
    }

    async fn lookup(&self, id: &RecordId) -> Result<Option<Record>, Error> {
        let id = id.clone();
        self.on_connection(move |conn, inner| ops::select(conn, &inner.sql, &id))
            .await
    }
}
