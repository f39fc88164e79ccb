//! The effect and its completion in one SQLite transaction: only the transaction mechanics live
//! here (the reservation and the effect's transaction in one hop on the writer); the protocol
//! around them is the engine's ([`Idempotency::transact`]), what is stored the engine's
//! `Completion`.

use crate::commit_watch::{watching, CommitWatch};
use crate::connection::{wait_at_most, waiting_until};
use crate::error::{store_error, BACKEND};
use crate::ops;
use crate::pool::Decide;
use crate::SqliteStore;
use idem_core::store::{async_trait, Execution, Lease, Transactional, TxEnd};
use idem_core::{
    Begin, Error, Idempotency, Outcome, Request, RunError, StoreErrorKind, StoredResponse,
};
use rusqlite::{Transaction, TransactionBehavior};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

/// An effect that runs in a SQLite transaction, on the store's writer.
pub type SqliteEffect<E> =
    Box<dyn FnOnce(&Transaction<'_>, &Lease) -> Result<StoredResponse, E> + Send>;

/// What an engine over a [`SqliteStore`] (or an `Arc` of one) adds: the effect and the
/// completion in one SQLite transaction (C6).
///
/// ```
/// use idem_core::{Idempotency, Outcome, StoredResponse};
/// use idem_sqlite::{SqliteIdempotency, SqliteStore};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let store = SqliteStore::open(dir.path().join("shop.db")).await?;
/// store.try_call(|db| db.execute_batch("CREATE TABLE charges (id INTEGER PRIMARY KEY, cents INTEGER)")).await?;
/// let idem = Idempotency::new(store);
///
/// let request = idem.request("acct_1", "POST", "/charges").key(Some("k-1")).body(b"{\"cents\":500}").build()?;
/// let outcome = idem
///     .run_in_transaction(&request, |tx, _lease| {
///         tx.execute("INSERT INTO charges (cents) VALUES (500)", [])?;
///         Ok::<_, rusqlite::Error>(StoredResponse::new(201, format!("charge {}", tx.last_insert_rowid())))
///     })
///     .await?;
/// assert!(matches!(outcome, Outcome::Executed(_)));
/// # Ok(())
/// # }
/// ```
pub trait SqliteIdempotency {
    /// Closure style: reserve; when acquired, open a write transaction (`BEGIN IMMEDIATE`) on
    /// the store's writer, run `effect` in it, write the completion in it and commit, all in one
    /// thread hop that runs to its end even if the caller's future is dropped. The engine's one
    /// transactional path ([`Idempotency::transact`]) says what each end means:
    ///
    /// - `Ok(response)`: committed with the effect; [`Outcome::Executed`] with the response as
    ///   stored (an unstorable response is stored as a 500, C8).
    /// - `Err(e)` from `effect`: the transaction rolls back, the effect with it, so nothing
    ///   happened: the key is released and [`RunError::Released`] returned; a retry runs.
    /// - A lost lease or a failed commit: rolled back, released where still ours,
    ///   [`RunError::Idem`].
    /// - A panic in `effect`: rolled back, released; the panic resumes in the caller.
    ///
    /// The effect holds SQLite's write lock while it runs: keep it short, and within the lease
    /// (a renewal would wait for that same lock). Replays, in-flight answers and mismatches are
    /// answered without waiting for it, and a duplicate of an execution of this process is
    /// answered in flight even past the lease. Another process sharing the file sees the lease
    /// pass and may take the record over: its takeover waits for the write lock, and fails to
    /// fence out a completion that committed first.
    ///
    /// **One commit** (C15): a request made [`with_one_commit`](
    /// idem_core::Request::with_one_commit)`(true)` (or every request, under
    /// [`Policy::one_commit`](idem_core::Policy::one_commit)): the reservation is written in the
    /// effect's transaction (`BEGIN IMMEDIATE`, the reservation, the effect, the completion,
    /// `COMMIT`), so a fresh key costs one commit, and until it commits nothing of the
    /// execution exists. The effect's error, a panic, a failed commit or a crash roll it all
    /// back: the key is free at once and a retry runs as the first did. A duplicate arriving
    /// meanwhile is answered in flight (or mismatch) at once by the engine's in-process claims.
    ///
    /// **Only for an effect that lives entirely in this database.** An effect that calls
    /// anything outside it (a card network, a mail server) must not use one commit: if
    /// its transaction is lost, nothing remembers the call, and the retry makes it again.
    ///
    /// The store must be opened with [`SqliteStoreBuilder::one_commit`](
    /// crate::SqliteStoreBuilder::one_commit) (it is then the only store reserving in its
    /// table); on another store this is refused before anything runs ([`RunError::Idem`] with
    /// a [`StoreErrorKind::Misconfigured`] error).
    ///
    /// ```
    /// use idem_core::{Idempotency, Outcome, StoredResponse};
    /// use idem_sqlite::{SqliteIdempotency, SqliteStore};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// let store = SqliteStore::builder(dir.path().join("shop.db")).one_commit(true).open().await?;
    /// store.try_call(|db| db.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY)")).await?;
    /// let idem = Idempotency::new(store);
    /// let request = idem.request("acct_1", "POST", "/orders").key(Some("o-1")).body(b"{}")
    ///     .build()?.with_one_commit(true);
    /// let outcome = idem
    ///     .run_in_transaction(&request, |tx, _lease| {
    ///         tx.execute("INSERT INTO orders DEFAULT VALUES", [])?;
    ///         Ok::<_, rusqlite::Error>(StoredResponse::new(201, "created"))
    ///     })
    ///     .await?;
    /// assert!(matches!(outcome, Outcome::Executed(_)));
    /// # Ok(())
    /// # }
    /// ```
    fn run_in_transaction<F, E>(
        &self,
        request: &Request,
        effect: F,
    ) -> impl Future<Output = Result<Outcome, RunError<E>>> + Send
    where
        F: FnOnce(&Transaction<'_>, &Lease) -> Result<StoredResponse, E> + Send + 'static,
        E: Send + 'static;
}

/// A store whose transactions are SQLite's: [`SqliteStore`], or an `Arc` of one.
pub trait SqliteTransactional: Transactional {
    /// The store's effect for `effect`.
    fn effect<E: Send + 'static>(effect: SqliteEffect<E>) -> Self::Effect<E>;
}

impl SqliteTransactional for SqliteStore {
    fn effect<E: Send + 'static>(effect: SqliteEffect<E>) -> Self::Effect<E> {
        effect
    }
}

impl SqliteTransactional for Arc<SqliteStore> {
    fn effect<E: Send + 'static>(effect: SqliteEffect<E>) -> Self::Effect<E> {
        effect
    }
}

