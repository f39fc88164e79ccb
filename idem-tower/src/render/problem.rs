//! An RFC 9457 problem as a value; [`render`](super) maps errors and answers to them.

use idem_core::StoredResponse;
use std::time::Duration;

/// The problem type URIs of the answers and errors (RFC 9457), under this prefix.
pub const PROBLEM_BASE: &str = "https://idem.rs/problems/";

/// A problem idem answers with (docs/state-machine.md, "HTTP mapping"), rendered by
/// [`to_response`](Self::to_response) or from its fields.
///
/// ```
/// use idem_tower::render::Problem;
/// use std::time::Duration;
/// let busy = Problem::new(409, "request-in-progress", "Still running.", true)
///     .with_retry_after(Duration::from_millis(1200));
/// assert_eq!(busy.type_uri(), "https://idem.rs/problems/request-in-progress");
/// let http = busy.to_response();
/// assert_eq!(http.status, 409);
/// assert_eq!(http.header("retry-after"), Some(&b"2"[..]));
/// assert_eq!(http.header("cache-control"), Some(&b"no-store"[..]));
/// assert_eq!(http.header("content-type"), Some(&b"application/problem+json"[..]));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Problem {
    /// The HTTP status.
    pub status: u16,
    /// The stable name (`idempotency-key-reused`); `type` is [`PROBLEM_BASE`] + `kind`.
    pub kind: &'static str,
    /// A sentence safe to show a client: it never echoes the request's body or key.
    pub detail: String,
    /// Whether the same request may succeed when sent again later.
    pub retryable: bool,
    /// When to try again (sent as `Retry-After`, whole seconds rounded up).
    pub retry_after: Option<Duration>,
}

impl Problem {
    /// The one text of an unknown outcome (C8), stored and sent by the engine and the layers
    /// (the engine stores [`outcome_unknown`](Self::outcome_unknown)'s response byte for byte;
    /// a test pins it).
    pub const OUTCOME_UNKNOWN: &'static str =
        "The request failed and may have taken effect; do not send it again with another key.";

    /// The stored 500 of an unknown outcome (C8), not retryable.
    ///
    /// ```
    /// let p = idem_tower::render::Problem::outcome_unknown();
    /// assert_eq!((p.status, p.kind, p.retryable), (500, "outcome-unknown", false));
    /// ```
    pub fn outcome_unknown() -> Self {
        Self::new(500, "outcome-unknown", Self::OUTCOME_UNKNOWN, false)
    }

    /// The stored 500 in place of a response that cannot be stored, not retryable.
    pub fn invalid_response() -> Self {
        Self::new(
            500,
            "invalid-response",
            "The server produced a response that could not be stored.",
            false,
        )
    }
    /// A problem without `Retry-After`.
    pub fn new(
        status: u16,
        kind: &'static str,
        detail: impl Into<String>,
        retryable: bool,
    ) -> Self {
        Self {
            status,
            kind,
            detail: detail.into(),
            retryable,
            retry_after: None,
        }
    }

    /// The same problem with `Retry-After`.
    pub fn with_retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = Some(retry_after);
        self
    }

    /// The `type` URI: [`PROBLEM_BASE`] + [`kind`](Self::kind).
    pub fn type_uri(&self) -> String {
        format!("{PROBLEM_BASE}{}", self.kind)
    }

    /// `application/problem+json` with `type`, `title`, `status`, `detail`, `retryable`;
    /// `Cache-Control: no-store`, and `Retry-After` when set.
    pub fn to_response(&self) -> StoredResponse {
        let body = format!(
            "{{\"type\":\"{}\",\"title\":\"{}\",\"status\":{},\"detail\":\"{}\",\"retryable\":{}}}",
            json_escape(&self.type_uri()),
            json_escape(self.kind),
            self.status,
            json_escape(&self.detail),
            self.retryable
        );
        let response = StoredResponse::new(self.status, body)
            .with_header("content-type", "application/problem+json")
            .with_header("cache-control", "no-store");
        match self.retry_after {
            Some(after) => response.with_header("retry-after", retry_after_secs(after).to_string()),
            None => response,
        }
    }
}

/// `Retry-After` in whole seconds, rounded up and at least 1 (C5).
///
/// ```
/// use idem_tower::render::retry_after_secs;
/// use std::time::Duration;
/// assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
/// assert_eq!(retry_after_secs(Duration::from_millis(1500)), 2);
/// ```
pub fn retry_after_secs(retry_after: Duration) -> u64 {
    u64::try_from(retry_after.as_millis().div_ceil(1000))
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Escapes a string for a JSON string literal: quotes, backslashes and control characters.
fn json_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{Failure, Idempotency, MemoryStore, Outcome, RunError};

    /// C8: the 500s the engine stores are this module's problems, byte for byte: one text per
    /// meaning, whichever side renders it.
    #[tokio::test]
    async fn c08_the_engine_stores_the_problems_rendered_here() {
        let idem = Idempotency::new(MemoryStore::new());
        let request = |key| {
            idem.request("acct", "POST", "/charges")
                .key(Some(key))
                .body(b"{}")
                .build()
                .expect("a request")
        };
        let unknown = idem
            .run(&request("unknown"), |_| async {
                Err::<StoredResponse, _>(Failure::unknown("timed out"))
            })
            .await;
        let Err(RunError::Unknown { response, .. }) = unknown else {
            panic!("{unknown:?}");
        };
        let prepared = |problem: Problem| {
            idem.policy()
                .prepare(problem.to_response())
                .expect("storable")
        };
        assert_eq!(response, prepared(Problem::outcome_unknown()));
        let unstorable = idem
            .run(&request("invalid"), |_| async {
                Ok::<_, Failure<()>>(StoredResponse::new(1000, "ok"))
            })
            .await;
        let Ok(Outcome::Executed(stored)) = unstorable else {
            panic!("{unstorable:?}");
        };
        assert_eq!(stored, prepared(Problem::invalid_response()));
    }

    #[test]
    fn a_detail_with_quotes_and_control_characters_stays_valid_json() {
        let p = Problem::new(400, "invalid-request", "a \"quoted\"\\ line\nbreak", false);
        let body = String::from_utf8(p.to_response().body).expect("utf-8");
        let value: serde_json::Value = serde_json::from_str(&body).expect("valid JSON");
        assert_eq!(value["detail"], "a \"quoted\"\\ line\nbreak");
        assert_eq!(value["status"], 400);
        assert_eq!(value["type"], "https://idem.rs/problems/invalid-request");
    }
}
