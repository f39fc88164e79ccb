//! `SqliteStore`: the embedded store, and its `Store` implementation.

use crate::config::SqliteConfig;
use crate::connection::{connect, waiting_until};
use crate::error::store_error;
use crate::opened::OpenedFiles;
use crate::ops;
use crate::pool::{Decide, Pool};
use crate::process_lock::ProcessLock;
use crate::sql::Statements;
use idem_core::store::Deadline;
use idem_core::store::Reconciliation;
use idem_core::store::{
    async_trait, Acquire, Capabilities, Claim, Completion, Lease, Record, Reserved, Resolution,
};
use idem_core::Operation;
use idem_core::{Error, FencingToken, RecordId, Request, Store, Timestamp};
use idem_ops::Holder;
use idem_ops::{Inspected, ListQuery, Operator, Page, Stats};
use rusqlite::{Connection, Transaction};
use std::sync::Arc;
use std::time::Duration;

/// An idem [`Store`] in a SQLite file, with completion inside the caller's transaction.
///
/// - The reservation commits on its own, before the effect, with one compare-and-set statement
///   (C4); with one commit (C15, [`SqliteStoreBuilder::one_commit`](crate::SqliteStoreBuilder::one_commit) and
///   a request made [`with_one_commit`](idem_core::Request::with_one_commit)`(true)`) it is the
///   first statement of the effect's transaction instead. Writes go through one writer connection, owned by a thread of its own that takes the
///   queued writes back to back; replays, in-flight answers and mismatches are read on reader
///   connections (each on a thread of its own) that no writer holds, so they never wait for one
///   (C5). A reservation is decided where its statement runs: on the writer at once when it is
///   idle, else on a reader, which answers it or hands it to the writer itself.
/// - [`complete_in`](Self::complete_in) writes the engine's [`Completion`] in the transaction of
///   the business effect, so both commit or vanish together (C6). The closure form is
///   [`SqliteIdempotency::run_in_transaction`](crate::SqliteIdempotency::run_in_transaction):
///   the reservation and the effect's transaction in one thread hop.
/// - Every rusqlite call runs on the store's own threads, never on the async executor: a caller
///   queues its call and awaits the reply, one hop per call. A call whose caller's future is
///   dropped before it starts is not run; one that started runs to its end. The database is in
///   WAL mode with a busy timeout.
/// - Time is the process clock (C11), injectable with [`SqliteStoreBuilder::clock`](crate::SqliteStoreBuilder::clock).
///
/// Cloning is cheap: clones share the connections.
///
/// ```
/// use idem_sqlite::SqliteStore;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_core::Error> {
/// let dir = tempfile::tempdir().expect("temp dir");
/// let store = SqliteStore::open(dir.path().join("idem.db")).await?;
/// store.try_call(|db| db.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY)")).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pub(crate) inner: Arc<Inner>,
    /// The holder this handle's reservations record, in its stored form (formatted once).
    holder: Arc<str>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) pool: Pool,
    /// Whether this store may reserve in its table, and whether it holds it for one commit.
    pub(crate) lock: ProcessLock,
    pub(crate) sql: Statements,
    pub(crate) config: Arc<SqliteConfig>,
}

impl SqliteStore {
    pub(crate) fn from_parts(
        mut config: SqliteConfig,
        writer: Connection,
        readers: Vec<Connection>,
    ) -> Result<Self, Error> {
        // The file SQLite opened, for a store named by a `file:` URI: the process lock is that
        // file's, as for its path.
        let opened = writer
            .path()
            .filter(|file| !file.is_empty())
            .map(std::path::PathBuf::from);
        let read_only = writer.is_readonly(rusqlite::MAIN_DB).unwrap_or(false);
        let lock = ProcessLock::open(&config, opened.as_deref(), read_only)?;
        config.opened = opened.as_deref().and_then(OpenedFiles::of);
        let config = Arc::new(config);
        Ok(Self {
            inner: Arc::new(Inner {
                pool: Pool::new(writer, readers, Arc::clone(&config))?,
                lock,
                sql: Statements::for_table(&config.table),
                config,
            }),
            holder: Arc::from(Holder::this_process_encoded()),
        })
    }

