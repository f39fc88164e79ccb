//! The effect and its completion in one PostgreSQL transaction: only the transaction mechanics
//! live here (begin at the store's isolation, effect, fenced completion, commit, and what a
//! failed commit means); the protocol around them is the engine's ([`Idempotency::transact`]),
//! what is stored the engine's `Completion`.

use crate::broken_effect::broken_effect;
use crate::config::Isolation;
use crate::effect_connection::{Acquiring, EffectConnection};
use crate::error::{
    begin_error, ended_session, in_aborted_transaction, is_broken_link, store_error, BACKEND,
};
use crate::gate::GateKeys;
use crate::look_beside::Waited;
use crate::ops::Ops;
use crate::params::{fetch_all, Param};
use crate::row;
use crate::session;
use crate::store::PgStore;
use idem_core::store::{
    async_trait, Acquire, CatchUnwind, Claim, Execution, Lease, Record, Reservation, Reserved,
    Steps, Transactional, TxEnd,
};
use idem_core::{
    Begin, Error, Idempotency, Operation, Outcome, RecordId, Request, RunError, StoreErrorKind,
    StoredResponse,
};
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// The future an effect returns: it borrows the transaction's connection and the lease.
pub type EffectFuture<'c, E> = Pin<Box<dyn Future<Output = Result<StoredResponse, E>> + Send + 'c>>;

/// An effect that runs in a PostgreSQL transaction.
pub type PgEffect<E> =
    Box<dyn for<'c> FnOnce(&'c mut PgConnection, &'c Lease) -> EffectFuture<'c, E> + Send>;