impl<S: SqliteTransactional + 'static> SqliteIdempotency for Idempotency<S> {
    // A plain future, not a boxed one: the money path allocates nothing of its own here.
    fn run_in_transaction<F, E>(
        &self,
        request: &Request,
        effect: F,
    ) -> impl Future<Output = Result<Outcome, RunError<E>>> + Send
    where
        F: FnOnce(&Transaction<'_>, &Lease) -> Result<StoredResponse, E> + Send + 'static,
        E: Send + 'static,
    {
        self.transact(request, S::effect(Box::new(effect)))
    }
}

#[async_trait]
impl Transactional for SqliteStore {
    type Effect<E: Send + 'static> = SqliteEffect<E>;

    /// No: the effect's transaction holds the one writer a renewal needs.
    fn renews_during_transaction(&self) -> bool {
        false
    }

    async fn transact<E: Send + 'static>(
        &self,
        request: &Request,
        effect: SqliteEffect<E>,
        execution: Execution,
    ) -> Result<TxEnd<E, SqliteEffect<E>>, Error> {
        self.inner.lock.reserving()?;
        if execution.one_commit() && !self.inner.lock.one_commit() {
            return Err(Error::store(
                BACKEND,
                StoreErrorKind::Misconfigured,
                "a one-commit execution needs a store opened for it \
                 (SqliteStoreBuilder::one_commit): only then is it the one store reserving in \
                 its table, which keeps duplicates from waiting for the uncommitted reservation",
            ));
        }
        let transacting = Transacting {
            inner: Arc::clone(&self.inner),
            request: request.clone(),
            effect,
            execution,
            queued: Instant::now(),
        };
        // The writer is waited for at most the engine's store timeout; the transaction, once
        // started, runs to its end.
        let wait = transacting.execution.store_timeout();
        self.inner.pool.decide(transacting, Some(wait)).await?
    }

    /// On the writer, in one hop: `BEGIN IMMEDIATE`, the effect, the completion, `COMMIT`.
    async fn complete_in_transaction<E: Send + 'static>(
        &self,
        lease: &Lease,
        effect: SqliteEffect<E>,
        execution: Execution,
    ) -> Result<TxEnd<E>, Error> {
        let inner = Arc::clone(&self.inner);
        let lease = lease.clone();
        let wait = execution.store_timeout();
        let queued = Instant::now();
        self.inner
            .pool
            .write_within(wait, move |conn| {
                execution.charge(queued.elapsed());
                waiting_until(conn, &inner.config, within(&execution), |conn| {
                    Ok(watching(conn, |conn, watch| {
                        match begin_immediate(conn, &inner, &execution) {
                            Ok(tx) => {
                                effect_then_commit(tx, &inner, &lease, effect, &execution, watch)
                            }
                            Err(error) => TxEnd::RolledBack(error),
                        }
                    }))
                })
            })
            .await?
    }
}

