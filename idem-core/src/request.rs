//! An incoming request as idem sees it: its record id and its fingerprint.

use crate::error::{Error, Field};
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;
use crate::policy::Policy;
use crate::scope::{RecordId, Scope};

/// A validated request: which record it addresses, and what it means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// (consumer, route, key).
    pub id: RecordId,
    /// The digest of method, route, named headers and body.
    pub fingerprint: Fingerprint,
}

impl Request {
    /// Puts a validated id and a fingerprint together.
    pub fn new(id: RecordId, fingerprint: Fingerprint) -> Self {
        Self { id, fingerprint }
    }

    /// Starts building a request from raw parts; see [`RequestBuilder`].
    pub fn builder<'a>(consumer: &'a str, method: &'a str, route: &'a str) -> RequestBuilder<'a> {
        RequestBuilder {
            consumer,
            method,
            route,
            key: None,
            headers: Vec::new(),
            body: &[],
            json_exclude: None,
            max_body_bytes: Policy::default().max_body_bytes,
        }
    }
}

/// Builds a [`Request`] from what arrives over the wire, checking every rule on the way: the
/// key (C1, missing is an error), the scope (C2), the body limit (C12); the route is scoped as
/// `"METHOD route"`.
///
/// ```
/// use idem_core::{Error, Request};
/// let body = br#"{"amount": 1000, "currency": "eur"}"#;
/// let request = Request::builder("acct_42", "POST", "/v1/charges")
///     .key(Some("4f1c2a40-0f0e-4b43-9d2b-7c0b7e0f6b11"))
///     .json_body(body, &["/metadata/sent_at"])
///     .build()?;
/// assert_eq!(request.id.route(), "POST /v1/charges");
///
/// let missing = Request::builder("acct_42", "POST", "/v1/charges").body(body).build();
/// assert_eq!(missing.unwrap_err().http_status(), 400);
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct RequestBuilder<'a> {
    consumer: &'a str,
    method: &'a str,
    route: &'a str,
    key: Option<&'a str>,
    headers: Vec<(&'a str, &'a [u8])>,
    body: &'a [u8],
    json_exclude: Option<&'a [&'a str]>,
    max_body_bytes: usize,
}

impl<'a> RequestBuilder<'a> {
    /// The `Idempotency-Key` header's value, `None` when the header is missing.
    pub fn key(mut self, key: Option<&'a str>) -> Self {
        self.key = key;
        self
    }

    /// A header that is part of the request's meaning (fed to the fingerprint).
    pub fn header(mut self, name: &'a str, value: &'a [u8]) -> Self {
        self.headers.push((name, value));
        self
    }

    /// The raw body.
    pub fn body(mut self, body: &'a [u8]) -> Self {
        self.body = body;
        self.json_exclude = None;
        self
    }

    /// A JSON body, canonicalised and with volatile fields excluded (see
    /// [`canonical_json`](crate::canonical_json)).
    pub fn json_body(mut self, body: &'a [u8], exclude: &'a [&'a str]) -> Self {
        self.body = body;
        self.json_exclude = Some(exclude);
        self
    }

    /// The body limit (default: [`Policy::max_body_bytes`]'s default).
    pub fn max_body_bytes(mut self, limit: usize) -> Self {
        self.max_body_bytes = limit;
        self
    }

    /// Validates everything and computes the fingerprint.
    pub fn build(self) -> Result<Request, Error> {
        let key = IdempotencyKey::required(self.key)?;
        if self.body.len() > self.max_body_bytes {
            return Err(Error::BodyTooLarge {
                limit: self.max_body_bytes,
                actual: self.body.len(),
            });
        }
        if self.method.is_empty()
            || self.method.len() > 32
            || !self
                .method
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(Error::invalid(Field::Method, "not an HTTP method token"));
        }
        let scope = Scope::new(self.consumer, &format!("{} {}", self.method, self.route))?;
        let mut fingerprint = Fingerprint::builder().method(self.method).route(self.route);
        for (name, value) in &self.headers {
            fingerprint = fingerprint.header(name, value);
        }
        fingerprint = match self.json_exclude {
            Some(exclude) => fingerprint.json_body(self.body, exclude)?,
            None => fingerprint.body(self.body),
        };
        Ok(Request::new(
            RecordId::new(scope, key),
            fingerprint.finish(),
        ))
    }
}
