//! Keeping a running execution's lease alive (C9) from a runtime on a thread of its own, so
//! handlers blocking every application worker never make a live execution look orphaned.

use super::live::lock;
use super::Idempotency;
use crate::error::Error;
use crate::lease::Lease;
use crate::store::Store;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::runtime::Handle;
use tracing::Instrument;

/// The heartbeat runtime, started on first use; `None` if it could not be made.
fn runtime() -> Option<&'static Handle> {
    static RUNTIME: OnceLock<Option<Handle>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let (sent, received) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name("idem-heartbeat".to_owned())
                .spawn(move || {
                    crate::heartbeat_thread::mark_this_thread();
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build();
                    let _ = sent.send(runtime.as_ref().ok().map(|r| r.handle().clone()));
                    if let Ok(runtime) = runtime {
                        runtime.block_on(std::future::pending::<()>());
                    }
                })
                .ok()?;
            received.recv().ok().flatten()
        })
        .as_ref()
}

/// Spawns `future` on the heartbeat runtime (or the caller's, failing that).
fn spawn_beat<F>(future: F) -> tokio::task::JoinHandle<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    match runtime() {
        Some(handle) => handle.spawn(future),
        None => tokio::spawn(future),
    }
}

/// A lease kept alive by [`Idempotency::keep_alive`] until dropped.
#[derive(Debug)]
pub struct KeepAlive {
    pub(super) lease: Arc<Mutex<Lease>>,
    beat: tokio::task::JoinHandle<()>,
}

impl KeepAlive {
    /// The lease as of its last renewal.
    pub fn lease(&self) -> Lease {
        lock(&self.lease).clone()
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.beat.abort();
    }
}

impl<S: Store + 'static> Idempotency<S> {
    /// Renews `lease` every third of the policy's lease on the heartbeat thread until the guard
    /// drops or the lease is lost (C9). For guard-style effects; the engine's paths do it.
    pub fn keep_alive(&self, lease: Lease) -> KeepAlive {
        let lease = Arc::new(Mutex::new(lease));
        let beat = spawn_beat(
            self.clone()
                .heartbeat(Arc::clone(&lease))
                .instrument(tracing::Span::current()),
        );
        KeepAlive { lease, beat }
    }

    /// Renews the shared lease every third of the policy's lease until aborted or lost.
    async fn heartbeat(self, shared: Arc<Mutex<Lease>>) {
        let period = (self.policy().lease / 3).max(Duration::from_millis(1));
        // A partly gone lease is first renewed at half of what is left.
        let left = lock(&shared)
            .local_deadline()
            .map(|d| d.saturating_duration_since(std::time::Instant::now()));
        let mut wait = left.map_or(period, |left| period.min(left / 2));
        loop {
            tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
            wait = period;
            let mut lease = lock(&shared).clone();
            // Its effect's transaction is open on a store where a renewal would fail it.
            if self.inner.live.renewals_paused(lease.token()) {
                continue;
            }
            match self.renew_lease(&mut lease).await {
                Ok(()) => *lock(&shared) = lease,
                Err(Error::LeaseLost) => return,
                Err(_) => {} // the store is down: try again next beat
            }
        }
    }
}
