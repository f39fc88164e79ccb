//! Messages: what an effect sends, built before it is enqueued.

use crate::endpoint::check_name;
use crate::{MessageId, OutboxError};

/// The default limit of a message's payload: 256 KiB (configurable per outbox).
pub const DEFAULT_MAX_PAYLOAD: usize = 256 * 1024;

/// At most this many headers of a message's own.
pub const MAX_HEADERS: usize = 32;

/// Headers the outbox sets itself (or that HTTP sets): a message cannot set them.
const RESERVED: [&str; 12] = [
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "content-type",
    "content-length",
    "host",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
];

/// A message: its stable id (made here, sent unchanged on every attempt), its payload (bytes
/// or JSON), its headers, and the endpoints it goes to (one delivery each).
///
/// ```
/// use idem_outbox::{Message, OutboxError};
/// let message = Message::json(&serde_json::json!({"type": "charge.succeeded"}))?
///     .to("merchant")
///     .header("x-event-type", "charge.succeeded")?;
/// assert!(message.id().as_str().starts_with("msg_"));
/// assert_eq!(message.content_type(), "application/json");
/// assert!(matches!(Message::bytes("text/plain", "hi").header("webhook-id", "x"), Err(OutboxError::InvalidHeader { .. })));
/// # Ok::<(), OutboxError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Message {
    id: MessageId,
    payload: Vec<u8>,
    content_type: String,
    headers: Vec<(String, String)>,
    endpoints: Vec<String>,
}

impl Message {
    /// A message of `payload` bytes sent as `content_type`.
    pub fn bytes(content_type: &str, payload: impl Into<Vec<u8>>) -> Self {
        Self {
            id: MessageId::generate(),
            payload: payload.into(),
            content_type: content_type.to_owned(),
            headers: Vec::new(),
            endpoints: Vec::new(),
        }
    }

    /// A message of `value` as JSON (`application/json`).
    pub fn json<T: serde::Serialize + ?Sized>(value: &T) -> Result<Self, OutboxError> {
        let payload = serde_json::to_vec(value).map_err(|e| OutboxError::Json(e.to_string()))?;
        Ok(Self::bytes("application/json", payload))
    }

    /// The same message also delivered to the endpoint registered as `endpoint`.
    #[must_use]
    pub fn to(mut self, endpoint: &str) -> Self {
        if !self.endpoints.iter().any(|e| e == endpoint) {
            self.endpoints.push(endpoint.to_owned());
        }
        self
    }

    /// The same message with the header `name: value` on every attempt. Refused: a name that
    /// is not an HTTP token, a value that is not visible ASCII (and spaces), a name the outbox
    /// or HTTP sets (`webhook-*`, `content-type`, `host`, ...), a repeated name, more than
    /// [`MAX_HEADERS`].
    pub fn header(mut self, name: &str, value: &str) -> Result<Self, OutboxError> {
        let invalid = |reason| OutboxError::InvalidHeader {
            name: name.to_owned(),
            reason,
        };
        let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if name.is_empty() || name.len() > 128 || !name.bytes().all(token) {
            return Err(invalid("not an HTTP header name"));
        }
        let lower = name.to_ascii_lowercase();
        if RESERVED.contains(&lower.as_str()) || lower.starts_with("svix-") {
            return Err(invalid("set by the outbox or by HTTP"));
        }
        if value.len() > 4096
            || !value
                .bytes()
                .all(|b| b == b' ' || (0x21..=0x7e).contains(&b))
        {
            return Err(invalid(
                "the value is not visible ASCII of at most 4096 bytes",
            ));
        }
        if self.headers.iter().any(|(n, _)| *n == lower) {
            return Err(invalid("repeated"));
        }
        if self.headers.len() >= MAX_HEADERS {
            return Err(invalid("more than 32 headers"));
        }
        self.headers.push((lower, value.to_owned()));
        Ok(self)
    }