/// What an engine over a [`PgStore`] (or an `Arc` of one) adds: the effect and the completion
/// in one PostgreSQL transaction (C6).
///
/// ```no_run
/// use idem_core::{Idempotency, Outcome, StoredResponse};
/// use idem_postgres::{PgIdempotency, PgStore};
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let idem = Idempotency::new(PgStore::connect("postgres://app@localhost/payments").await?);
/// let request = idem.request("acct_1", "POST", "/charges").key(Some("k-1")).body(b"{\"cents\":500}").build()?;
/// let outcome = idem
///     .run_in_transaction(&request, |tx, _lease| Box::pin(async move {
///         let (id,): (i64,) = sqlx::query_as("INSERT INTO charges (cents) VALUES (500) RETURNING id")
///             .fetch_one(&mut *tx)
///             .await?;
///         Ok::<_, sqlx::Error>(StoredResponse::new(201, format!("charge {id}")))
///     }))
///     .await?;
/// assert!(matches!(outcome, Outcome::Executed(_)));
/// # Ok(())
/// # }
/// ```
pub trait PgIdempotency {
    /// Closure style: reserve (one round trip); when acquired, open a transaction at the
    /// store's [`Isolation`](crate::Isolation), run `effect` in it, write the completion in it
    /// and commit. The engine's one transactional path ([`Idempotency::transact`]) runs it so that
    /// it outlives its caller (a dropped caller's execution goes on as a task of its own,
    /// which [`Idempotency::drain`] waits for). At READ COMMITTED the lease is kept alive while the effect runs; at
    /// REPEATABLE READ and SERIALIZABLE a renewal would conflict with the transaction's
    /// snapshot, so there the lease must cover the effect.
    ///
    /// - `Ok(response)`: committed with the effect; [`Outcome::Executed`].
    /// - `Err(e)` from `effect`: the transaction rolls back, the effect with it, so nothing
    ///   happened: the key is released and [`RunError::Released`] returned. If the
    ///   transaction's connection broke under the effect (the database went away; its ROLLBACK
    ///   is not answered), nothing committed either, but the caller is told the store is
    ///   unavailable: [`RunError::Idem`] with a [`StoreErrorKind::Unavailable`] error keeping
    ///   the effect's message (a 503 with `Retry-After`), and the key is released.
    /// - An effect still running past the store's
    ///   [`transaction_timeout`](crate::PgStoreBuilder::transaction_timeout): abandoned before
    ///   any COMMIT, its connection closed; what it did outside the database is unknown, so the
    ///   key is kept with a stored 500 (outcome unknown, C8) and [`RunError::InDoubt`] returned.
    /// - A lost lease, a serialization failure or deadlock
    ///   ([`StoreErrorKind::TransactionConflict`]: retry the whole request), a commit the server
    ///   refused: rolled back, released where still ours, [`RunError::Idem`].
    /// - A commit whose answer the connection lost: the record, read once no transaction holds
    ///   it, tells whether it committed ([`Outcome::Executed`]) or not (released); if that
    ///   cannot be told within the store timeout, [`RunError::InDoubt`] and the key is kept.
    ///
    /// A call out of the database inside `effect` (a provider's API) is not rolled back with
    /// the transaction: wherever the key is released above, the retry runs the effect and
    /// makes the call again. Make it with [`Lease::downstream_key`] as the provider's
    /// idempotency key, so that the provider answers the retry with the first call's result,
    /// or call out from [`Idempotency::run`](idem_core::Idempotency::run), whose handler can
    /// keep the key with an unknown outcome.
    ///
    /// **One commit** (C15): a request made [`with_one_commit`](
    /// idem_core::Request::with_one_commit)`(true)` (or every request, under
    /// [`Policy::one_commit`](idem_core::Policy::one_commit)). The transaction begins first and
    /// reserves the key as its first statement; reservation, effect and completion then commit
    /// together, once, or not at all. A fresh key costs one commit (one WAL flush) instead of
    /// two, in the same round trips (BEGIN, reserve, the effect's statements, completion,
    /// COMMIT); an answer (replay, in flight, mismatch) costs three (BEGIN, reserve, ROLLBACK)
    /// instead of one.
    ///
    /// **Only for an effect that lives entirely in this database.** Until the commit nothing
    /// of the execution exists: the effect's error, a failure before the commit, a panic, an
    /// effect past the transaction timeout or a crash of the process roll everything back, and
    /// the key is free at once, so the retry runs the effect again. An effect that calls out
    /// (a card network, an e-mail, a message broker) must not use it: a charge made before a
    /// crash would be made again. Build its request without one commit.
    ///
    /// A duplicate that arrives while the transaction runs is answered at once, never waits
    /// for it (C5): in flight (with a `Retry-After` of one second: how long the transaction
    /// still runs is unknown) for the same request, mismatch for another body (C3), from any
    /// process and through [`Store::reserve`](idem_core::Store::reserve) too. What tells them
    /// is a pair of transaction-scoped advisory locks that every fresh reservation tries
    /// (64-bit keys derived from the record and the fingerprint, in the server's `bigint`
    /// advisory-lock space, which the application's own `bigint` advisory locks share; two
    /// keys collide with probability 2^-64 per pair of concurrent reservations, and a
    /// collision only answers one of them in flight). **Every process that reserves on the
    /// table must run a release of this store that takes these locks**: an older one's
    /// reservation of the same key would wait for the open transaction instead of answering.
    ///
    /// Refused at [`Isolation::Serializable`](crate::Isolation::Serializable) (a
    /// [`StoreErrorKind::Misconfigured`] error, nothing runs): the reservation's read inside a
    /// serializable transaction would make concurrent fresh keys fail each other's commits.
    /// The effect must leave the transaction to the store: one that runs `COMMIT` or
    /// `ROLLBACK` itself (a helper's `BEGIN; ...; COMMIT`, whose nested `BEGIN` PostgreSQL only
    /// warns about) ends it apart from the completion. The store's `BEGIN` marks the
    /// transaction `DEFERRABLE` (no effect on one that is not SERIALIZABLE READ ONLY), the
    /// completion writes only while the mark holds, and an effect whose transaction lost it,
    /// failed or answered, keeps the key with a stored 500 of an unknown outcome
    /// ([`RunError::InDoubt`]): its writes may be committed without their completion (with
    /// one commit, a `ROLLBACK` takes the reservation with it: the engine writes it again,
    /// unless a duplicate took the key in between). Not told apart: a transaction the effect
    /// began after ending the store's and left aborted (it answers nothing: the key is
    /// released, and a retry runs the effect again), and a session whose
    /// `default_transaction_deferrable` is on, an operator's or an earlier effect's `SET`
    /// (a completion after the effect's own `ROLLBACK` commits alone). An effect that removes
    /// the mark itself (`RESET transaction_deferrable`) has its work rolled back and the key
    /// kept.
    ///
    /// The lease does not renew while the transaction is open (nothing to renew until it
    /// commits, and nobody can take the key over meanwhile), so the transaction timeout, not
    /// the lease, bounds the effect. A commit whose answer was lost is told by the record:
    /// completed under this execution's token, [`Outcome::Executed`]; otherwise nothing
    /// happened; unreadable, [`RunError::InDoubt`] (a retry replays or runs once).
    ///
    /// ```no_run
    /// use idem_core::{Idempotency, Outcome, StoredResponse};
    /// use idem_postgres::{PgIdempotency, PgStore};
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let idem = Idempotency::new(PgStore::connect("postgres://app@localhost/payments").await?);
    /// let request = idem.request("acct_1", "POST", "/transfers").key(Some("k-1"))
    ///     .body(b"{\"cents\":500}").build()?.with_one_commit(true);
    /// // Both accounts live in this database: nothing leaves it.
    /// let outcome = idem
    ///     .run_in_transaction(&request, |tx, _lease| Box::pin(async move {
    ///         sqlx::query("UPDATE accounts SET cents = cents - 500 WHERE id = 1")
    ///             .execute(&mut *tx)
    ///             .await?;
    ///         sqlx::query("UPDATE accounts SET cents = cents + 500 WHERE id = 2")
    ///             .execute(&mut *tx)
    ///             .await?;
    ///         Ok::<_, sqlx::Error>(StoredResponse::new(201, "moved"))
    ///     }))
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
        F: for<'c> FnOnce(&'c mut PgConnection, &'c Lease) -> EffectFuture<'c, E> + Send + 'static,
        E: Send + 'static;
}