/// The reservation and the effect's transaction, decided where their statements run: a
/// duplicate is answered on a reader when the writer is busy, never queueing for the writer to
/// say "in flight" or replay (C5).
struct Transacting<E: Send + 'static> {
    inner: Arc<crate::store::Inner>,
    request: Request,
    effect: SqliteEffect<E>,
    execution: Execution,
    /// When it was handed to the pool: its wait for the writer is store time (C13).
    queued: Instant,
}

impl<E: Send + 'static> Decide for Transacting<E> {
    type Output = Result<TxEnd<E, SqliteEffect<E>>, Error>;

    fn answer(self, conn: &mut rusqlite::Connection) -> Result<Self::Output, Self> {
        let inner = &self.inner;
        let now = inner.config.clock.now();
        // The record decided as a reservation decides it (C3): one read, the response fetched
        // under either of the request's fingerprints; nothing written under the alternative.
        let answer = ops::found(conn, &inner.sql, &self.request, now)
            .and_then(|found| found.map_or(Ok(None), |found| found.answer(&self.request)));
        match answer {
            Ok(Some(answer)) => Ok(Ok(TxEnd::Answered(answer, self.effect))),
            Ok(None) => Err(self),
            Err(error) => Ok(Err(error)),
        }
    }

    fn write(self, conn: &mut rusqlite::Connection) -> Self::Output {
        let Self {
            inner,
            request,
            effect,
            execution,
            queued,
        } = self;
        execution.charge(queued.elapsed());
        waiting_until(conn, &inner.config, within(&execution), |conn| {
            if execution.one_commit() {
                transact_once_on(conn, &inner, &request, effect, &execution)
            } else {
                transact_on(conn, &inner, &request, effect, &execution)
            }
        })
    }
}

/// Reservation, then effect, completion and commit in one transaction, on the writer.
fn transact_on<E>(
    conn: &mut rusqlite::Connection,
    inner: &crate::store::Inner,
    req: &Request,
    effect: SqliteEffect<E>,
    execution: &Execution,
) -> Result<TxEnd<E, SqliteEffect<E>>, Error> {
    let clock = inner.config.clock.as_ref();
    let reserving = Instant::now();
    let reserved = ops::reserve(conn, &inner.sql, clock, reservation(req, execution));
    execution.charge(reserving.elapsed());
    let reserved = match reserved? {
        Begin::Answered(answer) => return Ok(TxEnd::Answered(answer, effect)),
        Begin::Acquired(lease) => lease,
    };
    // The reservation is committed: from here every way out, a panic in the engine's own hooks
    // (an application's observer) included, is an end the engine handles, never a key left in
    // progress with nobody executing it.
    let lease = match acquired(execution, reserved) {
        Ok(lease) => lease,
        Err(panicked) => return Ok(*panicked),
    };
    // The effect's transaction waits for what the reservation left of the budget.
    Ok(watching(conn, |conn, watch| {
        match begin_immediate(conn, inner, execution) {
            Ok(tx) => effect_then_commit(tx, inner, &lease, effect, execution, watch),
            Err(error) => TxEnd::RolledBack(error),
        }
    }))
}

/// Reservation, effect, completion and commit in one transaction, on the writer (C15). Until
/// the commit nothing of it is visible; every way out before it (an answer, an error, a panic)
/// drops the transaction, which rolls it all back.
fn transact_once_on<E>(
    conn: &mut rusqlite::Connection,
    inner: &crate::store::Inner,
    req: &Request,
    effect: SqliteEffect<E>,
    execution: &Execution,
) -> Result<TxEnd<E, SqliteEffect<E>>, Error> {
    let clock = inner.config.clock.as_ref();
    watching(conn, |conn, watch| {
        let tx = begin_immediate(conn, inner, execution)?;
        let reserved = match ops::reserve(&tx, &inner.sql, clock, reservation(req, execution))? {
            Begin::Answered(answer) => return Ok(TxEnd::Answered(answer, effect)),
            Begin::Acquired(lease) => lease,
        };
        let lease = match acquired(execution, reserved) {
            Ok(lease) => lease,
            Err(panicked) => return Ok(*panicked),
        };
        Ok(effect_then_commit(
            tx, inner, &lease, effect, execution, watch,
        ))
    })
}

