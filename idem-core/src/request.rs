//! An incoming request as idem sees it: its record id and its fingerprint.

use crate::error::{Error, Field};
use crate::fingerprint::{Domain, Fingerprint};
use crate::key::IdempotencyKey;
use crate::policy::Policy;
use crate::scope::{RecordId, Scope};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A validated request: its record, its meaning, and its body's size (the engine enforces its
/// body limit on every request, however built, C12).
///
/// ```
/// use idem_core::Request;
/// let request = Request::builder("acct_1", "POST", "/customers/{id}/refunds")
///     .path("/customers/cus_A/refunds?notify=1")
///     .key(Some("k-1"))
///     .body(b"{}")
///     .build()?;
/// assert_eq!(request.id().route(), "POST /customers/{id}/refunds");
/// assert_eq!(request.body_len(), 2);
/// # Ok::<(), idem_core::Error>(())
/// ```
///
/// Cloning is cheap (one `Arc`): an execution that outlives its caller holds its own.
#[derive(Clone, PartialEq, Eq)]
pub struct Request(Arc<Parts>);

#[derive(Clone, PartialEq, Eq)]
struct Parts {
    id: RecordId,
    fingerprint: Fingerprint,
    body_len: usize,
    one_commit: Option<bool>,
    store_budget: Option<Duration>,
    /// The fingerprint a record of this request may also carry (C3).
    alternative: Option<Fingerprint>,
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("id", &self.0.id)
            .field("fingerprint", &self.0.fingerprint)
            .field("body_len", &self.0.body_len)
            .field("one_commit", &self.0.one_commit)
            .field("store_budget", &self.0.store_budget)
            .field("alternative", &self.alternative_fingerprint())
            .finish()
    }
}

impl Request {
    /// A request from a validated id, a fingerprint and its body's size (for callers that
    /// fingerprint requests themselves).
    pub fn from_parts(id: RecordId, fingerprint: Fingerprint, body_len: usize) -> Self {
        Self(Arc::new(Parts {
            id,
            fingerprint,
            body_len,
            one_commit: None,
            store_budget: None,
            alternative: None,
        }))
    }

