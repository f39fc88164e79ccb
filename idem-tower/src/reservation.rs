//! The reservation a protected request runs under, for handlers that complete in their own
//! transaction.

use idem_core::{Completion, Context, Error, Lease, Store, StoredResponse};
use std::fmt;

/// The reservation of the request being executed, in the request's extensions (and an axum
/// extractor with feature `axum`). A handler that writes its effect in a database transaction
/// makes the [`completion`](Self::completion) here, writes it in that transaction with its
/// store's `complete_in`, commits, and returns [`Completed`](crate::Completed).
///
/// The lease is renewed by the engine's heartbeat while the handler runs (C9).
pub struct Reservation<S> {
    context: Context<S>,
}

impl<S> Reservation<S> {
    pub(crate) fn new(context: Context<S>) -> Self {
        Self { context }
    }

    /// The lease the request runs under, as of its last renewal.
    pub fn lease(&self) -> Lease {
        self.context.lease()
    }

    /// The idempotency key to send a downstream provider (a card network, a payment provider)
    /// for this request's effect, instead of the client's raw key: `idem_` and 32 lowercase
    /// hex digits, derived from the consumer, the route and the key, so it is the same on every
    /// retry and every takeover of this record (a takeover after a crash that calls the
    /// provider again is answered the first call's result) and another for another consumer,
    /// who may well pick the same key (see `idem_core::Lease::downstream_key`).
    ///
    /// ```
    /// use idem_tower::Reservation;
    /// # type Store = idem_core::MemoryStore;
    /// async fn create_charge(reservation: Reservation<Store>) -> String {
    ///     let key = reservation.downstream_key();
    ///     // provider.charges().create(params).idempotency_key(&key).send().await ...
    ///     key
    /// }
    /// ```
    pub fn downstream_key(&self) -> String {
        self.context.downstream_key()
    }
}

impl<S: Store> Reservation<S> {
    /// The completion of this reservation with `response`, filtered by the policy's header
    /// rules and encoded (C7): what the transaction writes and what every retry replays.
    pub fn completion(&self, response: StoredResponse) -> Completion {
        self.context.completion(response)
    }

    /// The engine (its store, for the transaction; its policy).
    pub fn idem(&self) -> &idem_core::Idempotency<S> {
        self.context.idem()
    }

    /// Extends the lease now. [`Error::LeaseLost`] means another attempt took the key over:
    /// roll back and stop.
    pub async fn renew(&mut self) -> Result<(), Error> {
        self.context.renew().await
    }
}

impl<S> Clone for Reservation<S> {
    fn clone(&self) -> Self {
        Self {
            context: self.context.clone(),
        }
    }
}

impl<S> fmt::Debug for Reservation<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("lease", &self.lease())
            .finish()
    }
}
