//! The engine's one stream of events (C16): every way of calling the engine emits the same
//! [`Event`]s, at each decision and step of the protocol, to the [`Observer`]s the application
//! set. Tracing ([`TracingObserver`], on by default), metrics (the `idem-metrics` crate, the facade's feature
//! `metrics`) and the HTTP layer's disposition all read this one vocabulary: [`EventKind::name`].

use crate::error::Error;
use crate::lease::Lease;
use crate::scope::RecordId;
use crate::token::FencingToken;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// What happened at one step of the protocol. The [`name`](Self::name)s are the one list used by
/// tracing, metrics, the HTTP layer and docs/operations.md.
///
/// ```
/// use idem_core::EventKind;
/// assert_eq!(EventKind::TakenOver.name(), "taken_over");
/// assert!(EventKind::ALL.iter().all(|kind| EventKind::from_name(kind.name()) == Some(*kind)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventKind {
    /// Refused before anything was recorded: bad input (400, 413), the store unavailable (503),
    /// the engine shutting down (503). Nothing ran.
    Rejected,
    /// Answered with the stored response of a completed request (C7). Nothing ran.
    Replayed,
    /// Answered "in flight": another execution holds the key (C5). Nothing ran.
    InFlight,
    /// Answered "mismatch": the key was used with another request (C3). Nothing ran.
    Mismatch,
    /// A duplicate waited for its original to end ([`Policy::wait_in_flight`](crate::Policy::wait_in_flight),
    /// C5), for [`Event::elapsed`]; the answer that followed is reported as usual.
    Waited,
    /// A fresh reservation (C4).
    Acquired,
    /// An orphan's lease had passed; its record was taken over with a new token (C9).
    TakenOver,
    /// A completed record's retention had passed; the key started over (C10).
    StartedOver,
    /// The execution ended with its response stored: what every retry replays (C6, C7).
    Executed,
    /// A completion was written (by the engine, or inside the effect's transaction).
    CompletionLanded,
    /// Writing a completion failed in a way a retry may fix; it is tried again (C8).
    CompletionRetried,
    /// The store refused a completion for good; a 500 is stored in its place (C8).
    CompletionRefused,
    /// The reservation was given back: nothing happened, a retry runs (C8).
    Released,
    /// The lease was extended (C9).
    LeaseRenewed,
    /// The lease was taken by another attempt: this execution is fenced out (C6).
    LeaseLost,
    /// The handler's outcome is unknown: the key is kept with a 500 (or the handler's own
    /// answer) stored, so nothing re-runs blind (C8).
    OutcomeUnknown,
    /// A commit whose outcome could not be told within the bound: the effect and its completion
    /// committed together, or neither did; the key is kept in progress until the lease passes.
    InDoubt,
    /// A record in doubt was settled: the real answer is stored in place of the answer in doubt
    /// (docs/state-machine.md, "Records in doubt").
    DoubtSettled,
    /// A record in doubt was released: its effect did not happen, the next retry executes.
    DoubtReleased,
    /// A record in doubt is still unknown: checked again after a backoff.
    DoubtDeferred,
    /// A decision about a record in doubt lost its race: the record changed since it was read
    /// (another reconciler decided, or its retention passed); nothing was written.
    DoubtContested,
    /// Expired records were deleted ([`Event::count`] of them) (C10).
    Purged,
    /// One call to the store ended: its [`Event::operation`], latency and error if any.
    StoreCall,
}

