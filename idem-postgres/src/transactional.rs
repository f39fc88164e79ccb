//! The effect and its completion in one PostgreSQL transaction: only the transaction mechanics
//! live here (begin at the store's isolation, effect, fenced completion, commit, and what a
//! failed commit means); the protocol around them is the engine's ([`Idempotency::transact`]),
//! what is stored the engine's `Completion`.

use crate::broken_effect::broken_effect;
use crate::config::Isolation;
use crate::effect_connection::EffectConnection;
use crate::error::{is_broken_link, store_error, BACKEND};
use crate::params::{fetch_all, Param};
use crate::row;
use crate::session;
use crate::store::PgStore;
use idem_core::store::{CatchUnwind, Execution, Lease, Record, Transacted, Transactional, TxEnd};
use idem_core::{
    async_trait, Begin, Error, Idempotency, Operation, Outcome, RecordId, Request, RunError, Store,
    StoreErrorKind, StoredResponse,
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

    async fn transact<E: Send + 'static>(
        &self,
        request: &Request,
        effect: PgEffect<E>,
        execution: Execution,
    ) -> Result<Transacted<E, Self::Effect<E>>, Error> {
        let reserved = execution
            .bounded(
                Operation::Reserve,
                request.id(),
                self.reserve(request, execution.lease_for()),
            )
            .await?;
        let lease = match reserved {
            Begin::Answered(answer) => return Ok(Transacted::Answered(answer, effect)),
            Begin::Acquired(lease) => execution.acquired(lease),
        };
        let end = self.in_transaction(&lease, effect, &execution).await;
        Ok(Transacted::Acquired { lease, end })
    }

    async fn settled(&self, id: &RecordId, wait: Duration) -> Result<Option<Record>, Error> {
        let mut held = self.connections().get().await?;
        let result = settled_on(
            held.conn(),
            &self.inner.ops.sql.select_settled,
            self,
            id,
            wait,
        )
        .await;
        held.finish(&result);
        result
    }
}

