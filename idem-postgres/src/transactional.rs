//! The closure form with completion in the effect's own transaction. Only the transaction
//! mechanics live here; what is stored is the engine's `Completion`.

use crate::config::Isolation;
use crate::error::store_error;
use crate::store::PgStore;
use idem_core::store::Lease;
use idem_core::{async_trait, Idempotency, Outcome, Request, RunError, Store, StoredResponse};
use sqlx::{AssertSqlSafe, PgConnection};
use std::borrow::Borrow;
use std::future::Future;
use std::pin::Pin;

/// The future an effect returns: it borrows the transaction's connection and the lease.
pub type EffectFuture<'c, E> = Pin<Box<dyn Future<Output = Result<StoredResponse, E>> + Send + 'c>>;

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
#[async_trait]
pub trait PgIdempotency {
    /// Closure style: reserve (one round trip); when acquired, open a transaction at the
    /// store's [`Isolation`](crate::Isolation), run `effect` in it, write the completion in it
    /// and commit. Runs on a task of its own ([`Idempotency::drain`] waits for it), so a dropped
    /// caller does not cancel it. At READ COMMITTED it keeps the lease alive while the effect
    /// runs; at REPEATABLE READ and SERIALIZABLE a renewal would conflict with the
    /// transaction's snapshot, so there the lease must cover the effect.
    ///
    /// - `Ok(response)`: committed with the effect; [`Outcome::Executed`].
    /// - `Err(e)` from `effect`: the transaction rolls back, the effect with it, so nothing
    ///   happened: the key is released and [`RunError::Released`] returned.
    /// - A lost lease, a serialization failure or deadlock
    ///   ([`StoreErrorKind::TransactionConflict`](idem_core::StoreErrorKind::TransactionConflict): retry the whole request), a failed commit that
    ///   did not commit: rolled back, released where still ours, [`RunError::Idem`].
    /// - A commit whose outcome the connection lost: the record tells whether it committed
    ///   ([`Outcome::Executed`]) or not (released); if even that cannot be read,
    ///   [`RunError::Incomplete`] and the key is kept.
    async fn run_in_transaction<F, E>(
        &self,
        request: &Request,
        effect: F,
    ) -> Result<Outcome, RunError<E>>
    where
        F: for<'c> FnOnce(&'c mut PgConnection, &'c Lease) -> EffectFuture<'c, E> + Send + 'static,
        E: Send + 'static;
}

#[async_trait]
impl<S> PgIdempotency for Idempotency<S>
where
    S: Store + Borrow<PgStore> + 'static,
{
    async fn run_in_transaction<F, E>(
        &self,
        request: &Request,
        effect: F,
    ) -> Result<Outcome, RunError<E>>
    where
        F: for<'c> FnOnce(&'c mut PgConnection, &'c Lease) -> EffectFuture<'c, E> + Send + 'static,
        E: Send + 'static,
    {
        self.run_detached(request, move |idem, lease| async move {
            // The heartbeat renews the record from another connection. At REPEATABLE READ and
            // SERIALIZABLE that update, made after the transaction's snapshot, would turn the
            // completion into a serialization failure every time: there the lease must cover
            // the effect (docs/stores.md, PostgreSQL, Isolation).
            let store: &PgStore = idem.store().borrow();
            let keeper = (store.isolation() == Isolation::ReadCommitted)
                .then(|| idem.keep_alive(lease.clone()));
            let result = in_transaction(&idem, &lease, effect).await;
            drop(keeper);
            result
        })
        .await
    }
}

/// Begin, effect, completion, commit; on anything but a commit, roll back and release.
async fn in_transaction<S, F, E>(
    idem: &Idempotency<S>,
    lease: &Lease,
    effect: F,
) -> Result<Outcome, RunError<E>>
where
    S: Store + Borrow<PgStore> + 'static,
    F: for<'c> FnOnce(&'c mut PgConnection, &'c Lease) -> EffectFuture<'c, E>,
{
    let store: &PgStore = idem.store().borrow();
    let begun = store
        .pool()
        .begin_with(AssertSqlSafe(store.isolation().begin_statement()))
        .await
        .map_err(store_error);
    let mut tx = match begun {
        Ok(tx) => tx,
        Err(error) => {
            let _ = idem.release(lease.clone()).await;
            return Err(RunError::Idem(error));
        }
    };
    let response = match effect(&mut tx, lease).await {
        Ok(response) => response,
        Err(error) => {
            let _ = tx.rollback().await;
            let _ = idem.release(lease.clone()).await;
            return Err(RunError::Released(error));
        }
    };
    let completion = idem.completion(lease, response);
    if let Err(error) = store.complete_in(&mut tx, &completion).await {
        let _ = tx.rollback().await;
        // Fenced: after a lost lease this changes nothing.
        let _ = idem.release(lease.clone()).await;
        return Err(RunError::Idem(error));
    }
    match tx.commit().await {
        Ok(()) => Ok(Outcome::Executed(completion.into_response())),
        Err(commit_error) => after_failed_commit(idem, lease, completion, commit_error).await,
    }
}

/// A commit that returned an error may still have committed (the connection dropped after the
/// server committed). The record says which: completed with our token, it committed; still in
/// progress with our token, it did not, so nothing happened and the key goes back.
async fn after_failed_commit<S, E>(
    idem: &Idempotency<S>,
    lease: &Lease,
    completion: idem_core::Completion,
    commit_error: sqlx::Error,
) -> Result<Outcome, RunError<E>>
where
    S: Store + Borrow<PgStore> + 'static,
{
    let error = store_error(commit_error);
    match idem.store().lookup(lease.id()).await {
        Ok(Some(record)) if record.token == lease.token() && record.is_completed() => {
            Ok(Outcome::Executed(completion.into_response()))
        }
        Ok(Some(record)) if record.token == lease.token() => {
            let _ = idem.release(lease.clone()).await;
            Err(RunError::Idem(error))
        }
        Ok(_) => Err(RunError::Idem(error)),
        Err(_) => Err(RunError::Incomplete(error)),
    }
}