    /// A handle on the same file and connections whose reservations record `holder` for
    /// operators instead of [`Holder::this_process`] (a test stands for another process with
    /// it). A completion inside your transaction (`run_in_transaction`) records this process.
    ///
    /// ```
    /// # async fn demo() -> Result<(), idem_core::Error> {
    /// use idem_ops::Holder;
    /// let store = idem_sqlite::SqliteStore::open("records.db").await?;
    /// let _other = store.with_holder(&Holder::new("web-2", 7, 1, None));
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_holder(&self, holder: &Holder) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            holder: Arc::from(holder.encode()),
        }
    }

    /// The table the records live in.
    pub fn table(&self) -> &str {
        &self.inner.config.table
    }

    /// Opens a new connection to the store's database with the store's settings (WAL, busy
    /// timeout, synchronous), for a program's own work outside the store's queue.
    pub fn connect(&self) -> Result<Connection, Error> {
        connect(&self.inner.config)
    }

    /// Runs `work` on the store's writer connection, on its thread, after the writes queued
    /// before it: for a program's own SQL on the same database (schema, business
    /// transactions). A transaction `work` leaves open is rolled back afterwards. Not run if
    /// the returned future is dropped before `work` starts; once started, it runs to its end.
    pub async fn call<T, F>(&self, work: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Connection) -> T + Send + 'static,
        T: Send + 'static,
    {
        self.inner.pool.write(work).await
    }

    /// Runs `work` on one of the store's reader connections, on its thread, never on the
    /// writer: for a program's own reads of the same database (WAL: a reader neither waits for
    /// the writer nor blocks it). The readers are the ones the store answers replays on, so keep
    /// such reads short. Not run if the returned future is dropped before `work` starts (a
    /// timeout around it, say); once started, it runs to its end.
    ///
    /// ```
    /// use idem_sqlite::SqliteStore;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem_core::Error> {
    /// # let dir = tempfile::tempdir().expect("temp dir");
    /// let store = SqliteStore::open(dir.path().join("shop.db")).await?;
    /// store.try_call(|db| db.execute_batch("CREATE TABLE charges (id INTEGER PRIMARY KEY)")).await?;
    /// let count: i64 = store
    ///     .read(|db| db.query_row("SELECT COUNT(*) FROM charges", [], |row| row.get(0)))
    ///     .await?
    ///     .expect("count");
    /// assert_eq!(count, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn read<T, F>(&self, work: F) -> Result<T, Error>
    where
        F: FnOnce(&Connection) -> T + Send + 'static,
        T: Send + 'static,
    {
        self.inner.pool.read(move |conn| work(conn)).await
    }

    /// [`call`](Self::call) for work that returns rusqlite's `Result`: its error becomes an
    /// [`Error::Store`] that keeps its nature (busy, missing table...), so one `?` does.
    pub async fn try_call<T, F>(&self, work: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        self.call(work).await?.map_err(store_error)
    }

    /// Completes the record **inside the caller's transaction** (C6): commit `tx` and the
    /// effect and the completion are both there; roll it back and neither is.
    /// [`Error::LeaseLost`] means another attempt holds the record: roll `tx` back.
    ///
    /// The [`Completion`] comes from the engine
    /// ([`Idempotency::completion`](idem_core::Idempotency::completion)), so it passed the
    /// policy's header filter. This is a blocking call: run it where the transaction runs (on
    /// the store's writer, inside [`call`](Self::call)).
    pub fn complete_in(&self, tx: &Transaction<'_>, completion: &Completion) -> Result<(), Error> {
        let now = self.inner.config.clock.now();
        ops::complete(tx, &self.inner.sql, now, completion)
    }

    /// Runs one fenced write of `ops` on the writer, another process's write lock waited for
    /// until `deadline` at most ([`waiting_until`]).
    async fn on_writer<T, F>(&self, deadline: Deadline, work: F) -> Result<T, Error>
    where
        F: FnOnce(&Connection, &Inner) -> Result<T, Error> + Send + 'static,
        T: Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        let until = deadline.instant();
        self.call(move |conn| waiting_until(conn, &inner.config, until, |conn| work(conn, &inner)))
            .await?
    }
}

