//! Keeping a running execution's lease alive (C9) from a runtime on a thread of its own, so
//! handlers blocking every application worker never make a live execution look orphaned.

mod schedule;

use super::live::lock;
use super::Idempotency;
use crate::error::Error;
use crate::lease::Lease;
use crate::store::Store;
use schedule::{renew_caught, Renew, Renewal, Schedule, Scheduled};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tracing::Instrument;

/// The schedule on the heartbeat runtime, started on first use; `None` if it could not be made.
fn schedule() -> Option<&'static Schedule> {
    static SCHEDULE: OnceLock<Option<&'static Schedule>> = OnceLock::new();
    *SCHEDULE.get_or_init(|| {
        let (sent, received) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("idem-heartbeat".to_owned())
            .spawn(move || {
                crate::heartbeat_thread::mark_this_thread();
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                let _ = sent.send(
                    runtime
                        .as_ref()
                        .ok()
                        .map(|r| Schedule::start(r.handle().clone())),
                );
                if let Ok(runtime) = runtime {
                    runtime.block_on(std::future::pending::<()>());
                }
            })
            .ok()?;
        received.recv().ok().flatten()
    })
}

/// The runtime on the heartbeat's own thread, for what must go on when its caller polls on no
/// Tokio runtime (the guard style on an executor of its own); `None` if it could not be made.
pub(in crate::engine) fn heartbeat_runtime() -> Option<tokio::runtime::Handle> {
    schedule().map(|schedule| schedule.runtime().clone())
}

/// A lease kept alive by [`Idempotency::keep_alive`] until dropped.
#[derive(Debug)]
pub struct KeepAlive {
    pub(super) lease: Arc<Mutex<Lease>>,
    _beat: Beating,
}

/// Where the renewals run: the heartbeat's schedule, or (if its thread could not be started)
/// a task of the caller's runtime.
#[derive(Debug)]
enum Beating {
    Scheduled { _entry: Scheduled },
    Task(tokio::task::JoinHandle<()>),
}

impl Drop for Beating {
    fn drop(&mut self) {
        if let Beating::Task(task) = self {
            task.abort();
        }
    }
}

impl KeepAlive {
    /// The lease as of its last renewal.
    pub fn lease(&self) -> Lease {
        lock(&self.lease).clone()
    }
}

/// What renews one kept-alive lease.
struct Beat<S> {
    idem: Idempotency<S>,
    shared: Arc<Mutex<Lease>>,
    span: tracing::Span,
}

impl<S: Store + 'static> Renew for Beat<S> {
    fn period(&self) -> Duration {
        (self.idem.policy().lease / 3).max(Duration::from_millis(1))
    }

    fn renew(&self) -> Renewal {
        let (idem, shared) = (self.idem.clone(), Arc::clone(&self.shared));
        Box::pin(
            async move {
                let mut lease = lock(&shared).clone();
                // Its effect's transaction is open on a store where a renewal would fail it.
                if idem.inner.live.renewals_paused(lease.token()) {
                    return true;
                }
                match idem.renew_lease(&mut lease).await {
                    Ok(()) => *lock(&shared) = lease,
                    Err(Error::LeaseLost) => return false,
                    Err(_) => {} // the store is down: try again next beat
                }
                true
            }
            .instrument(self.span.clone()),
        )
    }
}

impl<S: Store + 'static> Idempotency<S> {
    /// Renews `lease` every third of the policy's lease on the heartbeat thread until the guard
    /// drops or the lease is lost (C9). For guard-style effects; the engine's paths do it.
    pub fn keep_alive(&self, lease: Lease) -> KeepAlive {
        let shared = Arc::new(Mutex::new(lease));
        let beat = Arc::new(Beat {
            idem: self.clone(),
            shared: Arc::clone(&shared),
            span: tracing::Span::current(),
        });
        let period = beat.period();
        // A partly gone lease is first renewed at half of what is left.
        let left = lock(&shared)
            .local_deadline()
            .map(|d| d.saturating_duration_since(std::time::Instant::now()));
        let first = left
            .map_or(period, |left| period.min(left / 2))
            .max(Duration::from_millis(1));
        let beating = match schedule() {
            Some(schedule) => Beating::Scheduled {
                _entry: schedule.add(beat, first),
            },
            None => Beating::Task(tokio::spawn(async move {
                let beat: Arc<dyn Renew> = beat;
                let mut wait = first;
                loop {
                    tokio::time::sleep(wait).await;
                    wait = period;
                    if !renew_caught(Arc::clone(&beat)).await {
                        return;
                    }
                }
            })),
        };
        KeepAlive {
            lease: shared,
            _beat: beating,
        }
    }
}
