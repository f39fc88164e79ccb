//! What a dispatcher reports after each attempt.

use std::time::Duration;

use crate::MessageId;

/// What became of one attempt, for an observer ([`Dispatcher::on_event`](
/// crate::Dispatcher::on_event)) and the log (every event is also a `tracing` event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    /// The message.
    pub message_id: MessageId,
    /// The endpoint's name.
    pub endpoint: String,
    /// The attempt's number (1 for the first; for a delivery ended without one, the number it
    /// would have had).
    pub attempt: u32,
    /// The receiver's status, if it answered.
    pub status: Option<u16>,
    /// What happened.
    pub kind: OutboxEventKind,
}

/// What happened to an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutboxEventKind {
    /// A 2xx: delivered.
    Delivered,
    /// Failed; tried again after this delay.
    Retrying(Duration),
    /// Dead: its schedule ran out, or the receiver said stop; kept, never dropped.
    Dead(DeadReason),
    /// Its claim had run out and another dispatcher claimed the delivery: nothing recorded.
    Fenced,
}

/// Why a delivery is dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadReason {
    /// Every attempt of the schedule failed.
    Exhausted,
    /// The receiver answered `410 Gone`.
    Gone,
    /// The receiver answered `webhook-delivery: abort-message`.
    Aborted,
    /// Its stored row, or its endpoint's, is not what the outbox writes (a hand edit, another
    /// writer): never attempted; the error is in the delivery's `last_error`.
    Undecodable,
    /// Its endpoint is no longer registered (its row deleted by hand): never attempted.
    NoEndpoint,
}