/// A store whose transactions are PostgreSQL's: [`PgStore`], or an `Arc` of one.
pub trait PgTransactional: Transactional {
    /// The store's effect for `effect`.
    fn effect<E: Send + 'static>(effect: PgEffect<E>) -> Self::Effect<E>;
}

impl PgTransactional for PgStore {
    fn effect<E: Send + 'static>(effect: PgEffect<E>) -> Self::Effect<E> {
        effect
    }
}

impl PgTransactional for Arc<PgStore> {
    fn effect<E: Send + 'static>(effect: PgEffect<E>) -> Self::Effect<E> {
        effect
    }
}

impl<S: PgTransactional + 'static> PgIdempotency for Idempotency<S> {
    // A plain future, not a boxed one: the money path allocates nothing of its own here.
    fn run_in_transaction<F, E>(
        &self,
        request: &Request,
        effect: F,
    ) -> impl Future<Output = Result<Outcome, RunError<E>>> + Send
    where
        F: for<'c> FnOnce(&'c mut PgConnection, &'c Lease) -> EffectFuture<'c, E> + Send + 'static,
        E: Send + 'static,
    {
        self.transact(request, S::effect(Box::new(effect)))
    }
}

#[async_trait]
impl Transactional for PgStore {
    type Effect<E: Send + 'static> = PgEffect<E>;

    /// At READ COMMITTED only: at REPEATABLE READ and SERIALIZABLE the renewal, made after the
    /// transaction's snapshot, would turn the completion into a serialization failure every
    /// time (docs/stores.md, PostgreSQL, Isolation).
    fn renews_during_transaction(&self) -> bool {
        self.isolation() == Isolation::ReadCommitted
    }

