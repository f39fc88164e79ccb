//! The final answer of an operation, read whole, with what the client knows about how it got it.

use crate::{IdempotencyKey, DEFAULT_KEY_HEADER};
use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderName};
use reqwest::StatusCode;
use std::fmt;
use std::time::Duration;

/// The header a server built on `idem` (and Stripe) sets on a replayed answer.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// The answer that ended an operation, its body read whole (the client buffers every answer:
/// it must see it complete to know the attempt succeeded), with the attempts it took, the key
/// it was sent under and whether the server replayed a stored answer.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let client = idem_client::Client::new(reqwest::Client::new());
/// let response = client
///     .send(client.post("http://127.0.0.1:8080/v1/charges").form(&[("amount", "4242"), ("currency", "usd")]))
///     .await?;
/// println!(
///     "{} after {} attempt(s), replayed: {}, key: {:?}",
///     response.status(),
///     response.attempts(),
///     response.replayed(),
///     response.key().map(|k| k.as_str()),
/// );
/// let charge: serde_json::Value = response.json()?;
/// # let _ = charge;
/// # Ok(())
/// # }
/// ```
///
/// Its `Debug` form shows the body's length, not the body, and hides the key: the key's own
/// `Debug`, and the value of the key header wherever the server echoes it.
#[derive(Clone)]
pub struct Response {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    pub(crate) attempts: u32,
    pub(crate) key: Option<IdempotencyKey>,
    pub(crate) elapsed: Duration,
    /// The key header's name, whose value `Debug` hides.
    pub(crate) key_header: HeaderName,
}

impl fmt::Debug for Response {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Response")
            .field("status", &self.status)
            .field(
                "headers",
                &RedactedHeaders {
                    headers: &self.headers,
                    key_header: &self.key_header,
                },
            )
            .field("body", &format_args!("<{} bytes>", self.body.len()))
            .field("attempts", &self.attempts)
            .field("key", &self.key)
            .field("elapsed", &self.elapsed)
            .finish()
    }
}

/// Headers whose `Debug` hides the key header's value (and any value marked sensitive).
pub(crate) struct RedactedHeaders<'a> {
    pub(crate) headers: &'a HeaderMap,
    pub(crate) key_header: &'a HeaderName,
}

impl fmt::Debug for RedactedHeaders<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for (name, value) in self.headers {
            if name == self.key_header || name == DEFAULT_KEY_HEADER || value.is_sensitive() {
                map.entry(name, &format_args!("<redacted>"));
            } else {
                map.entry(name, value);
            }
        }
        map.finish()
    }
}

impl Response {
    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The body, whole.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The body, as owned bytes.
    pub fn into_body(self) -> Bytes {
        self.body
    }

    /// The body as UTF-8 text, lossily.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON.
    ///
    /// # Errors
    ///
    /// When the body is not JSON of that shape (the operation itself succeeded).
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> serde_json::Result<T> {
        serde_json::from_slice(&self.body)
    }

    /// How many attempts the operation made, this answer's included (1 = no retry).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The idempotency key every attempt carried. `None` exactly when the method is a safe one
    /// (GET, HEAD, OPTIONS, TRACE: [`is_safe_method`](crate::is_safe_method)) and the caller
    /// gave no key: such a request is sent without one. Every other method always has one.
    pub fn key(&self) -> Option<&IdempotencyKey> {
        self.key.as_ref()
    }

    /// From the first attempt's start to this answer's last byte.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// Whether the server says it replayed a stored answer (`Idempotent-Replayed: true`): the
    /// operation ran earlier (an attempt that timed out, a concurrent copy) and this is its
    /// answer, not a second execution.
    pub fn replayed(&self) -> bool {
        is_replayed(&self.headers)
    }
}

/// Whether `headers` say `Idempotent-Replayed: true` (any case, surrounding spaces ignored):
/// the server replayed the operation's stored answer. [`Response::replayed`] for the client's
/// answers; this for a `reqwest::Response` that came through the
/// [`IdempotencyMiddleware`](crate::IdempotencyMiddleware).
///
/// ```
/// use idem_client::is_replayed;
/// use idem_client::reqwest::header::{HeaderMap, HeaderValue};
///
/// let mut headers = HeaderMap::new();
/// assert!(!is_replayed(&headers));
/// headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
/// assert!(is_replayed(&headers));
/// ```
pub fn is_replayed(headers: &HeaderMap) -> bool {
    headers.get_all(REPLAYED_HEADER).iter().any(|value| {
        value
            .to_str()
            .is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn c07_the_replay_mark_is_read_case_insensitively_and_only_as_true() {
        let mut headers = HeaderMap::new();
        assert!(!is_replayed(&headers));
        for (value, replayed) in [
            ("true", true),
            (" TRUE ", true),
            ("false", false),
            ("1", false),
        ] {
            headers.insert(REPLAYED_HEADER, HeaderValue::from_static(value));
            assert_eq!(is_replayed(&headers), replayed, "{value:?}");
        }
    }
}
