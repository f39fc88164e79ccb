//! The closure form with completion in the effect's own transaction: the reservation and the
//! effect's transaction in one thread hop, on the writer. Only the transaction mechanics live
//! here; what is stored is the engine's `Completion`.

use crate::error::store_error;
use crate::ops;
use crate::SqliteStore;
use idem_core::store::{Decision, Lease};
use idem_core::{
    async_trait, Begin, Idempotency, Outcome, Request, RunError, Store, StoredResponse,
};
use rusqlite::{Transaction, TransactionBehavior};
use std::borrow::Borrow;
use std::sync::Arc;

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
#[async_trait]
pub trait SqliteIdempotency {
    /// Closure style: reserve; when acquired, open a write transaction (`BEGIN IMMEDIATE`) on
    /// the store's writer, run `effect` in it, write the completion in it and commit, all in one
    /// thread hop that runs to its end even if the caller's future is dropped.
    ///
    /// - `Ok(response)`: committed with the effect; [`Outcome::Executed`] with the response as
    ///   stored (an unstorable response is stored as a 500, C8).
    /// - `Err(e)` from `effect`: the transaction rolls back, the effect with it, so nothing
    ///   happened: the key is released and [`RunError::Released`] returned; a retry runs.
    /// - A lost lease or a failed commit: rolled back, released where still ours,
    ///   [`RunError::Idem`].
    /// - A panic in `effect`: rolled back; the reservation passes with its lease (C9) and the
    ///   panic resumes in the caller.
    ///
    /// The effect holds SQLite's write lock while it runs: keep it short, and within the lease
    /// (a renewal would wait for that same lock). Replays, in-flight answers and mismatches are
    /// answered without waiting for it.
    async fn run_in_transaction<F, E>(
        &self,
        request: &Request,
        effect: F,
    ) -> Result<Outcome, RunError<E>>
    where
        F: FnOnce(&Transaction<'_>, &Lease) -> Result<StoredResponse, E> + Send + 'static,
        E: Send + 'static;
}

#[async_trait]
impl<S> SqliteIdempotency for Idempotency<S>
where
    S: Store + Borrow<SqliteStore> + 'static,
{
    async fn run_in_transaction<F, E>(
        &self,
        request: &Request,
        effect: F,
    ) -> Result<Outcome, RunError<E>>
    where
        F: FnOnce(&Transaction<'_>, &Lease) -> Result<StoredResponse, E> + Send + 'static,
        E: Send + 'static,
    {
        self.admit(request).map_err(RunError::Idem)?;
        let store: &SqliteStore = self.store().borrow();
        let pool = &store.inner.pool;
        let writer = match pool.try_writer() {
            Some(writer) => writer,
            None => {
                let (inner, req) = (Arc::clone(&store.inner), request.clone());
                let decision = pool
                    .read(move |conn| {
                        ops::decide_on(conn, &inner.sql, &req, inner.config.clock.now())
                    })
                    .await
                    .and_then(|decided| decided)
                    .map_err(RunError::Idem)?;
                if let Decision::Answer(answer) = decision {
                    return self
                        .screen(answer)
                        .map(Outcome::Answered)
                        .map_err(RunError::Idem);
                }
                pool.writer().await
            }
        };
        let (inner, idem, req) = (Arc::clone(&store.inner), self.clone(), request.clone());
        let lease_for = self.policy().lease;
        pool.write(writer, move |conn| {
            let clock = inner.config.clock.as_ref();
            let lease = match ops::reserve(conn, &inner.sql, clock, &req, lease_for)
                .map_err(RunError::Idem)?
            {
                Begin::Answered(answer) => {
                    return idem
                        .screen(answer)
                        .map(Outcome::Answered)
                        .map_err(RunError::Idem)
                }
                Begin::Acquired(lease) => lease,
            };
            let committed = (|| {
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(|e| RunError::Idem(store_error(e)))?;
                let response = effect(&tx, &lease).map_err(RunError::Released)?;
                let completion = idem.completion(&lease, response);
                ops::complete(&tx, &inner.sql, clock.now(), &completion).map_err(RunError::Idem)?;
                tx.commit().map_err(|e| RunError::Idem(store_error(e)))?;
                Ok(Outcome::Executed(completion.into_response()))
            })();
            if committed.is_err() {
                // The transaction rolled back as it dropped, and the effect with it: nothing
                // happened, so the key goes back for a retry. Fenced: a lost lease changes
                // nothing.
                let _ = ops::release(conn, &inner.sql, &lease);
            }
            committed
        })
        .await
        .map_err(RunError::Idem)?
    }
}
