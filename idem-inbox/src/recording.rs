//! A delivery's audit writes, in order, beside its answer: each waits on the answer's path
//! at most [`ON_THE_ANSWER`] and goes on in the background past it, within the event's store
//! budget (C5, C13). The trail is best effort (docs/inbox.md): a write that does not land is
//! logged, and it never fails a delivery nor holds its answer behind a writer, such as a SQLite
//! write lock another process holds while the delivery is a duplicate answered by a read.

use idem_core::store::Deadline;
use idem_core::{Error, Operation};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// How long an answer waits for one audit write: what a write costs a store that is not held
/// by another writer, with room to spare.
const ON_THE_ANSWER: Duration = Duration::from_millis(20);

/// What an audit write that did not answer in time is reported as: a statement on the store's
/// database, beside the executions' transactions.
const AUDIT: Operation = Operation::Transaction;

/// At most this many deliveries of one inbox have audit writes in the background. Each write
/// there ends by its budget; this bounds how many there are, which the deliveries in flight
/// no longer do once answers stop waiting for them: a storm against a frozen trail would
/// otherwise hold its rate times the budget (each waiting for a pool connection, or queued on
/// SQLite's one writer ahead of the engine's own steps). A delivery past it loses its writes,
/// logged; one admitted keeps every write of its own, its outcome after its delivery.
pub(crate) const MAX_IN_BACKGROUND: usize = 1024;

/// The audit writes of an inbox that went on in the background.
#[derive(Debug, Default)]
pub(crate) struct Background {
    writes: AtomicUsize,
    done: Notify,
    /// The deliveries with writes here, [`MAX_IN_BACKGROUND`] at most.
    deliveries: AtomicUsize,
}

impl Background {
    /// Waits until none is left: each landed or was given up at its deadline.
    pub(crate) async fn drained(&self) {
        loop {
            let done = self.done.notified();
            if self.writes.load(Ordering::Acquire) == 0 {
                return;
            }
            done.await;
        }
    }
}

/// One delivery's audit writes so far.
pub(crate) struct Recording {
    background: Arc<Background>,
    /// The last write, if it went on in the background: the next one waits for it first, so
    /// that an outcome never lands before its delivery.
    behind: Option<JoinHandle<()>>,
    /// The delivery's place among those with writes in the background, once it took one.
    admitted: Option<Arc<Admitted>>,
}

impl Recording {
    /// The writes of one delivery, counted in `background` while they go on there.
    pub(crate) fn new(background: &Arc<Background>) -> Self {
        Self {
            background: Arc::clone(background),
            behind: None,
            admitted: None,
        }
    }

    /// Runs `write` after the writes before it, given up at `deadline`; `missed` names it in
    /// the warning a failed or late write logs.
    pub(crate) async fn write<W>(
        &mut self,
        source: &str,
        missed: &'static str,
        deadline: Deadline,
        write: W,
    ) where
        W: Future<Output = Result<(), Error>> + Send + 'static,
    {
        let before = self.behind.take();
        let source = source.to_owned();
        let named = source.clone();
        let mut written = Box::pin(async move {
            if let Some(before) = before {
                let _ = before.await;
            }
            if let Err(error) = deadline.bound(AUDIT, write).await {
                tracing::warn!(target: "idem", %source, %error, "idem.inbox: the audit trail missed {missed}");
            }
        });
        // The answer's time on idem-core's timer, which is none without Tokio's time driver:
        // there (the engine then refuses the event, a configuration error) the write is
        // awaited here, as a task could not be given its time, never a panic.
        let on_the_answer = Deadline::after(ON_THE_ANSWER).bound(AUDIT, async {
            (&mut written).await;
            Ok(())
        });
        if on_the_answer.await.is_ok() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return written.await;
        };
        let admitted = match &self.admitted {
            Some(admitted) => Arc::clone(admitted),
            None => {
                // Nothing of this delivery is in the background yet: `written` has no write
                // before it, and is dropped.
                let Some(admitted) = Admitted::new(&self.background) else {
                    tracing::warn!(target: "idem", source = %named, "idem.inbox: the audit trail missed {missed}: {MAX_IN_BACKGROUND} deliveries' writes already go on in the background");
                    return;
                };
                let admitted = Arc::new(admitted);
                self.admitted = Some(Arc::clone(&admitted));
                admitted
            }
        };
        let counted = Counted::new(&self.background);
        self.behind = Some(runtime.spawn(async move {
            written.await;
            drop(admitted);
            drop(counted);
        }));
    }
}

/// A delivery's place among those with writes in the background, until its writes there
/// and its recording are done.
struct Admitted(Arc<Background>);

impl Admitted {
    /// A place, if fewer than [`MAX_IN_BACKGROUND`] deliveries hold one.
    fn new(background: &Arc<Background>) -> Option<Self> {
        background
            .deliveries
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_IN_BACKGROUND).then_some(n + 1)
            })
            .ok()?;
        Some(Self(Arc::clone(background)))
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.deliveries.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One write counted in [`Background`] until it is dropped: done, or cancelled with its
/// runtime.
struct Counted(Arc<Background>);

impl Counted {
    fn new(background: &Arc<Background>) -> Self {
        background.writes.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(background))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        if self.0.writes.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.done.notify_waiters();
        }
    }
}
