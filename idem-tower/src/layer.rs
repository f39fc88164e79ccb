//! `IdempotencyLayer`: the tower layer and its settings.

use crate::canonical::JsonForm;
use crate::config::{Config, ServerErrors};
use crate::consumer::ConsumerError;
use crate::render::Problem;
use http::header::HeaderName;
use http::request::Parts;
use http::Method;
use idem_core::{Idempotency, StoredResponse};
use std::fmt;
use std::sync::Arc;

/// A tower [`Layer`](tower_layer::Layer) that makes the endpoints under it idempotent (docs/http.md).
///
/// For each `POST` or `PATCH` (configurable) it reads the `Idempotency-Key` header, scopes the
/// key to the consumer that `consumer` finds in the request (an authenticated account, never
/// the key itself) and to the route, fingerprints the method, the concrete path and query and
/// the body (buffered up to the policy's limit), and then:
///
/// - the first request runs the inner service in an execution that **outlives the request's
///   future**, so that a client that disconnects (hyper drops the request's future) cannot
///   cancel an execution that started; its response is stored and sent (a refusal status of
///   the engine's `Policy::refusals` is sent and its key released), with the key echoed in
///   `Idempotency-Key`;
/// - a retry of a completed request gets the stored response, byte for byte, with
///   `Idempotent-Replayed: true`; a retry while it runs a 409 with `Retry-After` at once; the
///   key reused with another request a 422;
/// - a bad or missing key is a 400, a body over the limit a 413 and the store down a 503,
///   with nothing recorded and nothing run: errors are RFC 9457 problems (or the application's
///   own shape, [`render_problems`](Self::render_problems)) with `Cache-Control: no-store`.
///
/// Other methods pass through untouched; `PUT` and `DELETE` are protected when they carry a key.
///
/// ```
/// use axum::{routing::post, Router};
/// use idem_core::{Idempotency, MemoryStore};
/// use idem_tower::{ConsumerError, IdempotencyLayer};
///
/// let idem = Idempotency::new(MemoryStore::new());
/// let app: Router = Router::new()
///     .route("/v1/charges", post(|| async { (axum::http::StatusCode::CREATED, "charged") }))
///     .route_layer(IdempotencyLayer::new(idem, |req: &http::request::Parts| {
///         req.headers.get("x-account").and_then(|v| v.to_str().ok()).map(str::to_owned)
///             .ok_or_else(ConsumerError::unauthenticated)
///     }));
/// ```
pub struct IdempotencyLayer<S, C> {
    pub(crate) idem: Idempotency<S>,
    pub(crate) consumer: Arc<C>,
    pub(crate) config: Config,
}

impl<S, C> IdempotencyLayer<S, C>
where
    C: Fn(&Parts) -> Result<String, ConsumerError> + Send + Sync + 'static,
{
    /// A layer over the engine `idem`, scoping keys to the consumer `consumer` returns for a
    /// request (from an authentication layer's extension, a verified header...).
    pub fn new(idem: Idempotency<S>, consumer: C) -> Self {
        Self {
            idem,
            consumer: Arc::new(consumer),
            config: Config::default(),
        }
    }
}

impl<S, C> IdempotencyLayer<S, C> {
    /// The methods that require a key (default `POST` and `PATCH`): one without is a 400.
    pub fn require_key_for(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config.required = methods.into_iter().collect();
        self
    }

    /// The methods protected only when they carry a key (default `PUT` and `DELETE`).
    pub fn accept_key_for(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config.optional = methods.into_iter().collect();
        self
    }

    /// The header that carries the key (default `Idempotency-Key`).
    pub fn key_header(mut self, name: HeaderName) -> Self {
        self.config.key_header = name;
        self
    }

    /// Adds a request header to the fingerprint (C3), for headers that change what a request
    /// means (an API version, say). Volatile headers (`User-Agent`, tracing, telemetry) are
    /// never fingerprinted unless named here.
    pub fn fingerprint_header(mut self, name: HeaderName) -> Self {
        self.config.fingerprint_headers.push(name);
        self
    }

