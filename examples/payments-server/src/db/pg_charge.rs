//! The completion in the handler's own transaction, on PostgreSQL: the charge's row and the
//! idempotency completion commit together or not at all (C6). docs/http.md ("The completion in
//! the handler's own transaction") shows this form and links here; it uses only the public API
//! of idem (features `postgres` and `axum`) and sqlx.

use super::unavailable::{Unreachable, READ_DEADLINE};
use idem::postgres::sqlx::{self, postgres::PgArguments, query::Query};
use idem::postgres::PgStore;
use idem::tower::Reservation;
use idem::{Completion, StoredResponse};
use idem_outbox::{Message, PgOutbox};
use std::time::Duration;

/// Runs `effect` (the charge's `INSERT`) and completes `reservation` with `response` in one
/// transaction on the store's pool, then commits. Any error before the commit rolls both back:
/// the handler answers it marked `NothingHappened`, and the key is released (fenced, so a commit
/// that did land stays completed). A completion fenced out (`LeaseLost`: another attempt took the
/// lease over) is such an error. `webhook` (the charge's event and its outbox) is enqueued in
/// the same transaction. `delay` (a test hook) sleeps between the effect and the completion,
/// inside the transaction. The transaction is given [`READ_DEADLINE`] (and the delay): past it,
/// [`Unreachable`].
pub(crate) async fn charge_and_complete(
    reservation: &Reservation<PgStore>,
    effect: Query<'_, sqlx::Postgres, PgArguments>,
    webhook: Option<(&PgOutbox, Message)>,
    response: StoredResponse,
    delay: Option<Duration>,
) -> Result<Completion, Box<dyn std::error::Error + Send + Sync>> {
    // A connection gone silent mid-transaction never answers (sqlx sets no deadline of its
    // own): the whole transaction is bounded, and past it given up as unavailable, dropped
    // (rolled back) without a COMMIT. The key given back is fenced: a completion that did
    // commit stays, and one that did not has nothing to keep.
    let deadline = READ_DEADLINE + delay.unwrap_or_default();
    let charged = tokio::time::timeout(deadline, async {
        let completion = reservation.completion(response); // filtered by the policy (C7)
        let store = reservation.idem().store();
        let mut tx = store.pool().begin().await?;
        let inserted = effect.execute(&mut *tx).await?.rows_affected() == 1;
        if let (true, Some((outbox, event))) = (inserted, webhook) {
            // Committed with the charge, or not at all; once per charge row, whoever inserted
            // it (the reconciler enqueues it with the row it records).
            outbox.enqueue(&mut tx, &event).await?;
        }
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        store.complete_in(&mut tx, &completion).await?; // fenced (C6)
        tx.commit().await?;
        Ok(completion)
    })
    .await;
    charged.unwrap_or_else(|_| {
        Err(Unreachable(format!("the charge's transaction took over {deadline:?}")).into())
    })
}