    /// The stable id.
    pub fn id(&self) -> &MessageId {
        &self.id
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The payload's media type.
    pub fn content_type(&self) -> &str {
        &self.content_type
    }

    /// The endpoints named.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Everything [`enqueue`](crate::SqliteOutbox::enqueue) checks before it writes: an
    /// endpoint at least, valid names, a valid content type, the payload within `max_payload`.
    pub(crate) fn check(&self, max_payload: usize) -> Result<(), OutboxError> {
        if self.endpoints.is_empty() {
            return Err(OutboxError::NoEndpoint);
        }
        for endpoint in &self.endpoints {
            check_name(endpoint)?;
        }
        if self.payload.len() > max_payload {
            return Err(OutboxError::PayloadTooLarge {
                size: self.payload.len(),
                limit: max_payload,
            });
        }
        let content_type_ok = !self.content_type.is_empty()
            && self.content_type.len() <= 256
            && self
                .content_type
                .bytes()
                .all(|b| b == b' ' || (0x21..=0x7e).contains(&b));
        if !content_type_ok {
            return Err(OutboxError::InvalidHeader {
                name: "content-type".into(),
                reason: "not visible ASCII of at most 256 bytes",
            });
        }
        Ok(())
    }

    /// The headers as stored: a JSON array of `[name, value]` pairs.
    pub(crate) fn stored_headers(&self) -> String {
        serde_json::to_string(&self.headers).unwrap_or_else(|_| "[]".to_owned())
    }

    /// The endpoint names as stored for the enqueue statement: a JSON array.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn stored_endpoints(&self) -> String {
        serde_json::to_string(&self.endpoints).unwrap_or_else(|_| "[]".to_owned())
    }
}

/// Headers read back from their stored form.
pub(crate) fn headers_from_stored(text: &str) -> Result<Vec<(String, String)>, OutboxError> {
    serde_json::from_str(text).map_err(|_| OutboxError::Corrupt(format!("headers {text:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c17_bad_messages_are_refused_before_anything_is_written() {
        let big = Message::bytes(
            "application/octet-stream",
            vec![0u8; DEFAULT_MAX_PAYLOAD + 1],
        )
        .to("m");
        assert!(matches!(
            big.check(DEFAULT_MAX_PAYLOAD),
            Err(OutboxError::PayloadTooLarge { size, limit }) if size == DEFAULT_MAX_PAYLOAD + 1 && limit == DEFAULT_MAX_PAYLOAD
        ));
        let at_limit =
            Message::bytes("application/octet-stream", vec![0u8; DEFAULT_MAX_PAYLOAD]).to("m");
        assert!(at_limit.check(DEFAULT_MAX_PAYLOAD).is_ok());
        assert!(matches!(
            Message::bytes("a/b", "x").check(10),
            Err(OutboxError::NoEndpoint)
        ));
        assert!(matches!(
            Message::bytes("a/b", "x").to("a b").check(10),
            Err(OutboxError::InvalidEndpointName(_))
        ));
        assert!(matches!(
            Message::bytes("a/\nb", "x").to("m").check(10),
            Err(OutboxError::InvalidHeader { .. })
        ));
        for (name, value) in [
            ("Webhook-Signature", "v1,x"),
            ("svix-id", "x"),
            ("content-type", "a/b"),
            ("bad name", "x"),
            ("x-ok", "line\nbreak"),
        ] {
            assert!(
                Message::bytes("a/b", "x").header(name, value).is_err(),
                "{name}"
            );
        }
        assert!(Message::bytes("a/b", "x")
            .header("x-a", "1")
            .and_then(|m| m.header("X-A", "2"))
            .is_err());
    }

    #[test]
    fn headers_round_trip_through_their_stored_form() -> Result<(), OutboxError> {
        let message = Message::bytes("a/b", "x").header("X-Event", "charge.succeeded")?;
        assert_eq!(
            headers_from_stored(&message.stored_headers())?,
            vec![("x-event".to_owned(), "charge.succeeded".to_owned())]
        );
        Ok(())
    }
}
