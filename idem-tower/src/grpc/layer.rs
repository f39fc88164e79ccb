//! [`GrpcIdempotencyLayer`]: the tower layer for tonic servers and its settings.

use super::config::{GrpcConfig, GrpcMethod};
use super::service::{GrpcIdempotent, Shared};
use crate::consumer::ConsumerError;
use http::header::HeaderName;
use http::request::Parts;
use idem_core::Idempotency;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tonic::Code;
use tower_layer::Layer;

/// A tower [`Layer`] for tonic servers (`tonic::transport::Server::builder().layer(...)`) that
/// makes the unary methods it lists idempotent (docs/grpc.md).
///
/// For a listed method it reads the key (the `idempotency-key` metadata entry, or a field of
/// the request message: [`GrpcMethod::key_from_message`]), scopes it to the consumer that
/// `consumer` finds in the request and to the method's path, fingerprints the path and the
/// encoded request message (C3), and then, through the engine (C16):
///
/// - the first call runs the service in an execution that **outlives the call** (a client
///   whose deadline passes or whose connection drops cannot cancel it); its answer (the
///   response body as sent and its trailers) is stored and sent, unless its code is a refusal
///   ([`refusals`](Self::refusals)): then it is sent and the key released;
/// - a retry of a completed call gets the stored answer, byte for byte, with
///   `idempotent-replayed: true`; a retry while it runs `ABORTED` with a `RetryInfo`; the key
///   reused with another message `FAILED_PRECONDITION`;
/// - a bad or missing key, two different keys (field and metadata), a message that does not
///   decode ([`GrpcMethod::message`]) or a content type other than `application/grpc` /
///   `application/grpc+proto` is `INVALID_ARGUMENT`, a message over the policy's limit
///   `RESOURCE_EXHAUSTED`, a compressed one `UNIMPLEMENTED`, the store down `UNAVAILABLE`, with
///   nothing recorded and nothing run;
/// - an answer with a second message (a streaming method listed as unary), or one that does
///   not end within [`answer_timeout`](Self::answer_timeout), has run: a stored `INTERNAL`.
///
/// The handler is not offered response compression (`grpc-accept-encoding` is removed from
/// the call it sees): a stored answer is replayed to whichever client retries.
///
/// Methods not listed (streaming ones among them) pass through untouched.
///
/// ```
/// use idem_core::{Idempotency, MemoryStore};
/// use idem_tower::{ConsumerError, GrpcIdempotencyLayer, GrpcMethod};
///
/// let idem = Idempotency::new(MemoryStore::new());
/// let layer = GrpcIdempotencyLayer::new(idem, |req: &http::request::Parts| {
///     req.headers.get("x-account").and_then(|v| v.to_str().ok()).map(str::to_owned)
///         .ok_or_else(ConsumerError::unauthenticated)
/// })
/// .method(GrpcMethod::unary("/payments.v1.Charges/CreateCharge"));
/// // tonic::transport::Server::builder().layer(layer).add_service(...)
/// # let _ = layer;
/// ```
pub struct GrpcIdempotencyLayer<S, C> {
    pub(crate) idem: Idempotency<S>,
    pub(crate) consumer: Arc<C>,
    pub(crate) config: GrpcConfig,
}

impl<S, C> GrpcIdempotencyLayer<S, C>
where
    C: Fn(&Parts) -> Result<String, ConsumerError> + Send + Sync + 'static,
{
    /// A layer over the engine `idem`, scoping keys to the consumer `consumer` returns for a
    /// call (from an authentication layer's extension, verified metadata...). It protects no
    /// method until [`method`](Self::method) names one.
    pub fn new(idem: Idempotency<S>, consumer: C) -> Self {
        Self {
            idem,
            consumer: Arc::new(consumer),
            config: GrpcConfig::default(),
        }
    }
}

impl<S, C> GrpcIdempotencyLayer<S, C> {
    /// Protects a unary method.
    pub fn method(mut self, method: GrpcMethod) -> Self {
        self.config.methods.retain(|m| m.path != method.path);
        self.config.methods.push(method);
        self
    }

    /// The metadata entry that carries the key (default `idempotency-key`).
    pub fn key_metadata(mut self, name: HeaderName) -> Self {
        self.config.key_metadata = name;
        self
    }

    /// The codes by which a handler refuses a call before executing it: sent, not stored, the
    /// key released (default [`DEFAULT_GRPC_REFUSALS`](crate::DEFAULT_GRPC_REFUSALS)).
    pub fn refusals(mut self, codes: impl IntoIterator<Item = Code>) -> Self {
        self.config.refusals = codes.into_iter().collect();
        self
    }

    /// The largest response stored (default 4 MiB). A larger one has run its effect, so it
    /// becomes a stored `INTERNAL` (C8), never a second run.
    pub fn max_response_bytes(mut self, limit: usize) -> Self {
        self.config.max_response_bytes = limit;
        self
    }

    /// How long a handler's answer may take to end once its head is sent (default: the
    /// policy's lease). A unary answer's message and trailers follow its head at once; one
    /// that does not end in time (a streaming method listed as unary whose stream waits, a
    /// body that never ends) has run its handler, so the execution ends there as an outcome
    /// unknown: a stored `INTERNAL` (C8), as the HTTP layer stores a 500 for a body that fails.
    pub fn answer_timeout(mut self, timeout: Duration) -> Self {
        self.config.answer_timeout = Some(timeout);
        self
    }

    /// The longest retry delay sent to a duplicate while the first call runs (default 1 s):
    /// the time left on the lease, capped at this.
    pub fn max_retry_after(mut self, max: Duration) -> Self {
        self.config.max_retry_after = max;
        self
    }
}

impl<S, C> Clone for GrpcIdempotencyLayer<S, C> {
    fn clone(&self) -> Self {
        Self {
            idem: self.idem.clone(),
            consumer: Arc::clone(&self.consumer),
            config: self.config.clone(),
        }
    }
}

impl<S: fmt::Debug, C> fmt::Debug for GrpcIdempotencyLayer<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcIdempotencyLayer")
            .field("idem", &self.idem)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<Inner, S, C> Layer<Inner> for GrpcIdempotencyLayer<S, C> {
    type Service = GrpcIdempotent<Inner, S, C>;

    fn layer(&self, inner: Inner) -> Self::Service {
        GrpcIdempotent::new(
            inner,
            Shared {
                idem: self.idem.clone(),
                consumer: Arc::clone(&self.consumer),
                config: self.config.clone(),
            },
        )
    }
}