    /// Two commits: the reservation on its own (one round trip), then the transaction. One
    /// commit (C15): the transaction first, the reservation its first statement (`sql/reserve.sql`
    /// with the gate's exclusive locks), so that nothing of the execution exists until it
    /// commits; an answered reservation rolls the transaction back.
    async fn transact<E: Send + 'static>(
        &self,
        request: &Request,
        effect: PgEffect<E>,
        execution: Execution,
    ) -> Result<TxEnd<E, Self::Effect<E>>, Error> {
        if execution.one_commit() {
            if self.isolation() == Isolation::Serializable {
                return Err(Error::store(
                    BACKEND,
                    StoreErrorKind::Misconfigured,
                    "one commit per fresh key is refused at SERIALIZABLE: the reservation's \
                     read inside the execution's serializable transaction makes concurrent \
                     fresh keys fail each other's commits; use READ COMMITTED or REPEATABLE \
                     READ, or two commits",
                ));
            }
            return Box::pin(self.in_transaction(Start::Reserve(request), effect, &execution))
                .await;
        }
        let reservation = Reservation::new(request, execution.lease_for()).in_execution(&execution);
        let reserved = execution
            .bounded(Operation::Reserve, request.id(), |deadline| async move {
                let mut steps = (self, deadline);
                reservation.run(&mut steps).await
            })
            .await?;
        let lease = match reserved {
            Begin::Answered(answer) => return Ok(TxEnd::Answered(answer, effect)),
            Begin::Acquired(lease) => execution.acquired(lease),
        };
        // Boxed: the transaction's state (tens of KiB) is made only for an execution, so an
        // answer moves a small future (async_trait boxes this one whole, by a copy).
        Box::pin(self.in_transaction(Start::Reserved(lease), effect, &execution)).await
    }

    /// The transaction on one of the store's connections for transactions, as for a lease
    /// acquired by [`transact`](Transactional::transact).
    async fn complete_in_transaction<E: Send + 'static>(
        &self,
        lease: &Lease,
        effect: PgEffect<E>,
        execution: Execution,
    ) -> Result<TxEnd<E>, Error> {
        let start = Start::Reserved(lease.clone());
        match self
            .in_transaction(start, effect, &execution)
            .await?
            .acquired()
        {
            Ok(end) => Ok(end),
            // A held lease is never answered: nothing reserves here.
            Err(_) => Err(Error::LeaseLost),
        }
    }

    async fn settled(&self, id: &RecordId, wait: Duration) -> Result<Option<Record>, Error> {
        let mut held = self.connections().get().await?;
        // A transaction of several statements: cut off mid-way, its connection closes rather
        // than settle back into the stack with the transaction open.
        held.session_changed();
        let result = settled_on(
            held.conn(),
            &self.inner.ops.sql.select_settled,
            self,
            id,
            wait,
        )
        .await;
        match &result {
            Err(error) if !crate::error::is_broken_link(error) => {
                // A server error inside the BEGIN message (the gate's lock timeout) leaves the
                // transaction aborted, never ended: the connection closes.
                held.close();
            }
            _ => held.finish(&result),
        }
        result
    }
}

