//! SQLite (feature `sqlite`): the handler's effect and its completion in one transaction, in
//! one call.

use crate::marker::Completed;
use crate::reservation::Reservation;
use idem_core::{Error, Store, StoredResponse};
use idem_sqlite::rusqlite::Transaction;
use idem_sqlite::SqliteStore;

impl<S: Store + AsRef<SqliteStore> + 'static> Reservation<S> {
    /// The transactional form on SQLite, in one call: opens a `BEGIN IMMEDIATE` transaction
    /// on the store's writer, runs `effect` in it, writes the reservation's completion with
    /// `effect`'s response in the same transaction and commits (C6); return the [`Completed`]
    /// from the handler, and the layer sends the response exactly as stored.
    ///
    /// An `Err` means nothing committed: `effect`'s own error (its transaction rolled back),
    /// or idem's [`Error`] as an `E` (the lease lost to a takeover, the writer busy past the
    /// policy's `store_timeout`, a failed commit). Answer it marked
    /// [`NothingHappened`](crate::NothingHappened): the key is released (fenced: if a commit
    /// did land after all, the record stays completed and the retry replays it).
    ///
    /// `effect` is synchronous and runs on the store's writer thread, holding SQLite's one write
    /// lock: keep it to the database work (no calls to other systems). Once started it runs to
    /// its end even if the client disconnects. See `SqliteStore::complete_in_transaction` for the guard style.
    ///
    /// ```
    /// use axum::http::StatusCode;
    /// use axum::response::{IntoResponse, Response};
    /// use idem_core::StoredResponse;
    /// use idem_sqlite::{rusqlite::params, SqliteStore};
    /// use idem_tower::{NothingHappened, Reservation};
    /// type BoxError = Box<dyn std::error::Error + Send + Sync>;
    ///
    /// async fn create_charge(reservation: Reservation<SqliteStore>) -> Response {
    ///     let charged = reservation.sqlite_transaction(|tx| {
    ///         tx.execute("INSERT INTO charges (cents) VALUES (?1)", params![2500])?;
    ///         Ok::<_, BoxError>(StoredResponse::new(201, r#"{"charged":2500}"#))
    ///     }).await;
    ///     match charged {
    ///         Ok(completed) => completed.into_response(),
    ///         // Rolled back: nothing happened, the key is released.
    ///         Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, NothingHappened, "try again").into_response(),
    ///     }
    /// }
    /// ```
    pub async fn sqlite_transaction<F, E>(&self, effect: F) -> Result<Completed, E>
    where
        F: FnOnce(&Transaction<'_>) -> Result<StoredResponse, E> + Send + 'static,
        E: From<Error> + Send + 'static,
    {
        let idem = self.idem();
        let completion = idem
            .store()
            .as_ref()
            .complete_in_transaction(idem, &self.lease(), effect)
            .await?;
        Ok(Completed(completion))
    }
}
