//! What an operator reads of the outbox: a message's deliveries and their attempts, counts.

use crate::{DeliveryState, MessageId, OutboxError};

/// One delivery of a message, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryInfo {
    /// Its row id (the key of its attempts).
    pub id: i64,
    /// The message.
    pub message_id: MessageId,
    /// The endpoint's name.
    pub endpoint: String,
    /// Its state.
    pub state: DeliveryState,
    /// Attempts started (claimed), recorded or not.
    pub attempts: u32,
    /// The last recorded status.
    pub last_status: Option<u16>,
    /// The last recorded error.
    pub last_error: Option<String>,
}

/// One recorded attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptInfo {
    /// Its number (1 for the first).
    pub attempt: u32,
    /// When it started, ms since the Unix epoch.
    pub started_at_ms: i64,
    /// How long it took.
    pub duration_ms: i64,
    /// The receiver's status, if it answered.
    pub status: Option<u16>,
    /// Why there was no usable answer.
    pub error: Option<String>,
    /// The first KiB of the response body.
    pub response: Vec<u8>,
}

/// How long delivered and dead deliveries are kept before [`purge`](
/// crate::SqliteOutbox::purge) deletes them, with their attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Delivered ones: 7 days by default.
    pub delivered: std::time::Duration,
    /// Dead ones, kept longer for an operator: 30 days by default.
    pub dead: std::time::Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            delivered: std::time::Duration::from_secs(7 * 24 * 3600),
            dead: std::time::Duration::from_secs(30 * 24 * 3600),
        }
    }
}

/// How many deliveries wait, and how many are dead.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Due now and not claimed.
    pub pending: u64,
    /// Due later, or claimed by a dispatcher.
    pub delayed: u64,
    /// Dead: kept for an operator.
    pub dead: u64,
}

/// A delivery's row, checked.
pub(crate) fn delivery_info(
    id: i64,
    message_id: String,
    endpoint: String,
    state: &str,
    attempts: i64,
    status: Option<i64>,
    error: Option<String>,
) -> Result<DeliveryInfo, OutboxError> {
    let corrupt = |what: &str| OutboxError::Corrupt(format!("delivery {id}: {what}"));
    Ok(DeliveryInfo {
        id,
        message_id: MessageId::from_stored(message_id),
        endpoint,
        state: DeliveryState::from_stored(state).ok_or_else(|| corrupt("state"))?,
        attempts: u32::try_from(attempts).map_err(|_| corrupt("attempts"))?,
        last_status: status
            .map(|s| u16::try_from(s).map_err(|_| corrupt("status")))
            .transpose()?,
        last_error: error,
    })
}

/// An attempt's row, checked.
pub(crate) fn attempt_info(
    attempt: i64,
    started_at_ms: i64,
    duration_ms: i64,
    status: Option<i64>,
    error: Option<String>,
    response: Vec<u8>,
) -> Result<AttemptInfo, OutboxError> {
    let corrupt = |what: &str| OutboxError::Corrupt(format!("attempt {attempt}: {what}"));
    Ok(AttemptInfo {
        attempt: u32::try_from(attempt).map_err(|_| corrupt("number"))?,
        started_at_ms,
        duration_ms,
        status: status
            .map(|s| u16::try_from(s).map_err(|_| corrupt("status")))
            .transpose()?,
        error,
        response,
    })
}