    /// Starts building a request from raw parts; see [`RequestBuilder`].
    pub fn builder<'a>(consumer: &'a str, method: &'a str, route: &'a str) -> RequestBuilder<'a> {
        RequestBuilder {
            consumer,
            method,
            route,
            path: None,
            key: None,
            headers: Vec::new(),
            content_type: None,
            body: &[],
            canonical: None,
            max_body_bytes: Policy::DEFAULT_MAX_BODY_BYTES,
        }
    }

    /// (consumer, route, key).
    pub fn id(&self) -> &RecordId {
        &self.0.id
    }

    /// The digest of method, path and query, named headers and body (C3).
    pub fn fingerprint(&self) -> &Fingerprint {
        &self.0.fingerprint
    }

    /// The size of the body, in bytes.
    pub fn body_len(&self) -> usize {
        self.0.body_len
    }

    /// This request, made in one commit (`true`) or two by a transactional execution (C15),
    /// whatever [`Policy::one_commit`] (its caveat applies) says. The guard and the plain
    /// closure commit the reservation before the effect, and refuse a one-commit request.
    ///
    /// ```
    /// use idem_core::Request;
    /// let request = Request::builder("acct_1", "POST", "/charges").key(Some("k1")).build()?;
    /// assert_eq!(request.one_commit(), None);
    /// let request = request.with_one_commit(true);
    /// assert_eq!(request.one_commit(), Some(true));
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn with_one_commit(mut self, one: bool) -> Self {
        let parts = Arc::make_mut(&mut self.0);
        parts.one_commit = Some(one);
        self
    }

    /// This request, also recognised in a record stored under `fingerprint` (C3): such a
    /// record replays or is in flight for it, never a mismatch. For a change of
    /// how requests are fingerprinted, so that records stored under the old form keep their
    /// retries (idem-tower gives a JSON body's raw form). Every write is under
    /// [`fingerprint`](Self::fingerprint), never the alternative: a store's step fetches the
    /// response of a record under either, and the engine decides it as found.
    ///
    /// ```
    /// use idem_core::Request;
    /// let build = |body: &'static [u8]| Request::builder("acct_1", "POST", "/charges").key(Some("k1")).body(body).build();
    /// let (new, old) = (build(b"canonical")?, build(b"raw")?);
    /// let new = new.with_alternative_fingerprint(*old.fingerprint());
    /// assert!(new.accepts(old.fingerprint()));
    /// assert_eq!(new.alternative_fingerprint(), Some(old.fingerprint()));
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn with_alternative_fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        let parts = Arc::make_mut(&mut self.0);
        parts.alternative = (fingerprint != parts.fingerprint).then_some(fingerprint);
        self
    }

    /// The fingerprint a stored record may also carry to be this request's
    /// ([`with_alternative_fingerprint`](Self::with_alternative_fingerprint)).
    pub fn alternative_fingerprint(&self) -> Option<&Fingerprint> {
        self.0.alternative.as_ref()
    }

    /// Its own fingerprint and its alternative (its own again when it has none): what a store's
    /// step fetches a record's response under (rule 2 of [`Store`](crate::Store), C3), as one
    /// statement's two parameters.
    ///
    /// ```
    /// use idem_core::Request;
    /// let build = |body: &'static [u8]| Request::builder("acct_1", "POST", "/charges").key(Some("k1")).body(body).build();
    /// let (new, old) = (build(b"canonical")?, build(b"raw")?);
    /// assert_eq!(new.fingerprints(), [new.fingerprint(), new.fingerprint()]);
    /// let new = new.with_alternative_fingerprint(*old.fingerprint());
    /// assert_eq!(new.fingerprints(), [new.fingerprint(), old.fingerprint()]);
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn fingerprints(&self) -> [&Fingerprint; 2] {
        let own = self.fingerprint();
        [own, self.alternative_fingerprint().unwrap_or(own)]
    }

    /// Whether a record stored under `fingerprint` is this request's: its own fingerprint or
    /// its alternative (C3).
    pub fn accepts(&self, fingerprint: &Fingerprint) -> bool {
        self.fingerprint() == fingerprint || self.alternative_fingerprint() == Some(fingerprint)
    }

    /// Whether a transactional execution of this request makes one commit, where the caller
    /// chose ([`with_one_commit`](Self::with_one_commit)); `None`: the engine's policy decides.
    pub fn one_commit(&self) -> Option<bool> {
        self.0.one_commit
    }

    /// The same request with its own store budget (C13): the time the engine may wait on the
    /// store for it, across every step, in place of [`Policy::store_timeout`]. A caller's
    /// deadline (gRPC's `grpc-timeout`, say) lowers it this way.
    ///
    /// ```
    /// use idem_core::Request;
    /// use std::time::Duration;
    /// let request = Request::builder("acct_1", "POST", "/charges").key(Some("k")).build()?;
    /// assert_eq!(request.store_budget(), None);
    /// let request = request.with_store_budget(Duration::from_millis(800));
    /// assert_eq!(request.store_budget(), Some(Duration::from_millis(800)));
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn with_store_budget(mut self, budget: Duration) -> Self {
        Arc::make_mut(&mut self.0).store_budget = Some(budget);
        self
    }

    /// The store budget the caller chose ([`with_store_budget`](Self::with_store_budget));
    /// `None`: the policy's [`store_timeout`](Policy::store_timeout).
    pub fn store_budget(&self) -> Option<Duration> {
        self.0.store_budget
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c03_one_record_whatever_the_spelling_of_the_method() {
        let build = |method: &str| {
            Request::builder("acct", method, "/v1/charges")
                .key(Some("k"))
                .body(b"{}")
                .build()
                .expect("a request")
        };
        let (upper, lower, mixed) = (build("POST"), build("post"), build("Post"));
        assert_eq!(upper.id(), lower.id());
        assert_eq!(upper.id(), mixed.id());
        assert_eq!(upper.id().route(), "POST /v1/charges");
        assert_eq!(upper.fingerprint(), lower.fingerprint());
        assert_eq!(upper.fingerprint(), mixed.fingerprint());
    }

    #[test]
    fn c03_the_content_type_and_the_form_order_count_as_they_should() {
        // The canonical form of both bodies, as idem-tower makes it.
        let canonical = b"amount=100&currency=usd";
        let build = |content_type: &str, body: &'static [u8], form: bool| {
            let builder = Request::builder("acct", "POST", "/v1/charges")
                .key(Some("k"))
                .content_type(content_type)
                .body(body);
            let builder = if form {
                builder.canonical_form(canonical)
            } else {
                builder
            };
            builder.build().expect("a request")
        };
        let form = "application/x-www-form-urlencoded";
        let as_form = build(form, b"amount=100&currency=usd", true);
        let reordered = build(form, b"currency=usd&amount=100", true);
        let as_text = build("text/plain", b"amount=100&currency=usd", false);
        assert_eq!(as_form.fingerprint(), reordered.fingerprint());
        assert_ne!(as_form.fingerprint(), as_text.fingerprint());
        assert_eq!(
            reordered.body_len(),
            23,
            "the body as received counts, not its canonical form"
        );
    }

    #[test]
    fn c03_an_alternative_fingerprint_follows_the_request() {
        let build = |body: &'static [u8]| {
            Request::builder("acct", "POST", "/v1/charges")
                .key(Some("k"))
                .body(body)
                .build()
                .expect("a request")
        };
        let (new, old, other) = (build(b"new"), build(b"old"), build(b"other"));
        let both = new
            .clone()
            .with_alternative_fingerprint(*old.fingerprint())
            .with_one_commit(true);
        assert!(both.accepts(new.fingerprint()) && both.accepts(old.fingerprint()));
        assert!(!both.accepts(other.fingerprint()));
        assert_eq!(both.alternative_fingerprint(), Some(old.fingerprint()));
        assert_eq!(both.one_commit(), Some(true));
        let same = new.clone().with_alternative_fingerprint(*new.fingerprint());
        assert_eq!(
            same.alternative_fingerprint(),
            None,
            "its own is no alternative"
        );
    }

    #[test]
    fn c03_a_route_template_without_its_concrete_path_is_refused() {
        for template in [
            "/customers/{id}/refunds",
            "/customers/:id/refunds",
            "/files/*rest",
        ] {
            let err = Request::builder("acct", "POST", template)
                .key(Some("k"))
                .build()
                .expect_err(template);
            assert!(matches!(
                err,
                Error::InvalidInput {
                    field: Field::Route,
                    ..
                }
            ));
            assert!(Request::builder("acct", "POST", template)
                .path("/customers/cus_A/refunds")
                .key(Some("k"))
                .build()
                .is_ok());
        }
        assert!(Request::builder("acct", "POST", "/v1/charges")
            .key(Some("k"))
            .build()
            .is_ok());
    }
}

