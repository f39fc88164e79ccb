//! The client: a `reqwest::Client`, a retry policy and the key header's name.

use crate::{Error, Operation, Response, RetryPolicy};
use reqwest::header::HeaderName;
use reqwest::{IntoUrl, Method, RequestBuilder};

/// The default name of the key's header (draft-ietf-httpapi-idempotency-key-header, Stripe).
pub const DEFAULT_KEY_HEADER: &str = "idempotency-key";

/// An HTTP client for idempotent APIs: every operation gets one idempotency key, kept on each
/// of its retries, and is retried the way Stripe's client libraries do (see the crate docs for
/// what is retried and why).
///
/// Cloning is cheap (the `reqwest::Client` inside is shared).
///
/// ```no_run
/// use idem_client::{Client, RetryPolicy};
/// use std::time::Duration;
///
/// # async fn demo() -> Result<(), idem_client::Error> {
/// let client = Client::new(reqwest::Client::new())
///     .with_policy(RetryPolicy::default().deadline(Duration::from_secs(30)));
/// let response = client
///     .send(
///         client
///             .post("http://127.0.0.1:8080/v1/charges")
///             .bearer_auth("sk_test_123")
///             .form(&[("amount", "4242"), ("currency", "usd")]),
///     )
///     .await?;
/// assert!(response.status().is_success());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    policy: RetryPolicy,
    key_header: HeaderName,
}

impl Client {
    /// A client sending with `http`, under the default [`RetryPolicy`] and the
    /// `Idempotency-Key` header.
    pub fn new(http: reqwest::Client) -> Self {
        Self {
            http,
            policy: RetryPolicy::default(),
            key_header: HeaderName::from_static(DEFAULT_KEY_HEADER),
        }
    }

    /// With `policy` for every operation (an [`Operation`] may override it).
    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// With the key sent in the header `name` instead of `Idempotency-Key`.
    ///
    /// ```
    /// use reqwest::header::HeaderName;
    ///
    /// let client = idem_client::Client::new(reqwest::Client::new())
    ///     .with_key_header(HeaderName::from_static("x-request-key"));
    /// assert_eq!(client.key_header().as_str(), "x-request-key");
    /// ```
    pub fn with_key_header(mut self, name: HeaderName) -> Self {
        self.key_header = name;
        self
    }

    /// The policy operations run under.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// The key's header name.
    pub fn key_header(&self) -> &HeaderName {
        &self.key_header
    }

    /// The `reqwest::Client` inside.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// A request builder of `method` to `url`, on the client inside.
    pub fn request<U: IntoUrl>(&self, method: Method, url: U) -> RequestBuilder {
        self.http.request(method, url)
    }

    /// A `GET` request builder.
    pub fn get<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.http.get(url)
    }

    /// A `POST` request builder.
    pub fn post<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.http.post(url)
    }

    /// A `PUT` request builder.
    pub fn put<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.http.put(url)
    }

    /// A `PATCH` request builder.
    pub fn patch<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.http.patch(url)
    }

    /// A `DELETE` request builder.
    pub fn delete<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.http.delete(url)
    }

    /// One logical operation: the request `builder` makes, to be sent (and retried) by
    /// [`Operation::send`]. The `reqwest::Client` that made the builder sends every attempt.
    pub fn operation(&self, builder: RequestBuilder) -> Operation<'_> {
        Operation::new(self, builder)
    }

    /// Sends the request `builder` makes as one operation, retried under the client's policy:
    /// `self.operation(builder).send()`.
    pub async fn send(&self, builder: RequestBuilder) -> Result<Response, Error> {
        self.operation(builder).send().await
    }
}