impl EventKind {
    /// Every kind, in the order of the docs.
    pub const ALL: &'static [EventKind] = &[
        EventKind::Rejected,
        EventKind::Replayed,
        EventKind::InFlight,
        EventKind::Mismatch,
        EventKind::Waited,
        EventKind::Acquired,
        EventKind::TakenOver,
        EventKind::StartedOver,
        EventKind::Executed,
        EventKind::CompletionLanded,
        EventKind::CompletionRetried,
        EventKind::CompletionRefused,
        EventKind::Released,
        EventKind::LeaseRenewed,
        EventKind::LeaseLost,
        EventKind::OutcomeUnknown,
        EventKind::InDoubt,
        EventKind::DoubtSettled,
        EventKind::DoubtReleased,
        EventKind::DoubtDeferred,
        EventKind::DoubtContested,
        EventKind::Purged,
        EventKind::StoreCall,
    ];

    /// The kind's one name (snake case): a tracing event's `outcome`, a metric's `outcome`
    /// label, the HTTP layer's disposition.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Rejected => "rejected",
            EventKind::Replayed => "replayed",
            EventKind::InFlight => "in_flight",
            EventKind::Mismatch => "mismatch",
            EventKind::Waited => "waited",
            EventKind::Acquired => "acquired",
            EventKind::TakenOver => "taken_over",
            EventKind::StartedOver => "started_over",
            EventKind::Executed => "executed",
            EventKind::CompletionLanded => "completion_landed",
            EventKind::CompletionRetried => "completion_retried",
            EventKind::CompletionRefused => "completion_refused",
            EventKind::Released => "released",
            EventKind::LeaseRenewed => "lease_renewed",
            EventKind::LeaseLost => "lease_lost",
            EventKind::OutcomeUnknown => "outcome_unknown",
            EventKind::InDoubt => "in_doubt",
            EventKind::DoubtSettled => "doubt_settled",
            EventKind::DoubtReleased => "doubt_released",
            EventKind::DoubtDeferred => "doubt_deferred",
            EventKind::DoubtContested => "doubt_contested",
            EventKind::Purged => "purged",
            EventKind::StoreCall => "store_call",
        }
    }

    /// The kind named `name`, if any.
    pub fn from_name(name: &str) -> Option<EventKind> {
        EventKind::ALL.iter().copied().find(|k| k.name() == name)
    }

    /// Whether this kind is a reservation acquired by this process (an execution begins).
    pub fn is_acquisition(self) -> bool {
        matches!(
            self,
            EventKind::Acquired | EventKind::TakenOver | EventKind::StartedOver
        )
    }

    /// Whether this kind ends an execution of this process: every acquisition the engine
    /// drives ends with exactly one of these (its answer stored, given back, fenced out, or
    /// left unknown or in doubt).
    pub fn ends_execution(self) -> bool {
        matches!(
            self,
            EventKind::Executed
                | EventKind::Released
                | EventKind::LeaseLost
                | EventKind::OutcomeUnknown
                | EventKind::InDoubt
        )
    }

    /// Whether this kind answers a request (the last event of a call of the engine's closure
    /// forms and of `begin` when nothing is acquired).
    pub fn is_answer(self) -> bool {
        matches!(
            self,
            EventKind::Rejected
                | EventKind::Replayed
                | EventKind::InFlight
                | EventKind::Mismatch
                | EventKind::Executed
                | EventKind::Released
                | EventKind::LeaseLost
                | EventKind::OutcomeUnknown
                | EventKind::InDoubt
        )
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which store call a [`EventKind::StoreCall`] event reports.
///
/// ```
/// assert_eq!(idem_core::Operation::Reserve.name(), "reserve");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// A reservation: its `Store::reserve` and `Store::replace` steps.
    Reserve,
    /// `Store::complete`.
    Complete,
    /// `Store::release`.
    Release,
    /// `Store::renew`.
    Renew,
    /// `Store::purge_expired`.
    Purge,
    /// `Store::lookup` (the engine's check of what landed).
    Lookup,
    /// A transactional execution: reservation, effect, completion and commit (SQL stores).
    Transaction,
    /// `Operator::inspect` (a reconciler reading a record in doubt).
    Inspect,
    /// `Operator::list` (a reconciler listing the records in doubt).
    List,
    /// `Store::resolve` (a decision about a record in doubt).
    Resolve,
}