/// Whether a route names parameters (`{id}`, `:id`, `*rest`) instead of one resource.
fn is_template(route: &str) -> bool {
    route.contains(['{', '}', '*']) || route.contains("/:")
}

/// Builds a [`Request`] from what arrives over the wire, checking every rule on the way: the
/// key (C1, missing is an error), the scope (C2), the body limit (C12).
///
/// **Scope and fingerprint.** The record is scoped by the consumer and `"METHOD route"`: the
/// route names the operation and may be a template (`/customers/{id}/refunds`). The fingerprint
/// covers the method, the **concrete path and query** ([`path`](Self::path), the route when not
/// given), the named headers and the body (C3), so two resources under one template with the
/// same key and body are a mismatch, never each other's replay. A route that looks like a
/// template (`{id}`, `:id`, `*rest`) without a path is refused ([`Error::InvalidInput`]), so
/// that a forgotten `.path()` cannot let one resource replay another's answer.
///
/// ```
/// use idem_core::{Error, Request};
/// let body = br#"{"amount": 1000, "currency": "eur"}"#;
/// // What idem-tower's `canonical::canonical_json(body, &["/metadata/sent_at"])` makes of it.
/// let canonical = br#"{"amount":1000,"currency":"eur"}"#;
/// let request = Request::builder("acct_42", "POST", "/v1/charges")
///     .key(Some("4f1c2a40-0f0e-4b43-9d2b-7c0b7e0f6b11"))
///     .body(body)
///     .canonical_json(canonical)
///     .build()?;
/// assert_eq!(request.id().route(), "POST /v1/charges");
///
/// let missing = Request::builder("acct_42", "POST", "/v1/charges").body(body).build();
/// assert!(matches!(missing, Err(Error::KeyMissing)));
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct RequestBuilder<'a> {
    consumer: &'a str,
    method: &'a str,
    route: &'a str,
    path: Option<&'a str>,
    key: Option<&'a str>,
    headers: Vec<(&'a str, &'a [u8])>,
    content_type: Option<&'a str>,
    body: &'a [u8],
    /// What the fingerprint hashes instead of the body, and its domain.
    canonical: Option<(&'a [u8], Domain)>,
    max_body_bytes: usize,
}

