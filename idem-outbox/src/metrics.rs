//! The outbox's metrics, through the `metrics` facade (feature `metrics`).

use std::time::Duration;

use crate::{OutboxEvent, OutboxEventKind};

/// Attempts, by endpoint and outcome (`delivered`, `retrying`, `dead`, `fenced`); a delivery
/// ended dead without an attempt (its endpoint gone, a row undecodable) counts here too.
pub const ATTEMPTS_TOTAL: &str = "idem_outbox_attempts_total";
/// How long attempts took, seconds, by endpoint.
pub const ATTEMPT_DURATION: &str = "idem_outbox_attempt_duration_seconds";
/// How long ago the oldest pending delivery was enqueued, seconds (0: none is pending).
pub const OLDEST_PENDING_AGE: &str = "idem_outbox_oldest_pending_age_seconds";

/// Counts `event` and its duration.
pub(crate) fn attempt(event: &OutboxEvent, duration: Duration) {
    unattempted(event);
    metrics::histogram!(ATTEMPT_DURATION, "endpoint" => event.endpoint.clone())
        .record(duration.as_secs_f64());
}

/// Counts `event`, the end of a claim that made no attempt (no duration).
pub(crate) fn unattempted(event: &OutboxEvent) {
    let outcome = match event.kind {
        OutboxEventKind::Delivered => "delivered",
        OutboxEventKind::Retrying(_) => "retrying",
        OutboxEventKind::Dead(_) => "dead",
        OutboxEventKind::Fenced => "fenced",
    };
    metrics::counter!(ATTEMPTS_TOTAL, "endpoint" => event.endpoint.clone(), "outcome" => outcome)
        .increment(1);
}

/// Sets the age of the oldest pending delivery.
pub(crate) fn oldest_pending(age: Option<Duration>) {
    metrics::gauge!(OLDEST_PENDING_AGE).set(age.unwrap_or_default().as_secs_f64());
}