impl PgStore {
    /// Begin, effect, completion, commit, on one of the store's connections for transactions,
    /// given back at once only if the transaction ended cleanly: committed, or rolled back with
    /// the server's answer. Anything else (a statement cut off by the engine's deadline, a
    /// broken link, a COMMIT in doubt, a panic, the execution dropped) settles or closes it
    /// ([`EffectConnection`]), so a connection stuck behind a dead link or a row lock never
    /// holds a slot (C13). Taken and given back without a round trip (sqlx's pool would ping it
    /// on its return: a message more per fresh key).
    ///
    /// `Err` only for a one-commit execution that never acquired (nothing of it exists); a
    /// two-commit one says how its transaction failed in its [`TxEnd`].
    async fn in_transaction<E: Send + 'static>(
        &self,
        start: Start<'_>,
        effect: PgEffect<E>,
        execution: &Execution,
    ) -> Result<TxEnd<E, PgEffect<E>>, Error> {
        let mut effect = effect;
        let conns = &self.inner.tx_conns;
        // A connection that died while idle fails its BEGIN at once: nothing ran, so the
        // transaction begins again on another connection. Of the store's own, once, on a
        // newly opened one. Of the application's pool, until one answers: a restart kills all
        // its idle connections at once, and the pool hands them out one after another (each
        // failed one is closed, so the pool's size and one more suffice; every attempt spends
        // the request's budget). Any other broken link (a server refusing writes, a statement
        // cut off) is tried twice, as every connection of the pool would answer alike.
        let attempts = if self.inner.effects_on_pool {
            (self.pool().size() as usize + 1).max(2)
        } else {
            2
        };
        for attempt in 0..attempts {
            // Two boxes, not one: a future is the size of its largest path, and sqlx's pool
            // acquisition (8.7 KiB) would be made, and copied, for every transaction on the
            // store's own connections too.
            let acquire: Acquiring<'_> = if self.inner.effects_on_pool {
                Box::pin(async {
                    let conn = self.pool().acquire().await.map_err(store_error)?;
                    Ok(EffectConnection::pool(conn))
                })
            } else {
                Box::pin(async move {
                    let held = if attempt == 0 {
                        conns.get().await?
                    } else {
                        conns.get_fresh().await?
                    };
                    Ok(EffectConnection::own(held))
                })
            };
            let waited = match start {
                Start::Reserve(request) if attempt == 0 => {
                    self.connection_or_answer(request, acquire, execution).await
                }
                _ => execution
                    .bounded(Operation::Transaction, start.id(), |_| acquire)
                    .await
                    .map(Waited::Connection),
            };
            let mut conn = match waited {
                Ok(Waited::Connection(conn)) => conn,
                Ok(Waited::Answered(answer)) => return Ok(TxEnd::Answered(answer, effect)),
                Err(error) => return start.failed(error),
            };
            // Boxed, as every step of the transaction below: a future holds a pointer to each
            // step's state instead of the state itself, so that making one step's future does
            // not copy the largest of them (sqlx's, several KiB) a level at a time.
            match Box::pin(self.transaction_on(conn.conn(), &start, effect, execution)).await {
                Ok((transacted, clean)) => {
                    if clean {
                        conn.keep();
                    } else if !matches!(transacted, TxEnd::Panicked(_) | TxEnd::Abandoned(_)) {
                        // The effect returned: its session holds what a committed one's does.
                        // One that panicked or was abandoned may hold what no rollback undoes
                        // (an advisory lock it would have released at its end): closed.
                        conn.settle();
                    }
                    return Ok(transacted);
                }
                Err(NotBegun {
                    effect: back,
                    error,
                    died_idle,
                }) => {
                    if !is_broken_link(&error) {
                        // The server answered: the connection's host is not suspect.
                        conn.close();
                        return start.failed(error);
                    }
                    // The effect never ran.
                    conn.settle();
                    let limit = if died_idle { attempts } else { 2 };
                    if attempt + 1 >= limit {
                        return start.failed(error);
                    }
                    effect = back;
                }
            }
        }
        start.failed(Error::store(
            BACKEND,
            StoreErrorKind::Unavailable,
            "the transaction could not begin",
        ))
    }

    /// The transaction on `conn`: what it did, and whether it ended cleanly (committed, or
    /// rolled back with the server's answer), so that `conn` may serve another; or, if it could
    /// not begin (nor, with one commit, reserve), the effect back, unrun.
    ///
    /// With one commit the reservation is a statement of its own after `BEGIN` (sqlx's
    /// transaction sends its `BEGIN` alone and waits for its answer): a fresh key costs the
    /// same round trips as with two commits (BEGIN, reserve, effect, completion, COMMIT), an
    /// answer three (BEGIN, reserve, ROLLBACK).
    async fn transaction_on<E: Send + 'static>(
        &self,
        conn: &mut PgConnection,
        start: &Start<'_>,
        effect: PgEffect<E>,
        execution: &Execution,
    ) -> Result<(TxEnd<E, PgEffect<E>>, bool), NotBegun<E>> {
        let id = start.id();
        let deadlines = &self.inner.config.deadlines;
        // A one-commit reservation is the transaction's first write: on a server that takes no
        // writes it fails before the effect, unless an explicit READ WRITE overrode the
        // server's `default_transaction_read_only`.
        let read_write = self.inner.hosts.checks_writes() && !execution.one_commit();
        let statement = session::effect_begin(
            self.isolation().begin_statement(),
            deadlines,
            read_write,
            self.inner.config.statements,
        );
        let mut conflicts = 0;
        let (tx, lease) = loop {
            let begin = Box::pin(async {
                conn.begin_with(AssertSqlSafe(statement.as_str()))
                    .await
                    .map_err(begin_error)
            });
            let mut tx = match execution
                .bounded(Operation::Transaction, id, |_| begin)
                .await
            {
                Ok(tx) => tx,
                Err(error) => {
                    let died_idle = ended_session(&error);
                    return Err(NotBegun {
                        effect,
                        error,
                        died_idle,
                    });
                }
            };
            let request = match start {
                Start::Reserved(lease) => break (tx, lease.clone()),
                Start::Reserve(request) => *request,
            };
            let mut steps = OneCommit {
                ops: &self.inner.ops,
                conn: &mut tx,
                insert_first: self.isolation() == Isolation::ReadCommitted,
            };
            // Never a step sent again on a transaction a failure aborted (C15).
            let reserve = Box::pin(
                Reservation::without_retry(request, execution.lease_for())
                    .in_execution(execution)
                    .run(&mut steps),
            );
            match execution.bounded(Operation::Reserve, id, |_| reserve).await {
                Ok(Begin::Acquired(lease)) => break (tx, execution.acquired(lease)),
                // Nothing was written: the transaction ends, its gate's locks with it.
                Ok(Begin::Answered(answer)) => {
                    let clean = Box::pin(roll_back(tx, execution, id)).await.is_ok();
                    return Ok((TxEnd::Answered(answer, effect), clean));
                }
                // At REPEATABLE READ or SERIALIZABLE the transaction's snapshot is taken as the
                // reservation starts: a reservation of the key committed after it (the gate
                // was then free again) is a conflict for the insert, not a row to read. A
                // transaction begun now sees it, and answers from it.
                Err(error) if conflicts < MAX_CONFLICTS && is_conflict(&error) => {
                    if Box::pin(roll_back(tx, execution, id)).await.is_err() {
                        return Err(NotBegun::after_begin(effect, error));
                    }
                    conflicts += 1;
                }
                // Dropping the transaction rolls it back (its connection settles).
                Err(error) => return Err(NotBegun::after_begin(effect, error)),
            }
        };
        let (end, clean) = Box::pin(self.effect_in(tx, &lease, effect, execution)).await;
        Ok((end, clean))
    }

    /// The effect, its completion and the commit in `tx`, under `lease`: the transaction's end
    /// and whether it ended cleanly.
    async fn effect_in<E: Send + 'static>(
        &self,
        mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
        lease: &Lease,
        effect: PgEffect<E>,
        execution: &Execution,
    ) -> (TxEnd<E, PgEffect<E>>, bool) {
        let id = lease.id();
        let deadlines = &self.inner.config.deadlines;
        // The effect's own statements have no deadline of the store's, and a connection whose
        // server is gone never answers them (sqlx sets no TCP keepalive): the whole effect is
        // bounded by the transaction timeout instead. No COMMIT was sent, nothing committed.
        let ran = tokio::time::timeout(
            deadlines.transaction,
            CatchUnwind::new(effect(&mut tx, lease)),
        )
        .await;
        // Nothing committed, but what the effect did outside the database is unknown: with two
        // commits the key is kept with the 500 of an unknown outcome, never given back (C8);
        // with one, nothing of the execution exists.
        let Ok(ran) = ran else {
            return (
                TxEnd::Abandoned(Error::store(
                    BACKEND,
                    StoreErrorKind::Unavailable,
                    format!(
                        "the effect's transaction did not reach its completion within the \
                         transaction timeout ({:?}); nothing was committed",
                        deadlines.transaction
                    ),
                )),
                false,
            );
        };
        let response = match ran {
            Ok(Ok(response)) => response,
            // Nothing was committed either way; whether the database is still there says
            // what the caller is told: the effect's failure, or the store's (C13).
            Ok(Err(error)) => {
                // Unless the effect ended the store's transaction itself: what it wrote before
                // its own COMMIT is committed, so the key is never given back (C8).
                if Box::pin(self.still_the_stores(&mut tx, execution, id)).await == Some(false) {
                    drop(tx);
                    return (TxEnd::CommittedByTheEffect(ended_by_the_effect()), false);
                }
                return match Box::pin(roll_back(tx, execution, id)).await {
                    Ok(()) => (TxEnd::EffectFailed(error), true),
                    Err(broken) => (TxEnd::RolledBack(broken_effect(&error, broken)), false),
                };
            }
            // Rolled back before the panic goes on (bounded; past the bound, dropped with its
            // connection), so that a retry finds the key free, not held by a session whose end
            // the server has not seen yet. The connection is closed either way: the panic may
            // have cut a statement off.
            Err(panic) => {
                let _ = Box::pin(roll_back(tx, execution, id)).await;
                return (TxEnd::Panicked(panic), false);
            }
        };
        let completion = execution.completion(lease, response);
        let written = execution
            .bounded(Operation::Complete, id, |_| {
                Box::pin(self.inner.ops.complete_in_effect_tx(&mut tx, &completion))
            })
            .await;
        // A completion that changed nothing: the lease was lost, or the effect ended the
        // store's transaction itself (and the completion would have committed apart from its
        // writes). Not told, the key is kept: never given back after a COMMIT (C8).
        if matches!(written, Err(Error::LeaseLost)) {
            let kept = match Box::pin(self.still_the_stores(&mut tx, execution, id)).await {
                Some(true) => None,
                Some(false) => Some(ended_by_the_effect()),
                None => Some(Error::store(
                    BACKEND,
                    StoreErrorKind::Unavailable,
                    "the completion changed nothing, and whether the lease was lost or the \
                     effect ended the store's transaction itself could not be told: the key is \
                     to be kept with the answer of an unknown outcome",
                )),
            };
            if let Some(error) = kept {
                drop(tx);
                return (TxEnd::CommittedByTheEffect(error), false);
            }
        }
        if let Err(error) = written {
            // A completion cut off by its deadline, or whose link failed, is not rolled back
            // while the caller waits (a silent link would hold it a store timeout more): the
            // transaction is dropped, its ROLLBACK queued, and its connection settles in the
            // background or closes, the server then rolling it back by itself (C13).
            if is_broken_link(&error) {
                drop(tx);
                return (TxEnd::RolledBack(error), false);
            }
            let clean = Box::pin(roll_back(tx, execution, id)).await.is_ok();
            return (TxEnd::RolledBack(error), clean);
        }
        // A spent budget sends no COMMIT: the transaction is dropped (its ROLLBACK queued, its
        // connection settling), and nothing of it commits (C13).
        if execution.store_timeout().is_zero() {
            drop(tx);
            let spent = Error::store(
                BACKEND,
                StoreErrorKind::Unavailable,
                "the request's store budget was spent before the COMMIT; nothing was committed",
            );
            return (TxEnd::RolledBack(spent), false);
        }
        let commit = Box::pin(async { tx.commit().await.map_err(store_error) });
        match execution
            .bounded(Operation::Transaction, id, |_| commit)
            .await
        {
            Ok(()) => (TxEnd::Committed(completion), true),
            // Whatever the error, the record tells: a server's own error may come after the
            // commit (a pooler whose server connection broke answers FATAL 08P01), the
            // connection may have failed after the COMMIT reached the server, or the budget
            // ran out while it was on its way. The engine reads the record once no transaction
            // holds it.
            Err(error) => (TxEnd::InDoubt { completion, error }, false),
        }
    }

    /// Whether the transaction the store began for an effect is still open on `tx`
    /// (`Some(true)`), or the effect ended it with its own `COMMIT` or `ROLLBACK`
    /// (`Some(false)`); `None` if that cannot be told within the budget. An aborted
    /// transaction answers nothing but its end: it is taken for the store's, though one the
    /// effect began after ending the store's looks the same (docs/stores.md).
    async fn still_the_stores(
        &self,
        tx: &mut PgConnection,
        execution: &Execution,
        id: &RecordId,
    ) -> Option<bool> {
        let asked = execution
            .bounded(Operation::Transaction, id, |_| {
                Box::pin(self.inner.ops.effect_tx_open(tx))
            })
            .await;
        match asked {
            Ok(open) => Some(open),
            Err(error) if in_aborted_transaction(&error) => Some(true),
            Err(_) => None,
        }
    }
}

