//! The engine's one stream of [`Event`]s (C16), sent to the application's [`Observer`]s.
//! Tracing ([`TracingObserver`]), `idem-metrics` and the HTTP layer share [`EventKind::name`].

use crate::error::Error;
use crate::lease::Lease;
use crate::scope::RecordId;
use crate::token::FencingToken;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// An enum, its `ALL` values in order and their snake-case `name`s, from one table.
macro_rules! named_enum {
    ($(#[$meta:meta])* $vis:vis enum $enum:ident {
        $($(#[$doc:meta])* $variant:ident => $name:literal,)*
    }) => {
        $(#[$meta])*
        $vis enum $enum { $($(#[$doc])* $variant,)* }

        impl $enum {
            /// Every value, in the order of the docs.
            pub const ALL: &'static [$enum] = &[$($enum::$variant),*];

            /// The value's one name (snake case).
            pub fn name(self) -> &'static str {
                match self { $($enum::$variant => $name,)* }
            }
        }
    };
}

named_enum! {
/// What happened at one step of the protocol. The [`name`](Self::name)s are docs/operations.md's
/// list: tracing's and metrics' `outcome`, the HTTP layer's disposition.
///
/// ```
/// use idem_core::EventKind;
/// assert_eq!(EventKind::TakenOver.name(), "taken_over");
/// assert!(EventKind::ALL.iter().all(|kind| EventKind::from_name(kind.name()) == Some(*kind)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventKind {
    /// Refused before anything was recorded (400, 413, 503). Nothing ran.
    Rejected => "rejected",
    /// Answered with the stored response of a completed request (C7). Nothing ran.
    Replayed => "replayed",
    /// Answered "in flight": another execution holds the key (C5). Nothing ran.
    InFlight => "in_flight",
    /// Answered "mismatch": the key was used with another request (C3). Nothing ran.
    Mismatch => "mismatch",
    /// A duplicate waited [`Event::elapsed`] for its original to end (C5,
    /// [`Policy::wait_in_flight`](crate::Policy::wait_in_flight)); its answer follows.
    Waited => "waited",
    /// A fresh reservation (C4).
    Acquired => "acquired",
    /// An orphan's lease had passed; its record was taken over with a new token (C9).
    TakenOver => "taken_over",
    /// A completed record's retention had passed; the key started over (C10).
    StartedOver => "started_over",
    /// The execution ended with its response stored: what every retry replays (C6, C7).
    Executed => "executed",
    /// A completion was written (by the engine, or inside the effect's transaction).
    CompletionLanded => "completion_landed",
    /// Writing a completion failed in a way a retry may fix; it is tried again (C8).
    CompletionRetried => "completion_retried",
    /// The store refused a completion for good; a 500 is stored in its place (C8).
    CompletionRefused => "completion_refused",
    /// The reservation was given back: nothing happened, a retry runs (C8).
    Released => "released",
    /// The lease was extended (C9).
    LeaseRenewed => "lease_renewed",
    /// The lease was taken by another attempt: this execution is fenced out (C6).
    LeaseLost => "lease_lost",
    /// The handler's outcome is unknown: a 500 (or the handler's answer) is stored (C8).
    OutcomeUnknown => "outcome_unknown",
    /// A commit's outcome is unknown; the key stays in progress until the lease passes.
    InDoubt => "in_doubt",
    /// A record in doubt was settled with its real answer (docs/state-machine.md).
    DoubtSettled => "doubt_settled",
    /// A record in doubt was released: its effect did not happen, the next retry executes.
    DoubtReleased => "doubt_released",
    /// A record in doubt is still unknown: checked again after a backoff.
    DoubtDeferred => "doubt_deferred",
    /// A decision about a record in doubt lost its race to a change; nothing was written.
    DoubtContested => "doubt_contested",
    /// Expired records were deleted ([`Event::count`] of them) (C10).
    Purged => "purged",
    /// One call to the store ended: its [`Event::operation`], latency and error if any.
    StoreCall => "store_call",
    /// A request's store budget ran out (C13) at the step [`Event::operation`]; `elapsed` is
    /// the budget. Before the effect the answer is store-down, after it "outcome unknown".
    BudgetSpent => "budget_spent",
}
}

impl EventKind {
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

    /// Whether this kind ends an execution; each acquisition the engine drives ends with one.
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

    /// Whether this kind answers a request (a closure call's or answered `begin`'s last event).
    pub fn is_answer(self) -> bool {
        self.ends_execution()
            || matches!(
                self,
                EventKind::Rejected
                    | EventKind::Replayed
                    | EventKind::InFlight
                    | EventKind::Mismatch
            )
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

named_enum! {
/// Which store call a [`EventKind::StoreCall`] event reports; its [`name`](Self::name) is a
/// metric's `operation` label.
///
/// ```
/// assert_eq!(idem_core::Operation::Reserve.name(), "reserve");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// A reservation: its `Store::reserve` and `Store::replace` steps.
    Reserve => "reserve",
    /// `Store::complete`.
    Complete => "complete",
    /// `Store::release`.
    Release => "release",
    /// `Store::renew`.
    Renew => "renew",
    /// `Store::purge_expired`.
    Purge => "purge",
    /// `Store::lookup` (the engine's check of what landed).
    Lookup => "lookup",
    /// A transactional execution: reservation, effect, completion and commit (SQL stores).
    Transaction => "transaction",
    /// `Operator::inspect` (a reconciler reading a record in doubt).
    Inspect => "inspect",
    /// `Operator::list` (a reconciler listing the records in doubt).
    List => "list",
    /// `Store::resolve` (a decision about a record in doubt).
    Resolve => "resolve",
}
}

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

/// Events as `tracing` events on target `idem` (on by default): `idem.<name>` with `outcome`,
/// `consumer`, `route`, `latency_us` and `error`, in the caller's span; store calls at trace,
/// failures at warn, the rest at debug. Never the key.
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