    /// Leaves the parts named in `exclude` out of a JSON body's canonical form (JSON
    /// Pointers, see [`canonical_json`](crate::canonical::canonical_json): a client timestamp,
    /// say). JSON bodies (`application/json`, `+json`, any parameters) are fingerprinted in
    /// canonical form by default, so that a retry that re-encodes its JSON (another key order,
    /// other whitespace) is the same request. A body that does not canonicalise (not JSON,
    /// duplicate keys, nested too deep) is fingerprinted as it is. It undoes
    /// [`raw_json`](Self::raw_json), not [`raw_json_records`](Self::raw_json_records).
    pub fn canonical_json(mut self, exclude: &[&str]) -> Self {
        if self.config.json == JsonForm::Raw {
            self.config.json = JsonForm::Canonical;
        }
        self.config.json_exclude = exclude.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Fingerprints JSON bodies byte for byte on this route: another key order or other
    /// whitespace is another request (422 under one key). For routes where the bytes
    /// themselves are the request (a signed document, say).
    ///
    /// ```
    /// # use idem_core::{Idempotency, MemoryStore};
    /// # use idem_tower::{ConsumerError, IdempotencyLayer};
    /// # let idem = Idempotency::new(MemoryStore::new());
    /// let layer = IdempotencyLayer::new(idem, |_: &http::request::Parts| Ok::<_, ConsumerError>("acct".into()))
    ///     .raw_json();
    /// ```
    pub fn raw_json(mut self) -> Self {
        self.config.json = JsonForm::Raw;
        self
    }

    /// For the first step of an upgrade from byte-for-byte JSON fingerprints (CHANGELOG.md):
    /// records are written under a JSON body's raw fingerprint, which processes of the previous
    /// release match, and records under its canonical fingerprint (written by processes of this
    /// release with the default) are this request's too. Once every process runs with it,
    /// remove it.
    ///
    /// ```
    /// # use idem_core::{Idempotency, MemoryStore};
    /// # use idem_tower::{ConsumerError, IdempotencyLayer};
    /// # let idem = Idempotency::new(MemoryStore::new());
    /// // The upgrade's first deploy; the second removes the line.
    /// let layer = IdempotencyLayer::new(idem, |_: &http::request::Parts| Ok::<_, ConsumerError>("acct".into()))
    ///     .canonical_json(&["/client_sent_at"])
    ///     .raw_json_records();
    /// ```
    pub fn raw_json_records(mut self) -> Self {
        self.config.json = JsonForm::RawFirst;
        self
    }

    /// Whether form bodies (`application/x-www-form-urlencoded`) are fingerprinted in canonical
    /// form (default: yes), so that a retry that sends its fields in another order or
    /// percent-encodes them otherwise is the same request (see
    /// [`canonical_form`](crate::canonical::canonical_form)). A form that does not canonicalise
    /// (a broken `%` escape) is fingerprinted as it is.
    /// Whatever this says, the body's media type is part of the fingerprint (C3): the same
    /// bytes sent as JSON and as a form are two requests.
    pub fn canonical_form(mut self, canonical: bool) -> Self {
        self.config.canonical_form = canonical;
        self
    }

    /// The largest response stored (default 4 MiB). A larger one has run its effect, so it
    /// becomes a stored 500 (C8), never a silent second run.
    pub fn max_response_bytes(mut self, limit: usize) -> Self {
        self.config.max_response_bytes = limit;
        self
    }

    /// What an unmarked 5xx means (default: stored, [`ServerErrors::Store`]).
    pub fn server_errors(mut self, rule: ServerErrors) -> Self {
        self.config.server_errors = rule;
        self
    }

    /// Renders the layer's problems (400, 401, 409, 413, 422, 503...) in the application's own
    /// shape; whatever it returns, `Cache-Control: no-store` and `Retry-After` are added and the
    /// problem's status is kept.
    ///
    /// ```
    /// # use idem_tower::render::Problem;
    /// # use idem_core::{Idempotency, MemoryStore, StoredResponse};
    /// # use idem_tower::{ConsumerError, IdempotencyLayer};
    /// # let idem = Idempotency::new(MemoryStore::new());
    /// let layer = IdempotencyLayer::new(idem, |_: &http::request::Parts| Ok::<_, ConsumerError>("acct".into()))
    ///     .render_problems(|p: &Problem| {
    ///         StoredResponse::new(p.status, format!(r#"{{"error":{{"code":"{}"}}}}"#, p.kind))
    ///             .with_header("content-type", "application/json")
    ///     });
    /// ```
    pub fn render_problems(
        mut self,
        render: impl Fn(&Problem) -> StoredResponse + Send + Sync + 'static,
    ) -> Self {
        self.config.render = Arc::new(render);
        self
    }

    /// The longest `Retry-After` sent to a duplicate while the first request runs, with its 409
    /// or, on an asynchronous endpoint, its 202 (default 1 s): the time left on the running
    /// lease, capped at this. The lease is the worst case (a first attempt that crashed); a
    /// client told to wait the whole lease would wait a minute for an answer that is usually
    /// ready in milliseconds, and a duplicate costs one read.
    pub fn max_retry_after(mut self, max: std::time::Duration) -> Self {
        self.config.max_retry_after = max;
        self
    }

    /// For asynchronous endpoints: a duplicate that arrives while the first request runs gets
    /// a 202 Accepted ([`render::accepted`](crate::render::accepted)) instead of the 409, with
    /// `Retry-After` and the `Location` of the status resource that `location` returns for the
    /// request and its key (none when it returns `None`, or a value that is not a header's).
    ///
    /// ```
    /// # use idem_core::{Idempotency, MemoryStore};
    /// # use idem_tower::{ConsumerError, IdempotencyLayer};
    /// # let idem = Idempotency::new(MemoryStore::new());
    /// let layer = IdempotencyLayer::new(idem, |_: &http::request::Parts| Ok::<_, ConsumerError>("acct".into()))
    ///     .accept_in_flight(|_, key| Some(format!("/v1/operations/{key}")));
    /// ```
    pub fn accept_in_flight(
        mut self,
        location: impl Fn(&Parts, &str) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.config.accept_in_flight = Some(Arc::new(location));
        self
    }
}

impl<S, C> Clone for IdempotencyLayer<S, C> {
    fn clone(&self) -> Self {
        Self {
            idem: self.idem.clone(),
            consumer: Arc::clone(&self.consumer),
            config: self.config.clone(),
        }
    }
}

impl<S: fmt::Debug, C> fmt::Debug for IdempotencyLayer<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("idem", &self.idem)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
