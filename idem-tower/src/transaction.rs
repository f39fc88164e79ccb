//! A SQL store (`Transactional`): the handler's effect and its completion in one transaction,
//! in one call.

use crate::marker::Completed;
use crate::reservation::Reservation;
use idem_core::store::Transactional;
use idem_core::RunError;
use std::future::Future;

impl<S: Transactional + 'static> Reservation<S> {
    /// The transactional form, in one call: opens a transaction of the store (SQLite: `BEGIN
    /// IMMEDIATE` on its writer; PostgreSQL: one of its connections), runs `effect` in it,
    /// writes this reservation's completion with `effect`'s response in the same transaction
    /// and commits (C6). Return the [`Completed`] from the handler: the layer sends the
    /// response exactly as stored and never completes twice.
    ///
    /// An `Err` is the engine's answer for the key ([`Idempotency::complete_transaction`](
    /// idem_core::Idempotency::complete_transaction)): [`RunError::Released`] (`effect`'s
    /// error, rolled back) and [`RunError::Idem`] (a lost lease, the store down before the
    /// commit) mean nothing happened, and the key is already given back: answer them marked
    /// [`NothingHappened`](crate::NothingHappened) or plainly. [`RunError::InDoubt`] means the
    /// effect may have happened (it committed by itself, or was abandoned at the store's
    /// deadline): the key is kept with the 500 of an unknown outcome, which every retry
    /// replays (C8).
    ///
    /// On SQLite `effect` is synchronous and runs on the writer thread, holding SQLite's one
    /// write lock: keep it to the database work. Once started it runs to its end even if the
    /// client disconnects.
    ///
    /// ```
    /// use axum::http::StatusCode;
    /// use axum::response::{IntoResponse, Response};
    /// use idem_core::{RunError, StoredResponse};
    /// use idem_sqlite::{rusqlite::{self, params}, SqliteStore};
    /// use idem_tower::{NothingHappened, Reservation};
    ///
    /// async fn create_charge(reservation: Reservation<SqliteStore>) -> Response {
    ///     let charged = reservation.transaction(Box::new(|tx, _lease| {
    ///         tx.execute("INSERT INTO charges (cents) VALUES (?1)", params![2500])?;
    ///         Ok::<_, rusqlite::Error>(StoredResponse::new(201, r#"{"charged":2500}"#))
    ///     })).await;
    ///     match charged {
    ///         Ok(completed) => completed.into_response(),
    ///         // Rolled back: nothing happened, the key is free for the retry.
    ///         Err(RunError::Released(_) | RunError::Idem(_)) => {
    ///             (StatusCode::SERVICE_UNAVAILABLE, NothingHappened, "try again").into_response()
    ///         }
    ///         // It may have happened: the key keeps the answer in doubt.
    ///         Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    ///     }
    /// }
    /// ```
    pub fn transaction<E: Send + 'static>(
        &self,
        effect: S::Effect<E>,
    ) -> impl Future<Output = Result<Completed, RunError<E>>> + Send + 'static {
        let completed = self.idem().complete_transaction(&self.lease(), effect);
        async move { completed.await.map(Completed) }
    }
}
