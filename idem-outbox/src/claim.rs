//! A delivery a dispatcher claimed, and what it records of its attempt.

use std::time::{Duration, Instant};

use crate::MessageId;

/// A delivery claimed under a token, with its message.
#[derive(Debug, Clone)]
pub(crate) struct Claimed {
    pub(crate) id: i64,
    pub(crate) message_id: MessageId,
    pub(crate) endpoint: String,
    pub(crate) payload: Vec<u8>,
    pub(crate) content_type: String,
    pub(crate) headers: Vec<(String, String)>,
    /// The number of this attempt (1 for the first).
    pub(crate) attempt: u32,
}

/// What one claim took.
#[derive(Debug, Default)]
pub(crate) struct Taken {
    /// The deliveries to attempt.
    pub(crate) claimed: Vec<Claimed>,
    /// Those whose row could not be decoded: ended dead, never attempted.
    pub(crate) undecodable: Vec<Undecodable>,
    /// How many due ones of disabled endpoints were set aside instead (PostgreSQL).
    pub(crate) set_aside: usize,
}

/// A claimed delivery whose row is not what the outbox writes (C12): what of it could be
/// read, and why the rest could not.
#[derive(Debug, Clone)]
pub(crate) struct Undecodable {
    pub(crate) id: i64,
    pub(crate) message_id: MessageId,
    pub(crate) endpoint: String,
    /// The number its attempt would have had (0 when unreadable too).
    pub(crate) attempt: u32,
    pub(crate) error: String,
}

impl Undecodable {
    /// From the columns that could be read (`None`: unreadable too) and the decoding error.
    pub(crate) fn new(
        id: i64,
        message_id: Option<String>,
        endpoint: Option<String>,
        attempt: Option<i64>,
        error: &crate::OutboxError,
    ) -> Self {
        Self {
            id,
            message_id: MessageId::from_stored(message_id.unwrap_or_default()),
            endpoint: endpoint.unwrap_or_default(),
            attempt: attempt.and_then(|a| u32::try_from(a).ok()).unwrap_or(0),
            error: format!("undecodable delivery row: {error}"),
        }
    }
}

/// A delivery's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeliveryState {
    /// Waiting for an attempt (now, later, or one running).
    Pending,
    /// A 2xx answered an attempt.
    Delivered,
    /// Its schedule ran out, or the receiver said stop (`410 Gone`,
    /// `webhook-delivery: abort-message`): kept, never attempted again by itself.
    Dead,
}

impl DeliveryState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Dead => "dead",
        }
    }

    pub(crate) fn from_stored(text: &str) -> Option<Self> {
        match text {
            "pending" => Some(DeliveryState::Pending),
            "delivered" => Some(DeliveryState::Delivered),
            "dead" => Some(DeliveryState::Dead),
            _ => None,
        }
    }
}

/// What an attempt's end writes, fenced by the claim's token.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub(crate) delivery: i64,
    pub(crate) token: String,
    pub(crate) state: DeliveryState,
    /// From now until the delivery is due again (pending only).
    pub(crate) delay: Duration,
    pub(crate) status: Option<u16>,
    pub(crate) error: Option<String>,
    pub(crate) response: Vec<u8>,
    pub(crate) duration: Duration,
    /// When it ended: it is recorded a little later (with the other attempts of its claim), and
    /// its start is told from this.
    pub(crate) ended: Instant,
    /// The endpoint's name, to note the attempt's success or failure on it (PostgreSQL's
    /// `record.sql` reads it from the delivery's row).
    pub(crate) endpoint: String,
    /// How long the endpoint may fail every attempt before it is disabled.
    pub(crate) disable_after: Duration,
}

impl Record {
    /// How long ago the attempt started, now.
    pub(crate) fn started_ago(&self) -> Duration {
        self.duration.saturating_add(self.ended.elapsed())
    }
}

/// Whole milliseconds of `d`, saturating.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