/// The error of an effect that ended the store's transaction itself (PostgreSQL cannot refuse
/// its `COMMIT` or `ROLLBACK`), or of one whose completion changed nothing when that could not
/// be told from a lost lease.
fn ended_by_the_effect() -> Error {
    Error::store(
        BACKEND,
        StoreErrorKind::Other,
        "the effect's transaction was not the store's any more at its end (the effect ran its \
         own COMMIT or ROLLBACK): what it wrote may be committed without its completion; the \
         key is kept with the answer of an unknown outcome (an effect must leave the \
         transaction to the store)",
    )
}

/// How many times a one-commit reservation begins again after a serialization conflict with a
/// reservation committed after its snapshot (each one means the key now has a record to read).
const MAX_CONFLICTS: usize = 2;

/// A serialization failure or deadlock: the transaction is to run again.
fn is_conflict(error: &Error) -> bool {
    matches!(error, Error::Store(e) if e.kind() == StoreErrorKind::TransactionConflict)
}

/// How the effect's transaction starts.
enum Start<'r> {
    /// Two commits: the reservation committed on its own; its lease.
    Reserved(Lease),
    /// One commit (C15): the transaction reserves this request first.
    Reserve(&'r Request),
}

impl Start<'_> {
    fn id(&self) -> &RecordId {
        match self {
            Start::Reserved(lease) => lease.id(),
            Start::Reserve(request) => request.id(),
        }
    }

    /// What a transaction that could not begin (or reserve) did: with two commits, the
    /// acquired execution rolled back; with one, nothing was acquired.
    fn failed<E>(self, error: Error) -> Result<TxEnd<E, PgEffect<E>>, Error> {
        match self {
            Start::Reserved(_) => Ok(TxEnd::RolledBack(error)),
            Start::Reserve(_) => Err(error),
        }
    }
}