impl<'a> RequestBuilder<'a> {
    /// The `Idempotency-Key` header's value, `None` when the header is missing.
    pub fn key(mut self, key: Option<&'a str>) -> Self {
        self.key = key;
        self
    }

    /// The concrete path and query the request was sent to (`/customers/cus_A/refunds?x=1`),
    /// fed to the fingerprint. Defaults to the route.
    pub fn path(mut self, path: &'a str) -> Self {
        self.path = Some(path);
        self
    }

    /// A header that is part of the request's meaning (fed to the fingerprint).
    pub fn header(mut self, name: &'a str, value: &'a [u8]) -> Self {
        self.headers.push((name, value));
        self
    }

    /// The request's `Content-Type` header: its media type is part of the fingerprint (C3), so
    /// the same bytes sent as JSON and as a form are two requests (a mismatch under one key).
    pub fn content_type(mut self, content_type: &'a str) -> Self {
        self.content_type = Some(content_type);
        self
    }

    /// The body as received: the body limit and [`Request::body_len`] count it, and the
    /// fingerprint hashes it byte for byte unless [`canonical_json`](Self::canonical_json) or
    /// [`canonical_form`](Self::canonical_form) gives what to hash instead.
    pub fn body(mut self, body: &'a [u8]) -> Self {
        self.body = body;
        self
    }

    /// The JSON body made canonical (idem-tower's `canonical::canonical_json`, volatile fields
    /// removed), which the fingerprint hashes instead of the body's bytes
    /// ([`FingerprintBuilder::canonical_json`](crate::FingerprintBuilder::canonical_json)): a
    /// retry that re-encodes its JSON is the same request. Give the body as received to
    /// [`body`](Self::body) as well: its size is what the limit checks.
    pub fn canonical_json(mut self, canonical: &'a [u8]) -> Self {
        self.canonical = Some((canonical, Domain::Json));
        self
    }

    /// The form body made canonical (idem-tower's `canonical::canonical_form`), as
    /// [`canonical_json`](Self::canonical_json) does for JSON: a retry that reorders its
    /// fields is the same request.
    pub fn canonical_form(mut self, canonical: &'a [u8]) -> Self {
        self.canonical = Some((canonical, Domain::Form));
        self
    }

    /// The body limit checked while building (default: [`Policy::DEFAULT_MAX_BODY_BYTES`]); the
    /// engine checks its own policy's limit again in [`Idempotency::begin`](crate::Idempotency::begin).
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
        if self.path.is_none() && is_template(self.route) {
            return Err(Error::invalid(
                Field::Route,
                "a route template needs the concrete path: call .path()",
            ));
        }
        // One record whatever the method's spelling (C3): `post` and `POST` are one request.
        let method = self.method.to_ascii_uppercase();
        let scope = Scope::new(self.consumer, &format!("{method} {}", self.route))?;
        let mut fingerprint = Fingerprint::builder()
            .method(&method)
            .path(self.path.unwrap_or(self.route));
        if let Some(content_type) = self.content_type {
            fingerprint = fingerprint.media_type(content_type);
        }
        for (name, value) in &self.headers {
            fingerprint = fingerprint.header(name, value);
        }
        fingerprint = match self.canonical {
            Some((canonical, domain)) => fingerprint.in_domain(canonical, domain),
            None => fingerprint.body(self.body),
        };
        Ok(Request(Arc::new(Parts {
            id: RecordId::new(scope, key),
            fingerprint: fingerprint.finish(),
            body_len: self.body.len(),
            one_commit: None,
            store_budget: None,
            alternative: None,
        })))
    }
}