/// A reservation step, made where its statement runs (C5): a record found on a reader when the
/// writer is busy, never queueing for the writer to report it; no record: on the writer, the
/// record or a fresh one.
struct Reserving {
    inner: Arc<Inner>,
    request: Request,
    token: FencingToken,
    lease_for: Duration,
    holder: Arc<str>,
    /// The call's deadline ([`waiting_until`]).
    until: std::time::Instant,
}

impl Decide for Reserving {
    type Output = Result<Reserved, Error>;

    fn answer(self, conn: &mut Connection) -> Result<Self::Output, Self> {
        let now = self.inner.config.clock.now();
        match ops::found(conn, &self.inner.sql, &self.request, now) {
            Ok(Some(found)) => Ok(Ok(found)),
            Ok(None) => Err(self),
            Err(error) => Ok(Err(error)),
        }
    }

    fn write(self, conn: &mut Connection) -> Self::Output {
        let inner = &self.inner;
        waiting_until(conn, &inner.config, self.until, |conn| {
            ops::reserve_step(
                conn,
                &inner.sql,
                inner.config.clock.now(),
                &self.request,
                self.token,
                self.lease_for,
                &self.holder,
            )
        })
    }
}

#[async_trait]
impl Store for SqliteStore {
    /// The address of what this store and its clones share (C9: one registry of live executions
    /// for every engine over them).
    fn identity(&self) -> Option<usize> {
        Some(Arc::as_ptr(&self.inner).cast::<()>() as usize)
    }

    /// A file: nothing it acknowledged is lost while it runs. `None` on a clock of its own
    /// (a retention counted by it is not the process's).
    fn generation(&self) -> Option<u64> {
        self.inner.config.clock.is_system().then_some(0)
    }

    /// A store opened for one commit has a process gate: it alone reserves in its table, so
    /// the engine's in-process claims keep every duplicate of a one-commit execution away from
    /// its uncommitted reservation (C5, C15).
    fn capabilities(&self) -> Capabilities {
        Capabilities::default().with_process_gate(self.inner.lock.one_commit())
    }

    async fn reserve(&self, claim: &Claim<'_>, deadline: Deadline) -> Result<Reserved, Error> {
        deadline
            .bound(Operation::Reserve, async {
                self.inner.lock.reserving()?;
                let reserving = Reserving {
                    inner: Arc::clone(&self.inner),
                    request: claim.request().clone(),
                    token: claim.token(),
                    lease_for: claim.lease_for(),
                    holder: Arc::clone(&self.holder),
                    until: deadline.instant(),
                };
                self.inner.pool.decide(reserving, None).await?
            })
            .await
    }

    async fn replace(
        &self,
        claim: &Claim<'_>,
        acquire: Acquire,
        deadline: Deadline,
    ) -> Result<Reserved, Error> {
        deadline
            .bound(Operation::Reserve, async {
                self.inner.lock.reserving()?;
                let (request, token, lease_for) =
                    (claim.request().clone(), claim.token(), claim.lease_for());
                let holder = Arc::clone(&self.holder);
                self.on_writer(deadline, move |conn, inner| {
                    let now = inner.config.clock.now();
                    ops::replace_step(
                        conn, &inner.sql, now, &request, token, lease_for, acquire, &holder,
                    )
                })
                .await
            })
            .await
    }

    /// On a reader, which no writer ever holds: the committed record.
    async fn read(&self, request: &Request, deadline: Deadline) -> Result<Reserved, Error> {
        deadline
            .bound(Operation::Lookup, async {
                let (inner, request) = (Arc::clone(&self.inner), request.clone());
                self.inner
                    .pool
                    .read(move |conn| {
                        let now = inner.config.clock.now();
                        Ok(ops::found(conn, &inner.sql, &request, now)?.unwrap_or(Reserved::Lost))
                    })
                    .await?
            })
            .await
    }

