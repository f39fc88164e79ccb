//! The engine's one stream of [`Event`]s (C16), sent to the application's [`Observer`]s.

pub use crate::event_kind::{EventKind, Operation};

use crate::error::Error;
use crate::lease::Lease;
use crate::scope::RecordId;
use crate::token::FencingToken;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// One event: what happened, to which record, how long it took, and any error.
///
/// ```
/// use idem_core::{Event, EventKind};
/// let event = Event::new(EventKind::Purged).with_count(3);
/// assert_eq!(event.count(), 3);
/// assert!(event.id().is_none());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Event<'a> {
    kind: EventKind,
    id: Option<&'a RecordId>,
    elapsed: Duration,
    error: Option<&'a Error>,
    operation: Option<Operation>,
    count: u64,
    token: Option<FencingToken>,
}

impl<'a> Event<'a> {
    /// An event of `kind` about no record in particular.
    pub fn new(kind: EventKind) -> Self {
        Self {
            kind,
            id: None,
            elapsed: Duration::ZERO,
            error: None,
            operation: None,
            count: 0,
            token: None,
        }
    }

    /// The same event about `id`.
    pub fn about(mut self, id: &'a RecordId) -> Self {
        self.id = Some(id);
        self
    }

    /// The same event about `lease`'s record and token.
    pub fn of_lease(mut self, lease: &'a Lease) -> Self {
        self.id = Some(lease.id());
        self.token = Some(lease.token());
        self
    }

    /// The same event, about the execution holding `token`.
    pub fn held_by(mut self, token: FencingToken) -> Self {
        self.token = Some(token);
        self
    }

    /// The same event, the step having taken `elapsed`.
    pub fn took(mut self, elapsed: Duration) -> Self {
        self.elapsed = elapsed;
        self
    }

    /// The same event, the step having failed with `error`.
    pub fn failed(mut self, error: &'a Error) -> Self {
        self.error = Some(error);
        self
    }

    /// The same event, for the store call `operation`.
    pub fn of(mut self, operation: Operation) -> Self {
        self.operation = Some(operation);
        self
    }

    /// The same event, counting `count` (records purged).
    pub fn with_count(mut self, count: u64) -> Self {
        self.count = count;
        self
    }

    /// What happened.
    pub fn kind(&self) -> EventKind {
        self.kind
    }

    /// The record, if any. Never put its key (or a customer's consumer) in metric labels.
    pub fn id(&self) -> Option<&'a RecordId> {
        self.id
    }

    /// How long the step took (zero where it is not measured).
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// The error, if the step failed.
    pub fn error(&self) -> Option<&'a Error> {
        self.error
    }

    /// The store call, for [`EventKind::StoreCall`].
    pub fn operation(&self) -> Option<Operation> {
        self.operation
    }

    /// The token of the execution, if any: tells executions apart. Never a metric label.
    pub fn token(&self) -> Option<FencingToken> {
        self.token
    }

    /// How many records, for [`EventKind::Purged`].
    pub fn count(&self) -> u64 {
        self.count
    }
}

/// Receives the engine's events inline, on the step's task: keep it cheap, never block.
///
/// ```
/// use idem_core::{Event, EventKind, Idempotency, MemoryStore, Observer};
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// struct CountReplays(AtomicUsize);
/// impl Observer for CountReplays {
///     fn observe(&self, event: &Event<'_>) {
///         if event.kind() == EventKind::Replayed {
///             self.0.fetch_add(1, Ordering::Relaxed);
///         }
///     }
/// }
/// let replays = Arc::new(CountReplays(AtomicUsize::new(0)));
/// let idem = Idempotency::builder(MemoryStore::new()).observer(replays.clone()).build()?;
/// # Ok::<(), idem_core::Error>(())
/// ```
pub trait Observer: Send + Sync + 'static {
    /// One event.
    fn observe(&self, event: &Event<'_>);
}

impl<O: Observer + ?Sized> Observer for Arc<O> {
    fn observe(&self, event: &Event<'_>) {
        (**self).observe(event)
    }
}

/// The engine's observers, called in order.
#[derive(Clone, Default)]
pub(crate) struct Observers(Vec<Arc<dyn Observer>>);

impl Observers {
    pub(crate) fn push(&mut self, observer: Arc<dyn Observer>) {
        self.0.push(observer);
    }

    pub(crate) fn emit(&self, event: Event<'_>) {
        for observer in &self.0 {
            observer.observe(&event);
        }
    }
}

impl fmt::Debug for Observers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Observers({})", self.0.len())
    }
}

/// Events as `tracing` events `idem.<name>` on target `idem` (on by default), in the caller's
/// span, with `outcome`, `consumer`, `route`, `latency_us` and `error`, never the key; store
/// calls at trace, failures at warn, the rest at debug.
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingObserver;

impl Observer for TracingObserver {
    fn observe(&self, event: &Event<'_>) {
        let kind = event.kind();
        let failed = event.error().is_some()
            || matches!(
                kind,
                EventKind::CompletionRefused
                    | EventKind::LeaseLost
                    | EventKind::InDoubt
                    | EventKind::OutcomeUnknown
                    | EventKind::DoubtContested
            );
        macro_rules! emit {
            ($level:expr) => {
                // Nothing is computed for an event no subscriber wants (the common case).
                if tracing::enabled!(target: "idem", $level) {
                    let (consumer, route) = event
                        .id()
                        .map_or(("-", "-"), |id| (id.consumer(), id.route()));
                    let latency_us =
                        u64::try_from(event.elapsed().as_micros()).unwrap_or(u64::MAX);
                    let count = (kind == EventKind::Purged).then(|| event.count());
                    tracing::event!(
                        target: "idem",
                        $level,
                        outcome = kind.name(),
                        operation = event.operation().map(Operation::name),
                        consumer,
                        route,
                        latency_us,
                        count,
                        error = event.error().map(tracing::field::display),
                        "idem.{}",
                        kind.name()
                    )
                }
            };
        }
        if failed {
            emit!(tracing::Level::WARN)
        } else if kind == EventKind::StoreCall {
            emit!(tracing::Level::TRACE)
        } else {
            emit!(tracing::Level::DEBUG)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c16_every_kind_has_one_unique_name() {
        let mut names: Vec<_> = EventKind::ALL.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), EventKind::ALL.len());
        for kind in EventKind::ALL {
            assert_eq!(EventKind::from_name(kind.name()), Some(*kind));
        }
    }

    #[test]
    fn c16_operations_have_names() {
        let mut names: Vec<_> = Operation::ALL.iter().map(|o| o.name()).collect();
        names.dedup();
        assert_eq!(names.len(), Operation::ALL.len());
    }
}