impl PgStore {
    /// Begin, effect, completion, commit, on one of the store's connections for transactions,
    /// given back only if the transaction ended cleanly: committed, or rolled back with the
    /// server's answer. Anything else (a statement cut off by the engine's deadline, a broken
    /// link, a COMMIT in doubt, a panic, the execution dropped) closes it, so a connection stuck
    /// behind a dead link or a row lock never holds a slot (C13). Taken and given back without
    /// a round trip (sqlx's pool would ping it on its return: a message more per fresh key).
    async fn in_transaction<E: Send + 'static>(
        &self,
        lease: &Lease,
        effect: PgEffect<E>,
        execution: &Execution,
    ) -> TxEnd<E> {
        let mut effect = effect;
        let conns = &self.inner.tx_conns;
        // A connection that died while idle fails its BEGIN at once: nothing ran, so the
        // transaction begins again, once, on another connection (a newly opened one of the
        // store's own).
        for attempt in 0..2 {
            let acquire = async {
                if self.inner.effects_on_pool {
                    let conn = self.pool().acquire().await.map_err(store_error)?;
                    return Ok(EffectConnection::pool(conn));
                }
                let held = if attempt == 0 {
                    conns.get().await?
                } else {
                    conns.get_fresh().await?
                };
                Ok(EffectConnection::own(held))
            };
            let mut conn = match execution
                .bounded(Operation::Transaction, lease.id(), acquire)
                .await
            {
                Ok(conn) => conn,
                Err(error) => return TxEnd::RolledBack(error),
            };
            match self
                .transaction_on(conn.conn(), lease, effect, execution)
                .await
            {
                Ok((end, clean)) => {
                    if clean {
                        conn.keep();
                    }
                    return end;
                }
                Err(NotBegun {
                    effect: back,
                    error,
                }) => {
                    if attempt > 0 || !is_broken_link(&error) {
                        return TxEnd::RolledBack(error);
                    }
                    effect = back;
                }
            }
        }
        TxEnd::RolledBack(Error::store(
            BACKEND,
            StoreErrorKind::Unavailable,
            "the transaction could not begin",
        ))
    }

    /// The transaction on `conn`: its end, and whether it ended cleanly (committed, or rolled
    /// back with the server's answer), so that `conn` may serve another; or, if it could not
    /// begin, the effect back, unrun.
    async fn transaction_on<E: Send + 'static>(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        effect: PgEffect<E>,
        execution: &Execution,
    ) -> Result<(TxEnd<E>, bool), NotBegun<E>> {
        let id = lease.id();
        let deadlines = &self.inner.config.deadlines;
        let statement = session::effect_begin(self.isolation().begin_statement(), deadlines);
        let begin = async {
            conn.begin_with(AssertSqlSafe(statement))
                .await
                .map_err(store_error)
        };
        let mut tx = match execution.bounded(Operation::Transaction, id, begin).await {
            Ok(tx) => tx,
            Err(error) => return Err(NotBegun { effect, error }),
        };
        // The effect's own statements have no deadline of the store's, and a connection whose
        // server is gone never answers them (sqlx sets no TCP keepalive): the whole effect is
        // bounded by the transaction timeout instead. No COMMIT was sent, nothing committed.
        let ran = tokio::time::timeout(
            deadlines.transaction,
            CatchUnwind::new(effect(&mut tx, lease)),
        )
        .await;
        // Nothing committed, but what the effect did outside the database is unknown: the key
        // is kept with the 500 of an unknown outcome, never given back (C8).
        let Ok(ran) = ran else {
            return Ok((
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
            ));
        };
        let response = match ran {
            Ok(Ok(response)) => response,
            // Nothing was committed either way; whether the database is still there says
            // what the caller is told: the effect's failure, or the store's (C13).
            Ok(Err(error)) => {
                return Ok(match roll_back(tx, execution).await {
                    Ok(()) => (TxEnd::EffectFailed(error), true),
                    Err(broken) => (TxEnd::RolledBack(broken_effect(&error, broken)), false),
                });
            }
            // Dropping the transaction rolls it back (its connection is closed).
            Err(panic) => return Ok((TxEnd::Panicked(panic), false)),
        };
        let completion = execution.completion(lease, response);
        let written = execution
            .bounded(
                Operation::Complete,
                id,
                self.inner.ops.complete_in(&mut tx, &completion),
            )
            .await;
        if let Err(error) = written {
            let clean = roll_back(tx, execution).await.is_ok();
            return Ok((TxEnd::RolledBack(error), clean));
        }
        let commit = async { tx.commit().await };
        Ok(
            match tokio::time::timeout(execution.store_timeout(), commit).await {
                Ok(Ok(())) => (TxEnd::Committed(completion), true),
                // Whatever the error, the record tells: a server's own error may come after the
                // commit (a pooler whose server connection broke answers FATAL 08P01), and the
                // connection may have failed after the COMMIT reached the server. The engine reads
                // the record once no transaction holds it.
                Ok(Err(error)) => (
                    TxEnd::InDoubt {
                        completion,
                        error: store_error(error),
                    },
                    false,
                ),
                Err(_) => (
                    TxEnd::InDoubt {
                        completion,
                        error: Error::store(
                            BACKEND,
                            StoreErrorKind::Unavailable,
                            "the COMMIT was not answered within the store timeout",
                        ),
                    },
                    false,
                ),
            },
        )
    }
}

/// A transaction that could not begin: the effect, unrun, and why.
struct NotBegun<E> {
    effect: PgEffect<E>,
    error: Error,
}

/// Rolls `tx` back, waiting at most the store timeout: past it the transaction is dropped (its
/// connection is then closed, and the server rolls back by itself: a frozen server never holds
/// the caller, C13). `Err`: the ROLLBACK was not answered, the connection is not to be reused.
async fn roll_back(
    tx: sqlx::Transaction<'_, sqlx::Postgres>,
    execution: &Execution,
) -> Result<(), Error> {
    match tokio::time::timeout(execution.store_timeout(), tx.rollback()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(store_error(error)),
        Err(_) => Err(Error::store(
            BACKEND,
            StoreErrorKind::Unavailable,
            "the ROLLBACK was not answered within the store timeout",
        )),
    }
}

/// Reads the record with a share lock, waiting at most `wait` for a transaction that holds it.
async fn settled_on(
    conn: &mut PgConnection,
    statement: &str,
    store: &PgStore,
    id: &RecordId,
    wait: Duration,
) -> Result<Option<Record>, Error> {
    let millis = wait.as_millis().clamp(1, 3_600_000);
    sqlx::raw_sql(AssertSqlSafe(format!(
        "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = {millis}"
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
