//! The names of the engine's events (C16).

use std::fmt;

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
/// What happened at one step of the protocol. Its [`name`](Self::name) is tracing's and
/// metrics' `outcome` and the HTTP layer's disposition (docs/operations.md).
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
    /// A duplicate waited [`elapsed`](crate::Event::elapsed) for its original (C5).
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
    /// Writing a completion failed and it is tried again (C8): the store down, or the stored
    /// 500 of a refused completion refused too.
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
    /// [`count`](crate::Event::count) expired records were deleted (C10).
    Purged => "purged",
    /// One store call ended: its [`operation`](crate::Event::operation), latency and error.
    StoreCall => "store_call",
    /// A request's store budget ([`Policy::store_timeout`](crate::Policy::store_timeout)) ran
    /// out at the step [`operation`](crate::Event::operation); `elapsed` is the budget.
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
/// Which store call an [`EventKind::StoreCall`] reports: a metric's `operation` label. On a
/// `replayed` or `mismatch` event, [`Cache`](Self::Cache) says the answer came from memory.
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
    /// No store call: the engine's [`ReplayCache`](crate::ReplayCache) answered.
    Cache => "cache",
}
}
