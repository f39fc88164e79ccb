//! The reconciler of the charges in doubt: a charge whose card network call went unanswered is
//! stored in doubt (its 502 replayed to every retry, docs/state-machine.md C8); this asks the
//! network about it by the key the handler sent (`InDoubt::downstream_key`, also the doubt's
//! note) and says what it found:
//!
//! - authorised: the charge row is recorded (idempotently: the charge's id is derived from the
//!   authorization's, so a crash between this insert and the settlement makes no second row
//!   at the next pass), and the record is settled with the 200 the handler would have stored,
//!   built from the row: every retry replays the real charge;
//! - no authorization under the key: the charge never went through; the key is released and
//!   the client's next retry charges;
//! - no answer from the network, or the charge could not be recorded: still unknown, asked
//!   again after the backoff.
//!
//! The server runs it every `--reconcile-every` seconds; with the test hooks,
//! `POST /test/reconcile` runs one pass now and answers its report.

use crate::charge::Charge;
use crate::db::{is_unavailable, Backend};
use crate::network::{Authorization, Network};
use idem::ops::{Finding, InDoubt, Reconcile, Reconciled};
use std::sync::Arc;

/// The reconciler: the card network to ask, the database to record charges in.
pub(crate) struct Reconciler<B> {
    backend: Arc<B>,
    network: Arc<Network>,
}

impl<B> Clone for Reconciler<B> {
    fn clone(&self) -> Self {
        Self {
            backend: self.backend.clone(),
            network: self.network.clone(),
        }
    }
}

impl<B: Backend> Reconciler<B> {
    /// A reconciler asking `network` and recording in `backend`.
    pub(crate) fn new(backend: Arc<B>, network: Arc<Network>) -> Self {
        Self { backend, network }
    }

    /// The finding of an authorization the network made under `case`'s key: the charge row
    /// recorded (or found there), and its answer.
    async fn settled(&self, case: &InDoubt, asked: String, found: Authorization) -> Finding {
        let account = case.id.consumer();
        match self
            .backend
            .record(account, &Charge::authorized(&found))
            .await
        {
            Ok(charge) => Finding::settled(charge.response())
                .asked(asked)
                .answered(format!(
                    "authorised as {} ({} {}); recorded as charge {}",
                    found.id, found.amount, found.currency, charge.id
                )),
            Err(error) => {
                let what = if is_unavailable(&error) {
                    "the database is unavailable"
                } else {
                    "the database failed"
                };
                tracing::warn!(%error, authorization = %found.id, "the authorised charge could not be recorded");
                Finding::still_unknown().asked(asked).answered(format!(
                    "authorised as {}, but the charge could not be recorded: {what}",
                    found.id
                ))
            }
        }
    }
}

#[async_trait::async_trait]
impl<B: Backend> Reconcile for Reconciler<B> {
    async fn check(&self, case: InDoubt) -> Finding {
        // The handler noted this key too; whatever the note of another cause of doubt (a
        // panic, a lost completion), the network knows the request by it.
        let key = case.downstream_key();
        let asked = format!("card network: the authorization under key {key}");
        match self.network.lookup(&key).await {
            Ok(Some(found)) => self.settled(&case, asked, found).await,
            Ok(None) => Finding::not_happened()
                .asked(asked)
                .answered("no authorization under this key: nothing was charged"),
            Err(_) => Finding::still_unknown()
                .asked(asked)
                .answered("the card network did not answer"),
        }
    }
}

/// A pass's report as JSON (what `POST /test/reconcile` answers).
pub(crate) fn report_json(report: &Reconciled) -> serde_json::Value {
    serde_json::json!({
        "checked": report.checked,
        "settled": report.settled,
        "released": report.released,
        "deferred": report.deferred,
        "contested": report.contested,
        "failed": report.failed,
    })
}