/// A transaction that could not begin: the effect, unrun, and why.
struct NotBegun<E> {
    effect: PgEffect<E>,
    error: Error,
    /// Its `BEGIN` found the session ended while idle ([`ended_session`]): the pool's other
    /// idle connections may have ended alike.
    died_idle: bool,
}

impl<E> NotBegun<E> {
    /// A one-commit reservation that failed once its transaction had begun: the session was
    /// alive when the execution took it.
    fn after_begin(effect: PgEffect<E>, error: Error) -> Self {
        Self {
            effect,
            error,
            died_idle: false,
        }
    }
}

/// Rolls `tx` back within what is left of the request's store budget, charged to it: past it
/// the transaction is dropped (its connection then settles in the background or closes, and
/// the server rolls back: a frozen server never holds the caller, C13). `Err`: the ROLLBACK
/// was not answered, the connection is not to be given back at once.
async fn roll_back(
    tx: sqlx::Transaction<'_, sqlx::Postgres>,
    execution: &Execution,
    id: &RecordId,
) -> Result<(), Error> {
    let rollback = async { tx.rollback().await.map_err(store_error) };
    execution
        .bounded(Operation::Transaction, id, |_| rollback)
        .await
}

/// Reads the record with a share lock, waiting at most `wait` for a transaction that holds it
/// (its row, or, for a one-commit execution, its gate's lock on the record).
async fn settled_on(
    conn: &mut PgConnection,
    statement: &Arc<str>,
    store: &PgStore,
    id: &RecordId,
    wait: Duration,
) -> Result<Option<Record>, Error> {
    let millis = wait.as_millis().clamp(1, 3_600_000);
    // A one-commit execution's fresh reservation is a row nobody else sees until it commits,
    // so FOR SHARE cannot wait for it: its gate's lock on the record can. Shared, it waits
    // only for an exclusive holder (a one-commit transaction of this record); then the read
    // (a later snapshot, at READ COMMITTED) sees what that transaction left.
    let gate = GateKeys::record(&store.inner.ops.gate_namespace, id);
    sqlx::raw_sql(AssertSqlSafe(format!(
        "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = {millis}; \
         SELECT pg_advisory_xact_lock_shared({gate})"
    )))
    .execute(&mut *conn)
    .await
    .map_err(store_error)?;
    let read = fetch_all(
        &mut *conn,
        store.inner.ops.mode,
        statement,
        &[
            Param::Text(id.consumer()),
            Param::Text(id.route()),
            Param::Text(id.key()),
        ],
    )
    .await;
    let end = if read.is_ok() { "COMMIT" } else { "ROLLBACK" };
    let ended = sqlx::raw_sql(end)
        .execute(&mut *conn)
        .await
        .map_err(store_error);
    let rows = read?;
    ended?;
    let Some(found) = rows.first() else {
        return Ok(None);
    };
    row::decode(found)?
        .try_map_response(|response| StoredResponse::decode(&row::fetched(response)?))
        .map(Some)
}

/// The reservation's steps inside a one-commit execution's transaction (C15): its gate's locks
/// and its reservation last until that transaction ends; nothing of the store's session
/// settings is sent.
struct OneCommit<'t> {
    ops: &'t Ops,
    conn: &'t mut PgConnection,
    /// Whether a reserve expecting a fresh key sends the insert alone first: at READ
    /// COMMITTED only, where each statement reads a snapshot of its own.
    insert_first: bool,
}

#[async_trait]
impl Steps for OneCommit<'_> {
    async fn reserve(&mut self, claim: &Claim<'_>) -> Result<Reserved, Error> {
        self.ops
            .reserve(self.conn, claim, true, self.insert_first)
            .await
    }

    async fn replace(&mut self, claim: &Claim<'_>, acquire: Acquire) -> Result<Reserved, Error> {
        self.ops
            .replace(
                self.conn,
                "",
                claim.request(),
                claim.token(),
                acquire,
                claim.lease_for(),
            )
            .await
    }
}
