//! Purging expired records periodically, on a task of its own (C10).

use crate::engine::Idempotency;
use crate::store::{Expiry, Store};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A task that purges expired records every period until stopped; see
/// [`Idempotency::purge_every`].
#[derive(Debug)]
pub struct Purger {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Purger {
    /// Stops the task after the batch it may be running, and waits for it.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

impl<S: Store + 'static> Idempotency<S> {
    /// Starts a task that calls [`purge_expired`](Self::purge_expired) every `period`: a batch of
    /// at most [`Policy::purge_batch`](crate::Policy::purge_batch) records, then batch after
    /// batch while batches come back full, then it waits for the next period. A store error is
    /// logged and tried again next period. A store whose server expires records by itself
    /// ([`Expiry::ServerTtl`]) needs none: the task then does nothing.
    ///
    /// ```
    /// use idem_core::{Idempotency, MemoryStore};
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let purger = idem.purge_every(Duration::from_secs(60));
    /// // ... serve ...
    /// purger.stop().await;
    /// # }
    /// ```
    pub fn purge_every(&self, period: Duration) -> Purger {
        let (stop, mut stopped) = watch::channel(false);
        let idem = self.clone();
        let task = tokio::spawn(async move {
            if idem.store().capabilities().expiry == Expiry::ServerTtl {
                return;
            }
            loop {
                loop {
                    match idem.purge_expired().await {
                        Ok(n) if n >= idem.policy().purge_batch && !*stopped.borrow() => continue,
                        Ok(_) => break,
                        Err(error) => {
                            tracing::warn!(target: "idem", %error, "idem.purge failed");
                            break;
                        }
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(period) => {}
                    _ = stopped.changed() => return,
                }
            }
        });
        Purger { stop, task }
    }
}
