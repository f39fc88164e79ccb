//! Completion in the effect's own transaction, for the engine: guard and closure styles.

use crate::SqliteStore;
use idem_core::{
    async_trait, Error, Idempotency, Lease, Outcome, Request, RunError, StoredResponse,
};
use rusqlite::{Transaction, TransactionBehavior};
use std::ops::ControlFlow;

/// What `Idempotency<SqliteStore>` adds to the engine: the effect and the completion in one
/// SQLite transaction (C6).
///
/// ```
/// use idem_core::{Idempotency, Outcome, StoredResponse};
/// use idem_sqlite::{SqliteIdempotency, SqliteStore};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let store = SqliteStore::open(dir.path().join("shop.db")).await?;
/// store.call(|db| db.execute_batch("CREATE TABLE charges (id INTEGER PRIMARY KEY, cents INTEGER)")).await??;
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
    /// Guard style: complete inside the caller's transaction `tx`, after
    /// [`Idempotency::prepare`] (header allow-list, validation). Returns the response to send:
    /// exactly what a replay will send. On any error, roll `tx` back.
    fn complete_in(
        &self,
        tx: &Transaction<'_>,
        lease: &Lease,
        response: StoredResponse,
    ) -> Result<StoredResponse, Error>;

    /// Closure style: begin; when acquired, open a write transaction on one of the store's
    /// connections, run `effect` in it, complete in it and commit, in one thread hop. An `Err`
    /// from `effect`, an invalid response or a lost lease roll the transaction back (the effect
    /// vanishes) and release the reservation where it is still ours, so a retry can run.
    ///
    /// The effect holds SQLite's write lock while it runs: keep it short, and within the lease
    /// (a renewal would wait for that same lock).
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
impl SqliteIdempotency for Idempotency<SqliteStore> {
    fn complete_in(
        &self,
        tx: &Transaction<'_>,
        lease: &Lease,
        response: StoredResponse,
    ) -> Result<StoredResponse, Error> {
        let response = self.prepare(response)?;
        self.store()
            .complete_in(tx, lease, &response, self.policy().retention)?;
        Ok(response)
    }

    async fn run_in_transaction<F, E>(
        &self,
        request: &Request,
        effect: F,
    ) -> Result<Outcome, RunError<E>>
    where
        F: FnOnce(&Transaction<'_>, &Lease) -> Result<StoredResponse, E> + Send + 'static,
        E: Send + 'static,
    {
        let lease = match self
            .begin(request)
            .await
            .map_err(RunError::Idem)?
            .next_step()
        {
            ControlFlow::Continue(lease) => lease,
            ControlFlow::Break(outcome) => return Ok(outcome),
        };
        let (store, policy) = (self.store().clone(), self.shared_policy());
        self.store()
            .call(move |conn| {
                let result = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(|e| RunError::Idem(Error::unavailable(e)))
                    .and_then(|tx| {
                        let response = effect(&tx, &lease).map_err(RunError::Handler)?;
                        let stored = policy.prepare(response).map_err(RunError::Idem)?;
                        store
                            .complete_in(&tx, &lease, &stored, policy.retention)
                            .map_err(RunError::Idem)?;
                        tx.commit()
                            .map_err(|e| RunError::Idem(Error::unavailable(e)))?;
                        Ok(Outcome::Executed(stored))
                    });
                if result.is_err() {
                    // The transaction rolled back as it dropped, and the effect with it: give
                    // the key back for a retry. Fenced, so a lost lease changes nothing.
                    let _ = store.release_on(conn, &lease);
                }
                result
            })
            .await
            .map_err(RunError::Idem)?
    }
}
