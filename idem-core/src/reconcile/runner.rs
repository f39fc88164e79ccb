//! Reconciling periodically, on a task of its own.

use super::Reconcile;
use crate::engine::Idempotency;
use crate::store::Operator;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A task that runs a reconciliation pass every period until stopped; see
/// [`Idempotency::reconcile_every`].
#[derive(Debug)]
pub struct Reconciling {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Reconciling {
    /// Stops the task and waits for it. A pass under way stops where it is: each decision is
    /// one atomic step of the store, so none is left half made.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

impl<S: Operator + 'static> Idempotency<S> {
    /// Starts a task that runs [`reconcile_now`](Self::reconcile_now) with `reconciler` at once
    /// and then every `period`. A pass that fails (the store is down) is logged and tried again
    /// next period; records still unknown wait for their backoff
    /// ([`backoff`](crate::reconcile::backoff)) whatever the period. Several processes may
    /// run one each: every record is decided once.
    ///
    /// ```
    /// use idem_core::reconcile::{Finding, InDoubt};
    /// use idem_core::{Idempotency, MemoryStore};
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let reconciling = idem.reconcile_every(Duration::from_secs(60), |case: InDoubt| async move {
    ///     // Ask the provider by case.downstream_key() ...
    ///     Finding::still_unknown().asked(case.downstream_key())
    /// });
    /// // ... serve ...
    /// reconciling.stop().await;
    /// # }
    /// ```
    pub fn reconcile_every<R: Reconcile + 'static>(
        &self,
        period: Duration,
        reconciler: R,
    ) -> Reconciling {
        let (stop, mut stopped) = watch::channel(false);
        let idem = self.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    _ = stopped.changed() => return,
                    result = idem.reconcile_now(&reconciler) => match result {
                        Ok(report) if report.checked > 0 || report.failed > 0 => {
                            tracing::info!(target: "idem", ?report, "idem.reconcile: pass done");
                        }
                        Ok(_) => {}
                        Err(error) => {
                            tracing::warn!(target: "idem", %error, "idem.reconcile failed");
                        }
                    },
                }
                tokio::select! {
                    _ = tokio::time::sleep(period) => {}
                    _ = stopped.changed() => return,
                }
            }
        });
        Reconciling { stop, task }
    }
}