    async fn complete(&self, completion: &Completion, deadline: Deadline) -> Result<(), Error> {
        deadline
            .bound(Operation::Complete, async {
                let completion = completion.clone();
                self.on_writer(deadline, move |conn, inner| {
                    ops::complete(conn, &inner.sql, inner.config.clock.now(), &completion)
                })
                .await
            })
            .await
    }

    async fn release(&self, lease: &Lease, deadline: Deadline) -> Result<(), Error> {
        deadline
            .bound(Operation::Release, async {
                let lease = lease.clone();
                self.on_writer(deadline, move |conn, inner| {
                    ops::release(conn, &inner.sql, &lease)
                })
                .await
            })
            .await
    }

    async fn renew(
        &self,
        lease: &Lease,
        lease_for: Duration,
        deadline: Deadline,
    ) -> Result<Timestamp, Error> {
        deadline
            .bound(Operation::Renew, async {
                let lease = lease.clone();
                self.on_writer(deadline, move |conn, inner| {
                    ops::renew(
                        conn,
                        &inner.sql,
                        inner.config.clock.now(),
                        &lease,
                        lease_for,
                    )
                })
                .await
            })
            .await
    }

    async fn purge_expired(&self, limit: usize, deadline: Deadline) -> Result<usize, Error> {
        deadline
            .bound(Operation::Purge, async {
                self.on_writer(deadline, move |conn, inner| {
                    ops::purge_expired(conn, &inner.sql, inner.config.clock.now(), limit)
                })
                .await
            })
            .await
    }

    /// On the writer, in one `IMMEDIATE` transaction: the fenced change and its audit entry
    /// commit together, or nothing is written (store rule 7).
    async fn resolve(&self, resolution: &Resolution, deadline: Deadline) -> Result<bool, Error> {
        deadline
            .bound(Operation::Resolve, async {
                let (inner, resolution) = (Arc::clone(&self.inner), resolution.clone());
                let until = deadline.instant();
                self.call(move |conn| {
                    waiting_until(conn, &inner.config, until, |conn| {
                        ops::resolve(conn, &inner.sql, inner.config.clock.as_ref(), &resolution)
                    })
                })
                .await?
            })
            .await
    }

    async fn lookup(&self, id: &RecordId, deadline: Deadline) -> Result<Option<Record>, Error> {
        deadline
            .bound(Operation::Lookup, async {
                let (inner, id) = (Arc::clone(&self.inner), id.clone());
                self.inner
                    .pool
                    .read(move |conn| ops::select(conn, &inner.sql, &id))
                    .await?
            })
            .await
    }
}

#[async_trait]
impl Operator for SqliteStore {
    async fn inspect(&self, id: &RecordId, deadline: Deadline) -> Result<Option<Inspected>, Error> {
        deadline
            .bound(Operation::Inspect, async {
                let (inner, id) = (Arc::clone(&self.inner), id.clone());
                self.inner
                    .pool
                    .read(move |conn| ops::inspect(conn, &inner.sql, &id))
                    .await?
            })
            .await
    }
    async fn list(&self, query: &ListQuery, deadline: Deadline) -> Result<Page, Error> {
        deadline
            .bound(Operation::List, async {
                let (inner, query) = (Arc::clone(&self.inner), query.clone());
                self.inner
                    .pool
                    .read(move |conn| ops::list(conn, &inner.sql, inner.config.clock.now(), &query))
                    .await?
            })
            .await
    }
    async fn stats(&self, deadline: Deadline) -> Result<Stats, Error> {
        deadline
            .bound(Operation::List, async {
                let inner = Arc::clone(&self.inner);
                self.inner
                    .pool
                    .read(move |conn| ops::stats(conn, &inner.sql, inner.config.clock.now()))
                    .await?
            })
            .await
    }
    async fn reconciliations(
        &self,
        id: &RecordId,
        deadline: Deadline,
    ) -> Result<Vec<Reconciliation>, Error> {
        deadline
            .bound(Operation::Inspect, async {
                let (inner, id) = (Arc::clone(&self.inner), id.clone());
                self.inner
                    .pool
                    .read(move |conn| {
                        ops::reconciliations(conn, &inner.sql, inner.config.clock.now(), &id)
                    })
                    .await?
            })
            .await
    }
}
