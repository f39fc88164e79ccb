//! The effect and its completion in one SQLite transaction, for a caller that already holds
//! the lease (a handler under the HTTP layer, a guard-style caller): one call, one flat result.

use crate::error::store_error;
use crate::ops;
use crate::transactional::rolled_back_under_the_effect;
use crate::SqliteStore;
use idem_core::store::{Completion, Lease};
use idem_core::{Error, Idempotency, Store, StoredResponse};
use rusqlite::{Transaction, TransactionBehavior};

impl SqliteStore {
    /// Runs `effect` and writes its completion **in one transaction** on the store's writer,
    /// then commits (C6): for a caller that already holds `lease` of `idem`'s (a handler under
    /// the HTTP layer, whose `Reservation` has the one-call form of this, or a guard-style
    /// caller after [`Idempotency::begin`]). The transaction is `BEGIN IMMEDIATE`, so it holds
    /// SQLite's write lock from its first statement and never fails half way to upgrade it.
    ///
    /// - `effect` returns the response: it becomes the engine's [`Completion`] (the policy's
    ///   header rules, C7), written in the same transaction and committed with the effect;
    ///   the completion is returned (the response as stored is [`Completion::response`]).
    /// - `effect` returns an error: the transaction rolls back, the effect with it, and the
    ///   error is returned: nothing happened, so release the key (under the layer, answer
    ///   `NothingHappened`).
    /// - The lease is lost ([`Error::LeaseLost`]: another attempt took the record over), the
    ///   writer stayed busy past the policy's `store_timeout`, SQLite rolled the transaction
    ///   back under the effect, or the commit failed: rolled back, and the [`Error`] returned
    ///   as an `E` (`E: From<Error>`). A release after a commit that did land is fenced, so
    ///   the retry replays it.
    ///
    /// The work runs on the store's writer thread and runs to its end even if the caller's
    /// future is dropped once it started. It holds the one writer while `effect` runs: keep `effect` short and free of
    /// calls outside the database. A guard-style caller reports the end with
    /// [`Idempotency::committed`] after it returns; the HTTP layer and the engine's closures do
    /// that themselves.
    ///
    /// ```
    /// use idem_core::{Begin, Idempotency, StoredResponse};
    /// use idem_sqlite::SqliteStore;
    /// type BoxError = Box<dyn std::error::Error + Send + Sync>;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), BoxError> {
    /// # let dir = tempfile::tempdir()?;
    /// let idem = Idempotency::new(SqliteStore::open(dir.path().join("shop.db")).await?);
    /// idem.store().try_call(|db| db.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY)")).await?;
    /// let request = idem.request("acct_1", "POST", "/orders").key(Some("o-1")).body(b"{}").build()?;
    /// if let Begin::Acquired(lease) = idem.begin(&request).await? {
    ///     let completion = idem.store().complete_in_transaction(&idem, &lease, |tx| {
    ///         tx.execute("INSERT INTO orders DEFAULT VALUES", [])?;
    ///         Ok::<_, BoxError>(StoredResponse::new(201, "created"))
    ///     }).await?;
    ///     idem.committed(&completion);
    ///     assert_eq!(completion.response().status, 201);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn complete_in_transaction<S, F, E>(
        &self,
        idem: &Idempotency<S>,
        lease: &Lease,
        effect: F,
    ) -> Result<Completion, E>
    where
        S: Store + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<StoredResponse, E> + Send + 'static,
        E: From<Error> + Send + 'static,
    {
        let pool = &self.inner.pool;
        let (inner, idem, lease) = (
            std::sync::Arc::clone(&self.inner),
            idem.clone(),
            lease.clone(),
        );
        pool.write_within(
            idem.policy().store_timeout,
            move |conn| -> Result<Completion, E> {
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(store_error)?;
                let response = effect(&tx)?;
                // SQLite may have rolled the transaction back under the effect (an `ON CONFLICT
                // ROLLBACK`, `RAISE(ROLLBACK)`, a full disk): the completion must not commit alone.
                if tx.is_autocommit() {
                    return Err(rolled_back_under_the_effect().into());
                }
                let completion = idem.completion(&lease, response);
                ops::complete(&tx, &inner.sql, inner.config.clock.now(), &completion)?;
                tx.commit().map_err(store_error)?;
                Ok(completion)
            },
        )
        .await?
    }
}

/// So that code generic over "a store that is SQLite underneath" (an `Arc<SqliteStore>`, a
/// decorator of one) reaches it: `idem_tower::Reservation::sqlite_transaction` takes any such
/// store.
impl AsRef<SqliteStore> for SqliteStore {
    fn as_ref(&self) -> &SqliteStore {
        self
    }
}
