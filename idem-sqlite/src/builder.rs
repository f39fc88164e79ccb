//! `SqliteStoreBuilder`: how a `SqliteStore` is configured and opened.

use crate::config::{validate_table_name, SqliteConfig, Synchronous};
use crate::connection::open_all;
use crate::error::BACKEND;
use crate::store::SqliteStore;
use idem_core::{Clock, Error, Field, StoreErrorKind};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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
}

/// Settings for [`SqliteStore`]; see [`SqliteStore::builder`].
///
/// ```
/// use idem_sqlite::{SqliteStore, Synchronous};
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_core::Error> {
/// let dir = tempfile::tempdir().expect("temp dir");
/// let store = SqliteStore::builder(dir.path().join("idem.db"))
///     .table("payments_idem")
///     .readers(2)
///     .busy_timeout(Duration::from_secs(2))
///     .synchronous(Synchronous::Full)
///     .open()
///     .await?;
/// assert_eq!(store.table(), "payments_idem");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct SqliteStoreBuilder {
    pub(crate) config: SqliteConfig,
}

impl SqliteStoreBuilder {
    /// The table name (default `idem_records`), checked by
    /// [`validate_table_name`](crate::validate_table_name).
    pub fn table(mut self, table: &str) -> Self {
        self.config.table = table.to_owned();
        self
    }

    /// How many reader connections answer replays, in-flight duplicates and mismatches (default
    /// 4, at least 1). Writes go through one more connection, the writer, one at a time.
    pub fn readers(mut self, readers: usize) -> Self {
        self.config.readers = readers;
        self
    }

    /// How long a statement waits for another process's write lock (default 5 s).
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.config.busy_timeout = timeout;
        self
    }

    /// SQLite's `synchronous` setting (default [`Synchronous::Normal`]).
    pub fn synchronous(mut self, synchronous: Synchronous) -> Self {
        self.config.synchronous = synchronous;
        self
    }

    /// Where `now` comes from (default: the system clock), for tests. Every process on one
    /// file must read the same clock (C11): one running ahead sees the others' live leases as
    /// passed and takes them over; on the transactional path the holder left behind is fenced
    /// out with its effect rolled back, but an effect outside the database (`run`) runs twice.
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.config.clock = Arc::new(clock);
        self
    }

    /// Whether opening creates a missing file and applies the migrations the table lacks (the
    /// default, `true`). With `false`, opening neither creates nor changes anything: the file
    /// must exist, be in WAL mode (an idem store always puts its file in WAL mode, so another
    /// file is refused, not switched) and the table be at
    /// [`SCHEMA_VERSION`](crate::SCHEMA_VERSION), else opening fails ([`Error::InvalidInput`]
    /// for a file not in WAL mode, [`Error::SchemaVersion`] for a table at another version; for a tool that reads a database an application owns, such as
    /// the `idem` command, which must not upgrade a schema under a running release).
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.config.migrate = migrate;
        self
    }

    /// Opens the store for one-commit executions (C15, [`Policy::one_commit`](
    /// idem_core::Policy::one_commit)): reservation, effect and completion in one transaction,
    /// for effects that live entirely in this database (default `false`).
    ///
    /// The reservation of such an execution stays uncommitted until its effect commits, so
    /// only this store's engine can answer a duplicate meanwhile (in flight or mismatch, at
    /// once, C5): the store must be the only one reserving in its table. It holds the table's
    /// lock file (`<database>.<table>.idem-lock`, beside the database) exclusively while it is
    /// open; opening fails if another store of any process reserves in the table, and any other
    /// store's first reservation fails while this one is open (stores that only read, list or
    /// purge, such as the `idem` command's, are not affected). Reserve through the engine
    /// ([`Idempotency`](idem_core::Idempotency)): its claims are what keeps duplicates from
    /// waiting for the uncommitted reservation.
    ///
    /// ```
    /// use idem_core::{Idempotency, Policy};
    /// use idem_sqlite::SqliteStore;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem_core::Error> {
    /// let dir = tempfile::tempdir().expect("temp dir");
    /// let path = dir.path().join("shop.db");
    /// let store = SqliteStore::builder(&path).one_commit(true).open().await?;
    /// let idem = Idempotency::with_policy(store, Policy::default().one_commit(true))?;
    /// // A second store reserving in the same table is refused while this one is open.
    /// let other = SqliteStore::builder(&path).one_commit(true).open().await;
    /// assert!(other.is_err());
    /// # drop(idem);
    /// # Ok(())
    /// # }
    /// ```
    pub fn one_commit(mut self, one_commit: bool) -> Self {
        self.config.one_commit = one_commit;
        self
    }

    /// Opens the connections and applies the schema, on Tokio's blocking pool.
    pub async fn open(self) -> Result<SqliteStore, Error> {
        tokio::task::spawn_blocking(move || self.open_blocking())
            .await
            .map_err(|e| {
                Error::store(
                    BACKEND,
                    StoreErrorKind::Unavailable,
                    format!("opening the SQLite store did not finish: {e}"),
                )
            })?
    }

    /// Opens the connections and applies the schema on the calling thread (for programs without
    /// an async runtime, or before one starts).
    pub fn open_blocking(self) -> Result<SqliteStore, Error> {
        let config = self.config;
        validate_table_name(&config.table)?;
        if config.readers == 0 {
            return Err(Error::invalid(
                Field::Config,
                "at least one reader connection",
            ));
        }
        let (writer, readers) = open_all(&config)?;
        SqliteStore::from_parts(config, writer, readers)
    }
}