/// `BEGIN IMMEDIATE`, another process's write lock waited for at most what is left of the
/// request's store budget, and the wait charged to it (C13): the reservation and the effect's
/// transaction share one budget.
fn begin_immediate<'c>(
    conn: &'c mut rusqlite::Connection,
    inner: &crate::store::Inner,
    execution: &Execution,
) -> Result<Transaction<'c>, Error> {
    wait_at_most(conn, &inner.config, execution.store_timeout())?;
    let began = Instant::now();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate);
    execution.charge(began.elapsed());
    tx.map_err(store_error)
}

/// [`Execution::acquired`] for `reserved`, or, if the engine's hooks panicked (an application's
/// observer, once the engine registered the lease), the acquired execution ended by that panic.
fn acquired<E>(
    execution: &Execution,
    reserved: Lease,
) -> Result<Lease, Box<TxEnd<E, SqliteEffect<E>>>> {
    catch_unwind(AssertUnwindSafe(|| execution.acquired(reserved)))
        .map_err(|panic| Box::new(TxEnd::Panicked(panic)))
}

/// The effect in `tx`, then its completion, then the commit; `watch` sees the commits and
/// rollbacks of `tx`'s connection since before `tx` began, and is read before any rollback of
/// the store's own.
fn effect_then_commit<E, F>(
    tx: Transaction<'_>,
    inner: &crate::store::Inner,
    lease: &Lease,
    effect: SqliteEffect<E>,
    execution: &Execution,
    watch: &CommitWatch,
) -> TxEnd<E, F> {
    let clock = inner.config.clock.as_ref();
    let ran = catch_unwind(AssertUnwindSafe(|| effect(&tx, lease)));
    // Whatever the effect answered, what it committed by itself is there (C8).
    if watch.committed() {
        return TxEnd::CommittedByTheEffect(committed_by_the_effect());
    }
    let response = match ran {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => return TxEnd::EffectFailed(error),
        Err(panic) => return TxEnd::Panicked(panic),
    };
    // The transaction was rolled back under the effect while it went on and answered: by
    // SQLite (an `ON CONFLICT ROLLBACK` constraint, `RAISE(ROLLBACK)`, a full disk) or by the
    // effect's own `ROLLBACK`, perhaps followed by a `BEGIN` and more writes. Its writes
    // before the rollback are gone; none after it commit either, as nothing commits the
    // transaction it began (dropping `tx` rolls it back, the pool's cleaning or a closed
    // connection if that fails). Nothing happened, and the completion must not commit without
    // the effect (C6).
    if watch.rolled_back() || tx.is_autocommit() {
        return TxEnd::RolledBack(rolled_back_under_the_effect());
    }
    let completion = match catch_unwind(AssertUnwindSafe(|| execution.completion(lease, response)))
    {
        Ok(completion) => completion,
        Err(panic) => return TxEnd::Panicked(panic),
    };
    if let Err(error) = ops::complete(&tx, &inner.sql, clock.now(), &completion) {
        return TxEnd::RolledBack(error);
    }
    // A COMMIT that fails leaves the transaction open; dropping it rolls it back.
    match tx.commit() {
        Ok(()) => TxEnd::Committed(completion),
        Err(error) => TxEnd::RolledBack(store_error(error)),
    }
}

/// The error of an effect that committed its transaction by itself.
fn committed_by_the_effect() -> Error {
    Error::store(
        BACKEND,
        StoreErrorKind::Other,
        "the effect ended its transaction with its own COMMIT: its writes are committed without \
         their completion; the key is kept with the answer of an unknown outcome (an effect \
         must leave the transaction to the store)",
    )
}

/// The error of an effect whose transaction was rolled back under it, by SQLite or itself.
pub(crate) fn rolled_back_under_the_effect() -> Error {
    Error::store(
        crate::error::BACKEND,
        StoreErrorKind::TransactionConflict,
        "the effect's transaction was rolled back under it (its own ROLLBACK, a constraint or trigger that rolls back, or an I/O error); nothing was committed, retry the whole request",
    )
}

/// The reservation of `req` for `execution`, in one hop: a replay it reads is kept as the
/// engine says.
fn reservation<'a>(req: &'a Request, execution: &Execution) -> idem_core::store::Reservation<'a> {
    ops::reservation(req, execution.lease_for()).in_execution(execution)
}

/// When the rest of the request's store budget ends, from now (C13).
fn within(execution: &Execution) -> Instant {
    Instant::now() + execution.store_timeout()
}
