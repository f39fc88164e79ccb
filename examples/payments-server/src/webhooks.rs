//! The merchant's webhooks: each succeeded charge's `charge.succeeded` event (Stripe's shape:
//! the charge under `data.object`), enqueued through the outbox in the charge's own
//! transaction and delivered at least once, signed (Standard Webhooks), always with the same
//! `webhook-id` (docs/outbox.md).

use crate::charge::Charge;
use crate::settings::Webhook;
use idem_outbox::{Dispatcher, Dispatching, Endpoint, Message, OutboxError, Schedule};
use std::time::Duration;

/// The endpoint's name in the outbox.
pub(crate) const ENDPOINT: &str = "merchant";

/// The endpoint `webhook` describes: the default schedule, or the test schedule when one was
/// given (unjittered, so a test knows when each attempt comes).
pub(crate) fn endpoint(webhook: &Webhook) -> Result<Endpoint, OutboxError> {
    let endpoint = Endpoint::new(ENDPOINT, &webhook.url, &webhook.secrets)?;
    match &webhook.test_schedule {
        Some(delays) => Ok(endpoint.schedule(Schedule::new(delays.iter().copied())?.jitter(0.0)?)),
        None => Ok(endpoint),
    }
}

/// Starts delivering, each claim lasting the server's lease. The demo's receiver runs beside
/// the server: loopback is allowed (other private and link-local addresses are not). Under a
/// test schedule the dispatcher also polls as often as its shortest delay (kept between 20 ms
/// and 1 s), so a retry starts when it is due rather than at the next second.
pub(crate) fn start(dispatcher: Dispatcher, webhook: &Webhook) -> Result<Dispatching, OutboxError> {
    let mut dispatcher = dispatcher.lease(webhook.lease)?.allow_loopback(true);
    if let Some(shortest) = webhook.test_schedule.as_ref().and_then(|d| d.iter().min()) {
        dispatcher = dispatcher
            .poll_interval((*shortest).clamp(Duration::from_millis(20), Duration::from_secs(1)));
    }
    dispatcher.start()
}

/// The `charge.succeeded` event of `charge`, for the merchant's endpoint; none unless it
/// succeeded. Its id is the charge's (one such event per charge).
pub(crate) fn charge_succeeded(charge: &Charge) -> Result<Option<Message>, OutboxError> {
    if charge.status != "succeeded" {
        return Ok(None);
    }
    let event = serde_json::json!({
        "id": format!("evt_{}", charge.id.trim_start_matches("ch_")),
        "object": "event",
        "type": "charge.succeeded",
        "created": charge.created,
        "livemode": charge.livemode,
        "data": { "object": charge },
    });
    Ok(Some(Message::json(&event)?.to(ENDPOINT)))
}
