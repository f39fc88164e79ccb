//! Keeping a running execution's lease alive (C9), from a place the application cannot starve:
//! renewals run on a runtime of their own, on a dedicated thread, so handlers that block every
//! worker of the application's runtime for longer than the lease never let a live execution look
//! orphaned to another instance.

use super::Idempotency;
use crate::error::Error;
use crate::lease::Lease;
use crate::store::Store;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;
use tokio::runtime::Handle;
use tracing::Instrument;

/// The heartbeat runtime, started on first use; `None` if no thread or runtime could be made
/// (the heartbeat then runs on the caller's runtime).
fn runtime() -> Option<&'static Handle> {
    static RUNTIME: OnceLock<Option<Handle>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let (sent, received) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name("idem-heartbeat".to_owned())
                .spawn(move || {
                    crate::heartbeat_thread::mark_this_thread();
                    match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(runtime) => {
                            let _ = sent.send(Some(runtime.handle().clone()));
                            runtime.block_on(std::future::pending::<()>());
                        }
                        Err(_) => {
                            let _ = sent.send(None);
                        }
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

/// A lease kept alive by a heartbeat; see [`Idempotency::keep_alive`]. Dropping it stops the
/// heartbeat.
#[derive(Debug)]
pub struct KeepAlive {
    pub(super) lease: Arc<Mutex<Lease>>,
    beat: tokio::task::JoinHandle<()>,
}

impl KeepAlive {
    /// The lease as of its last renewal.
    pub fn lease(&self) -> Lease {
        self.lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.beat.abort();
    }
}

impl<S: Store + 'static> Idempotency<S> {
    /// Keeps `lease` alive while the returned guard lives: renews it on a heartbeat, every third
    /// of the policy's lease, until the guard is dropped or the lease is lost (C9). The
    /// renewals run on the engine's heartbeat thread, which the application's handlers cannot
    /// block. The engine does it for every execution it drives; this is for guard-style
    /// callers around an effect that may outlast the lease.
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
        // The first beat comes sooner when the lease is already partly gone (an execution that
        // began late), at half of what is left.
        let left = shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .local_deadline()
            .map(|d| d.saturating_duration_since(std::time::Instant::now()));
        let mut wait = left.map_or(period, |left| period.min(left / 2));
        loop {
            tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
            wait = period;
            let mut lease = shared
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            // Its effect's transaction is open on a store where a renewal would fail it.
            if self.inner.live.renewals_paused(lease.token()) {
                continue;
            }
            match self.renew_lease(&mut lease).await {
                Ok(()) => *shared.lock().unwrap_or_else(PoisonError::into_inner) = lease,
                Err(Error::LeaseLost) => return,
                Err(_) => {} // the store is down: try again next beat
            }
        }
    }
}
