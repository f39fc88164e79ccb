//! One complete HTTP answer, as a test reads it.

use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use serde_json::Value;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// One complete HTTP answer.
#[derive(Clone, Debug)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body, as received.
    pub body: Vec<u8>,
    /// From sending the request to having read the whole body.
    pub latency: Duration,
}

impl Reply {
    /// Sends `request` and reads its whole answer, the latency measured from the send.
    pub async fn fetch(request: reqwest::RequestBuilder) -> Result<Reply, reqwest::Error> {
        let started = Instant::now();
        let response = request.send().await?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await?.to_vec();
        Ok(Reply {
            status,
            headers,
            body,
            latency: started.elapsed(),
        })
    }

    /// A header's value (lossy), if present.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    }

    /// Whether `Idempotent-Replayed: true` is present.
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics with the whole answer if it is not JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("the body is not JSON ({e}): {}", self.describe()))
    }

    /// A problem's `title` (its kind, e.g. `signature-stale`).
    pub fn problem_kind(&self) -> String {
        self.json()["title"].as_str().unwrap_or_default().to_owned()
    }

    /// Status, headers and body, for assertion messages.
    pub fn describe(&self) -> String {
        let mut out = format!("{} in {:?}\n", self.status, self.latency);
        for (name, value) in &self.headers {
            let _ = writeln!(
                out,
                "  {name}: {}",
                String::from_utf8_lossy(value.as_bytes())
            );
        }
        let _ = write!(out, "  body: {}", self.text());
        out
    }

    /// `Retry-After` as a duration (delta-seconds), if present and parseable.
    pub fn retry_after(&self) -> Option<Duration> {
        self.header("retry-after")
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64)
    }
}