impl Operation {
    /// Every operation.
    pub const ALL: &'static [Operation] = &[
        Operation::Reserve,
        Operation::Complete,
        Operation::Release,
        Operation::Renew,
        Operation::Purge,
        Operation::Lookup,
        Operation::Transaction,
        Operation::Inspect,
        Operation::List,
        Operation::Resolve,
    ];

    /// The operation's name, a metric's `operation` label.
    pub fn name(self) -> &'static str {
        match self {
            Operation::Reserve => "reserve",
            Operation::Complete => "complete",
            Operation::Release => "release",
            Operation::Renew => "renew",
            Operation::Purge => "purge",
            Operation::Lookup => "lookup",
            Operation::Transaction => "transaction",
            Operation::Inspect => "inspect",
            Operation::List => "list",
            Operation::Resolve => "resolve",
        }
    }
}

/// One event of the engine: what happened, to which record, how long it took, and the error if
/// the step failed.
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

    /// The same event about the execution holding `lease` (its record and its token).
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

    /// The record, if the event is about one. Observers must not put its key (nor, where it
    /// identifies a customer, its consumer) into metric labels.
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

    /// The fencing token of the execution the event is about, where there is one (an
    /// acquisition, the steps and the end of an execution): tells two executions of one record
    /// apart. Never a label: it is unique per execution.
    pub fn token(&self) -> Option<FencingToken> {
        self.token
    }

    /// How many records, for [`EventKind::Purged`].
    pub fn count(&self) -> u64 {
        self.count
    }
}

/// Receives the engine's events. Called inline, on the task that takes the step: keep it cheap
/// and never block (count, log, hand off to a channel).
///
/// ```
/// use idem_core::{Event, EventKind, Idempotency, MemoryStore, Observer};
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
///
/// #[derive(Default)]
/// struct CountReplays(AtomicUsize);
/// impl Observer for CountReplays {
///     fn observe(&self, event: &Event<'_>) {
///         if event.kind() == EventKind::Replayed {
///             self.0.fetch_add(1, Ordering::Relaxed);
///         }
///     }
/// }
///
/// let replays = Arc::new(CountReplays::default());
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

/// The observer that turns events into `tracing` events on target `idem` (on by default): one
/// event named `idem.<name>` (`idem.replayed`, `idem.executed`, ...) with fields `outcome` (the
/// kind's name), `consumer`, `route`, `latency_us` and `error`, inside the caller's span. Store
/// calls are at trace level, failures at warn, the rest at debug. Never the key.
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
        let level = if failed {
            tracing::Level::WARN
        } else if kind == EventKind::StoreCall {
            tracing::Level::TRACE
        } else {
            tracing::Level::DEBUG
        };
        // Nothing is computed for an event no subscriber wants (the common case at these
        // levels): the engine emits one per step.
        let wanted = match level {
            tracing::Level::WARN => tracing::enabled!(target: "idem", tracing::Level::WARN),
            tracing::Level::TRACE => tracing::enabled!(target: "idem", tracing::Level::TRACE),
            _ => tracing::enabled!(target: "idem", tracing::Level::DEBUG),
        };
        if !wanted {
            return;
        }
        let (consumer, route) = event
            .id()
            .map_or(("-", "-"), |id| (id.consumer(), id.route()));
        let latency_us = u64::try_from(event.elapsed().as_micros()).unwrap_or(u64::MAX);
        let operation = event.operation().map(Operation::name);
        let count = (kind == EventKind::Purged).then(|| event.count());
        let error = event.error().map(tracing::field::display);
        macro_rules! emit {
            ($level:expr) => {
                tracing::event!(
                    target: "idem",
                    $level,
                    outcome = kind.name(),
                    operation,
                    consumer,
                    route,
                    latency_us,
                    count,
                    error,
                    "idem.{}",
                    kind.name()
                )
            };
        }
        match level {
            tracing::Level::WARN => emit!(tracing::Level::WARN),
            tracing::Level::TRACE => emit!(tracing::Level::TRACE),
            _ => emit!(tracing::Level::DEBUG),
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
