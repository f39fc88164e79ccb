//! What the receiver reads of a Stripe event, parsed only after its signature was verified.
//!
//! ```json
//! {"id": "evt_3Q...", "object": "event", "type": "payment_intent.succeeded",
//!  "data": {"object": {"id": "pi_3Q...", "object": "payment_intent", "amount": 4200,
//!           "amount_received": 4200, "currency": "eur", "metadata": {"order_id": "ord_42"}}}}
//! ```

use serde_json::Value;

/// The event type that issues an invoice.
pub(crate) const PAYMENT_SUCCEEDED: &str = "payment_intent.succeeded";

/// The longest event id accepted (Stripe's are about 30 characters).
const MAX_ID_LEN: usize = 255;

/// The parts of an event the receiver uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StripeEvent {
    /// The event id (`evt_...`): the inbox's key.
    pub id: String,
    /// The event type (`payment_intent.succeeded`); empty when the body has none.
    pub kind: String,
    /// For a `payment_intent.succeeded`: the payment.
    pub payment: Option<Payment>,
}

/// A succeeded payment intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Payment {
    /// The payment intent (`pi_...`).
    pub intent: String,
    /// `metadata.order_id`, set by the checkout that created the payment intent.
    pub order_id: Option<String>,
    /// The amount received (`amount_received`, else `amount`), in the currency's minor unit.
    pub amount: Option<i64>,
    /// The currency (`eur`).
    pub currency: Option<String>,
}

/// Why a verified body is not an event the receiver can key (answered 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InvalidEvent {
    /// Not JSON.
    NotJson,
    /// JSON, but not an object with a non-empty string `id` of at most 255 bytes.
    NoId,
}

impl InvalidEvent {
    /// A sentence for the sender.
    pub(crate) fn detail(&self) -> &'static str {
        match self {
            InvalidEvent::NotJson => "The body is not JSON.",
            InvalidEvent::NoId => "The event has no string `id`.",
        }
    }
}

impl StripeEvent {
    /// Parses a verified body.
    pub(crate) fn parse(body: &[u8]) -> Result<Self, InvalidEvent> {
        let value: Value = serde_json::from_slice(body).map_err(|_| InvalidEvent::NotJson)?;
        let id = value
            .get("id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty() && id.len() <= MAX_ID_LEN)
            .ok_or(InvalidEvent::NoId)?
            .to_owned();
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let payment = (kind == PAYMENT_SUCCEEDED).then(|| {
            let object = &value["data"]["object"];
            Payment {
                intent: object["id"].as_str().unwrap_or_default().to_owned(),
                order_id: object["metadata"]["order_id"]
                    .as_str()
                    .filter(|o| !o.is_empty())
                    .map(str::to_owned),
                amount: object["amount_received"]
                    .as_i64()
                    .or_else(|| object["amount"].as_i64()),
                currency: object["currency"].as_str().map(str::to_owned),
            }
        });
        Ok(Self { id, kind, payment })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_payment_and_refuses_what_has_no_id() {
        let body = br#"{"id":"evt_1","type":"payment_intent.succeeded","data":{"object":{"id":"pi_1","amount":4200,"amount_received":4100,"currency":"eur","metadata":{"order_id":"ord_7"}}}}"#;
        let event = StripeEvent::parse(body).expect("event");
        assert_eq!(event.id, "evt_1");
        let payment = event.payment.expect("a payment");
        assert_eq!(payment.order_id.as_deref(), Some("ord_7"));
        assert_eq!(payment.amount, Some(4100));

        let other =
            StripeEvent::parse(br#"{"id":"evt_2","type":"customer.created"}"#).expect("event");
        assert_eq!(
            (other.kind.as_str(), other.payment),
            ("customer.created", None)
        );
        let bare = StripeEvent::parse(br#"{"id":"evt_3","type":"payment_intent.succeeded"}"#)
            .expect("event");
        assert_eq!(bare.payment.and_then(|p| p.order_id), None);

        assert_eq!(StripeEvent::parse(b"not json"), Err(InvalidEvent::NotJson));
        assert_eq!(StripeEvent::parse(b"{}"), Err(InvalidEvent::NoId));
        assert_eq!(StripeEvent::parse(br#"{"id":42}"#), Err(InvalidEvent::NoId));
        assert_eq!(StripeEvent::parse(br#"{"id":""}"#), Err(InvalidEvent::NoId));
        assert_eq!(StripeEvent::parse(b"[1]"), Err(InvalidEvent::NoId));
    }
}
