//! One HTTP attempt: the signed request, its bounded response, what it says.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::address::{literal_ip, AddressPolicy, GuardedResolver};
use crate::claim::Claimed;
use crate::Endpoint;

/// How much of a response body is stored with its attempt: the first KiB.
pub const STORED_RESPONSE: usize = 1024;

/// How much of a response body an attempt reads at most (the first [`STORED_RESPONSE`] bytes
/// kept, the rest dropped): a body that ends within it leaves its connection reusable.
const DRAINED_RESPONSE: usize = 64 * 1024;

/// What one attempt got.
#[derive(Debug)]
pub(crate) struct Sent {
    /// The response's status, if one came.
    pub(crate) status: Option<u16>,
    /// Why there was no usable answer (a transport error, a timeout, a refused address).
    pub(crate) error: Option<String>,
    /// The first KiB of the response body.
    pub(crate) response: Vec<u8>,
    /// A `Retry-After` in seconds the receiver sent.
    pub(crate) retry_after: Option<Duration>,
    /// The receiver sent `webhook-delivery: abort-message`.
    pub(crate) abort: bool,
    /// How long it took.
    pub(crate) duration: Duration,
}

/// The HTTP client of a dispatcher: no redirects, no proxy, the address policy in its resolver.
#[derive(Debug, Clone)]
pub(crate) struct Transport {
    client: reqwest::Client,
    policy: AddressPolicy,
}

impl Transport {
    pub(crate) fn new(policy: AddressPolicy) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            // A proxy (`HTTP_PROXY` from the environment) would resolve the receiver's name
            // itself, past the guarded resolver: the address policy holds only without one.
            .no_proxy()
            .dns_resolver(Arc::new(GuardedResolver { policy }))
            .user_agent(concat!("idem-outbox/", env!("CARGO_PKG_VERSION")))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self { client, policy })
    }

    /// Sends `claimed` to `endpoint`, signed now, within `timeout`.
    pub(crate) async fn send(
        &self,
        endpoint: &Endpoint,
        claimed: &Claimed,
        timeout: Duration,
    ) -> Sent {
        let started = Instant::now();
        let failed = |error: String| Sent {
            status: None,
            error: Some(error),
            response: Vec::new(),
            retry_after: None,
            abort: false,
            duration: started.elapsed(),
        };
        if let Some(ip) = literal_ip(&endpoint.url) {
            if !self.policy.allows(ip) {
                return failed(format!("the address {ip} is not allowed"));
            }
        }
        let headers = match signed_headers(endpoint, claimed) {
            Ok(headers) => headers,
            Err(error) => return failed(error),
        };
        let request = self
            .client
            .post(endpoint.url.clone())
            .headers(headers)
            .body(claimed.payload.clone());
        // One deadline for the whole attempt, so it ends within the claim. The status and
        // headers are read under it; the body then gets what is left of it, and a body that
        // does not end in time leaves the status as it came (a 2xx delivers whatever its body).
        let deadline = tokio::time::Instant::from_std(started) + timeout;
        let mut response = match tokio::time::timeout_at(deadline, request.send()).await {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => return failed(describe(&error)),
            Err(_) => return failed(format!("timed out after {timeout:?}")),
        };
        let (retry_after, abort) = instructions(response.headers());
        let mut body = Vec::new();
        let _ended = tokio::time::timeout_at(deadline, drain(&mut response, &mut body)).await;
        Sent {
            status: Some(response.status().as_u16()),
            error: None,
            response: body,
            retry_after,
            abort,
            duration: started.elapsed(),
        }
    }
}

/// What the receiver's headers ask: a `Retry-After` in seconds, and whether it sent
/// `webhook-delivery: abort-message`.
fn instructions(headers: &HeaderMap) -> (Option<Duration>, bool) {
    let retry_after = headers
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let abort = headers
        .get("webhook-delivery")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("abort-message"));
    (retry_after, abort)
}

/// Reads `response`'s body into `body`, the first [`STORED_RESPONSE`] bytes kept: what was
/// read stays in `body` when the read is cut short. The rest is read and dropped up to
/// `DRAINED_RESPONSE`, so a connection whose body ends there goes back to the pool for the
/// next attempt (a response dropped unread closes it); a longer body is never downloaded.
async fn drain(response: &mut reqwest::Response, body: &mut Vec<u8>) {
    let mut read = 0;
    while read < DRAINED_RESPONSE {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                read += chunk.len();
                let room = STORED_RESPONSE.saturating_sub(body.len());
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) | Err(_) => break,
        }
    }
}

/// The message's headers, its content type and the Standard Webhooks headers, signed now
/// under every secret of the endpoint.
fn signed_headers(endpoint: &Endpoint, claimed: &Claimed) -> Result<HeaderMap, String> {
    let timestamp = idem_signature::now_unix();
    let signature = endpoint.signer.sign_with_all_secrets(
        claimed.message_id.as_str(),
        timestamp,
        &claimed.payload,
    );
    let mut headers = HeaderMap::new();
    let mut put = |name: &str, value: &str| -> Result<(), String> {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| e.to_string())?;
        let value = HeaderValue::from_str(value).map_err(|e| e.to_string())?;
        headers.insert(name, value);
        Ok(())
    };
    for (name, value) in &claimed.headers {
        put(name, value)?;
    }
    put("content-type", &claimed.content_type)?;
    put("webhook-id", claimed.message_id.as_str())?;
    put("webhook-timestamp", &timestamp.to_string())?;
    put("webhook-signature", &signature)?;
    Ok(headers)
}

/// A transport error with its causes.
fn describe(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
