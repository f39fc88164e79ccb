//! Which methods the gRPC layer protects, and where each finds its key.

use http::header::HeaderName;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tonic::Code;

/// Reads the key from the encoded request message (its protobuf bytes), for APIs that carry it
/// in a field (AIP-155's `request_id`).
pub(crate) type KeyFromMessage = dyn Fn(&[u8]) -> Option<String> + Send + Sync;

/// Checks the encoded request message before anything is recorded.
pub(crate) type Validate = dyn Fn(&[u8]) -> Result<(), tonic::Status> + Send + Sync;

/// A unary gRPC method the layer protects, by its path (`/package.Service/Method`), and where
/// its key comes from.
///
/// By default the key is the `idempotency-key` metadata entry (the layer's
/// [`key_metadata`](crate::GrpcIdempotencyLayer::key_metadata)), and it is required: a call
/// without one is `INVALID_ARGUMENT`, answered before the body is read. With
/// [`key_from_message`](Self::key_from_message) a field of the request message gives it (the
/// metadata entry when the field is empty; both given and different: `INVALID_ARGUMENT`).
/// [`message`](Self::message) declares the request message type, so that a message that does
/// not decode is refused before anything is recorded (C8).
///
/// ```
/// use idem_tower::GrpcMethod;
/// use prost::Message;
///
/// #[derive(Clone, PartialEq, Message)]
/// struct CreateChargeRequest {
///     #[prost(int64, tag = "1")]
///     amount: i64,
///     #[prost(string, tag = "2")]
///     request_id: String,
/// }
///
/// let method = GrpcMethod::unary("/payments.v1.Charges/CreateCharge").key_from_message(|bytes| {
///     let request = CreateChargeRequest::decode(bytes).ok()?;
///     (!request.request_id.is_empty()).then_some(request.request_id)
/// });
/// ```
#[derive(Clone)]
pub struct GrpcMethod {
    pub(crate) path: String,
    pub(crate) key_from_message: Option<Arc<KeyFromMessage>>,
    pub(crate) required: bool,
    pub(crate) validate: Option<Arc<Validate>>,
}

impl GrpcMethod {
    /// The unary method at `path` (`/package.Service/Method`), its key required.
    pub fn unary(path: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            key_from_message: None,
            required: true,
            validate: None,
        }
    }

    /// The method's request message type: a message that does not decode as `M` is refused
    /// with `INVALID_ARGUMENT` before anything is recorded or run, so the corrected retry with
    /// the same key runs (C8). Without it the layer cannot tell a malformed message, and tonic's
    /// own decoding error (`INTERNAL`, answered before the handler runs) is stored for the key.
    ///
    /// ```
    /// use idem_tower::GrpcMethod;
    ///
    /// #[derive(Clone, PartialEq, prost::Message)]
    /// struct CreateChargeRequest {
    ///     #[prost(int64, tag = "1")]
    ///     amount: i64,
    /// }
    ///
    /// let method = GrpcMethod::unary("/payments.v1.Charges/CreateCharge").message::<CreateChargeRequest>();
    /// # let _ = method;
    /// ```
    pub fn message<M: prost::Message + Default>(self) -> Self {
        self.validate(|bytes| {
            M::decode(bytes).map(drop).map_err(|error| {
                tonic::Status::invalid_argument(format!(
                    "the request message does not decode: {error}"
                ))
            })
        })
    }

    /// Checks the encoded request message (its protobuf bytes, without the 5-byte prefix)
    /// before anything is recorded: an `Err(status)` is sent as it is (give it a refusal code
    /// such as `INVALID_ARGUMENT`), nothing recorded, the handler not called. It replaces a
    /// check set before ([`message`](Self::message) is one).
    ///
    /// ```
    /// use idem_tower::GrpcMethod;
    /// let method = GrpcMethod::unary("/payments.v1.Charges/CreateCharge").validate(|bytes| {
    ///     if bytes.is_empty() {
    ///         return Err(tonic::Status::invalid_argument("an empty charge"));
    ///     }
    ///     Ok(())
    /// });
    /// # let _ = method;
    /// ```
    pub fn validate(
        mut self,
        check: impl Fn(&[u8]) -> Result<(), tonic::Status> + Send + Sync + 'static,
    ) -> Self {
        self.validate = Some(Arc::new(check));
        self
    }

    /// The key is read from the request message by `key` (which decodes the message's bytes,
    /// with prost say, and returns its `request_id`), falling back to the metadata entry when
    /// it returns `None`. The value must be a valid key (C1): 1..=255 visible ASCII bytes. A call
    /// that sends both, with different values, is `INVALID_ARGUMENT`, nothing recorded.
    pub fn key_from_message(
        mut self,
        key: impl Fn(&[u8]) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.key_from_message = Some(Arc::new(key));
        self
    }

    /// A call without a key runs unprotected instead of being refused (AIP-155 makes
    /// `request_id` optional). With the key from metadata only, a call without the entry
    /// passes through untouched; with [`key_from_message`](Self::key_from_message) the layer
    /// still finds the consumer and reads the message (within the policy's `max_body_bytes`)
    /// to look for the field, then runs it unprotected when there is no key.
    pub fn optional(mut self) -> Self {
        self.required = false;
        self
    }
}

impl fmt::Debug for GrpcMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcMethod")
            .field("path", &self.path)
            .field("key_from_message", &self.key_from_message.is_some())
            .field("required", &self.required)
            .field("validate", &self.validate.is_some())
            .finish()
    }
}

/// The gRPC layer's settings.
#[derive(Debug, Clone)]
pub(crate) struct GrpcConfig {
    pub(crate) key_metadata: HeaderName,
    pub(crate) methods: Vec<GrpcMethod>,
    pub(crate) refusals: Vec<Code>,
    pub(crate) max_response_bytes: usize,
    pub(crate) max_retry_after: Duration,
    /// How long the answer's body may take after its head; `None`: the policy's lease.
    pub(crate) answer_timeout: Option<Duration>,
}

impl Default for GrpcConfig {
    fn default() -> Self {
        Self {
            key_metadata: HeaderName::from_static("idempotency-key"),
            methods: Vec::new(),
            refusals: super::status::DEFAULT_GRPC_REFUSALS.to_vec(),
            max_response_bytes: crate::DEFAULT_MAX_RESPONSE_BYTES,
            max_retry_after: crate::DEFAULT_MAX_RETRY_AFTER,
            answer_timeout: None,
        }
    }
}

impl GrpcConfig {
    /// The protected method at `path`, if it is one.
    pub(crate) fn method(&self, path: &str) -> Option<&GrpcMethod> {
        self.methods.iter().find(|m| m.path == path)
    }
}
