//! [`GrpcIdempotent`]: the service the gRPC layer wraps around a tonic server's routes.

use super::answer::GrpcAnswer;
use super::config::{GrpcConfig, GrpcMethod};
use super::details::retry_details;
use super::frame::{single_message, FrameError};
use super::status::grpc_code_of;
use super::timeout::grpc_timeout;
use crate::bounds::IncomingBody;
use crate::consumer::ConsumerError;
use crate::convert::{read_request_body, BoxError, ResponseReadError};
use crate::disposition::Handled;
use crate::limits::check_consumer;
use crate::marker::{Completed, Happened, NothingHappened, OutcomeUnknown};
use crate::render::Problem;
use crate::reservation::Reservation;
use crate::service::ResponseFuture;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::request::Parts;
use http::{HeaderMap, Request, Response};
use http_body::Body;
use http_body_util::Full;
use idem_core::{
    Answer, Context, Error, EventKind, Failure, Field, Idempotency, Outcome, Policy, Reply,
    RunError, Store, StoredResponse,
};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;
use tonic::Code;
use tower_service::Service;
use tracing::Instrument;

/// What every call of the service reads: the engine, the consumer function and the
/// configuration the layer was given.
pub(crate) struct Shared<S, C> {
    pub(crate) idem: Idempotency<S>,
    pub(crate) consumer: Arc<C>,
    pub(crate) config: GrpcConfig,
}

impl<S: fmt::Debug, C> fmt::Debug for Shared<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("idem", &self.idem)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The service [`GrpcIdempotencyLayer`](crate::GrpcIdempotencyLayer) wraps around a tonic server's (see the layer's docs).
pub struct GrpcIdempotent<Inner, S, C> {
    inner: Inner,
    layer: Arc<Shared<S, C>>,
}

impl<Inner, S, C> GrpcIdempotent<Inner, S, C> {
    pub(crate) fn new(inner: Inner, layer: Shared<S, C>) -> Self {
        Self {
            inner,
            layer: Arc::new(layer),
        }
    }
}

impl<Inner: Clone, S, C> Clone for GrpcIdempotent<Inner, S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: Arc::clone(&self.layer),
        }
    }
}

impl<Inner: fmt::Debug, S: fmt::Debug, C> fmt::Debug for GrpcIdempotent<Inner, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcIdempotent")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

type GrpcBody = tonic::body::Body;

impl<Inner, S, C, B, RB> Service<Request<B>> for GrpcIdempotent<Inner, S, C>
where
    Inner: Service<Request<GrpcBody>, Response = Response<RB>> + Clone + Send + 'static,
    Inner::Future: Send + 'static,
    Inner::Error: fmt::Display + Send + 'static,
    B: IncomingBody,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
    S: Store + 'static,
    C: Fn(&Parts) -> Result<String, ConsumerError> + Send + Sync + 'static,
{
    type Response = Response<GrpcBody>;
    type Error = Inner::Error;
    type Future = ResponseFuture<GrpcBody, Inner::Error>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let config = &self.layer.config;
        let method = config.method(request.uri().path()).cloned();
        let keyless = !request.headers().contains_key(&config.key_metadata);
        let method = match method {
            // Not listed (streaming methods among them), or optional and keyless with no field
            // to look in: untouched, the body streamed as it comes.
            None => return pass_through(&mut self.inner, request),
            Some(m) if !m.required && m.key_from_message.is_none() && keyless => {
                return pass_through(&mut self.inner, request)
            }
            Some(method) => method,
        };
        let fresh = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, fresh);
        let layer = Arc::clone(&self.layer);
        let span = tracing::info_span!(
            target: "idem_tower",
            "idem.grpc",
            method = %method.path,
            consumer = tracing::field::Empty,
            outcome = tracing::field::Empty,
            code = tracing::field::Empty,
        );
        Box::pin(async move { protect(layer, ready, method, request).await }.instrument(span))
    }
}

/// The inner service's answer, untouched.
fn pass_through<Inner, B, RB>(
    inner: &mut Inner,
    request: Request<B>,
) -> ResponseFuture<GrpcBody, Inner::Error>
where
    Inner: Service<Request<GrpcBody>, Response = Response<RB>>,
    Inner::Future: Send + 'static,
    B: IncomingBody,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    let call = inner.call(request.map(GrpcBody::new));
    Box::pin(async move { call.await.map(|response| response.map(GrpcBody::new)) })
}

/// What a protected call is answered.
struct Answered {
    answer: GrpcAnswer,
    /// Metadata added to the head: `idempotent-replayed`, the key's echo.
    extra: Vec<(HeaderName, HeaderValue)>,
    disposition: EventKind,
    consumer: Option<String>,
}

impl Answered {
    /// A gRPC status of the layer's own, nothing recorded.
    fn refused(code: Code, message: &str, consumer: Option<String>) -> Self {
        Self {
            answer: GrpcAnswer::error(code, message),
            extra: Vec::new(),
            disposition: EventKind::Rejected,
            consumer,
        }
    }

    fn rejected(problem: &Problem, consumer: Option<String>) -> Self {
        Self {
            answer: problem_answer(problem),
            extra: Vec::new(),
            disposition: EventKind::Rejected,
            consumer,
        }
    }
}

/// A protected call, from its head to the answer sent.
async fn protect<Inner, S, C, B, RB>(
    layer: Arc<Shared<S, C>>,
    inner: Inner,
    method: GrpcMethod,
    request: Request<B>,
) -> Result<Response<GrpcBody>, Inner::Error>
where
    Inner: Service<Request<GrpcBody>, Response = Response<RB>> + Send + 'static,
    Inner::Future: Send + 'static,
    Inner::Error: fmt::Display + Send + 'static,
    B: IncomingBody,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
    S: Store + 'static,
    C: Fn(&Parts) -> Result<String, ConsumerError> + Send + Sync + 'static,
{
    let config = &layer.config;
    let (mut parts, body) = request.into_parts();
    let answered = match prepare(&layer, &method, &parts, body).await {
        Err(answered) => answered,
        Ok(Prepared::Unkeyed(body)) => {
            // An optional method called without a key: run as if the layer were not there.
            let mut inner = inner;
            let request = Request::from_parts(parts, GrpcBody::new(Full::new(body)));
            return inner
                .call(request)
                .await
                .map(|response| response.map(GrpcBody::new));
        }
        Ok(Prepared::Keyed {
            request,
            consumer,
            body,
            echo,
        }) => {
            let rules = Rules {
                max_response: config.max_response_bytes,
                refusals: config.refusals.clone(),
                policy: layer.idem.policy().clone(),
                answer_timeout: config.answer_timeout.unwrap_or(layer.idem.policy().lease),
            };
            // The answer is stored for every client that retries with the key, whatever it
            // accepts: the handler is not told of encodings, so tonic answers uncompressed
            // (identity), which every client reads.
            parts.headers.remove(GRPC_ACCEPT_ENCODING);
            // The caller's deadline lowers the request's store budget (C13), down to a quarter
            // of the engine's: a client cannot cut a healthy store's steps short.
            let budget = layer.idem.policy().store_timeout;
            let request = match grpc_timeout(&parts.headers) {
                Some(deadline) if deadline < budget => {
                    request.with_store_budget(deadline.max(budget / 4))
                }
                _ => request,
            };
            let result = layer
                .idem
                .run(&request, move |ctx| {
                    caught(execute(inner, parts, body, ctx, rules))
                })
                .await;
            respond(config, result, echo, consumer)
        }
    };
    Ok(finish(answered))
}

/// The request metadata that lists the encodings a client accepts for the answer.
const GRPC_ACCEPT_ENCODING: &str = "grpc-accept-encoding";

/// Whether a request's `content-type` is gRPC's protobuf form (`application/grpc`,
/// `application/grpc+proto`, parameters allowed), the only one the layer protects.
fn is_grpc_proto(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let media = value.split(';').next().unwrap_or_default().trim();
    media.eq_ignore_ascii_case("application/grpc")
        || media.eq_ignore_ascii_case("application/grpc+proto")
}

/// A protected call, checked and ready for the engine (or keyless, where that is allowed).
enum Prepared {
    Keyed {
        request: idem_core::Request,
        consumer: String,
        body: Bytes,
        /// The key's metadata entry, echoed back when the key came from it.
        echo: Option<(HeaderName, HeaderValue)>,
    },
    Unkeyed(Bytes),
}

/// Everything checked before anything is recorded: the consumer, the key (C1), the message
/// (C12: one, uncompressed, within the limit), the request as idem sees it (C2, C3).
async fn prepare<S: Store, C, B>(
    layer: &Shared<S, C>,
    method: &GrpcMethod,
    parts: &Parts,
    body: B,
) -> Result<Prepared, Answered>
where
    C: Fn(&Parts) -> Result<String, ConsumerError>,
    B: Body,
    B::Error: Into<BoxError>,
{
    let config = &layer.config;
    let idem = &layer.idem;
    if !is_grpc_proto(&parts.headers) {
        // gRPC-Web, JSON or anything else: the layer would fingerprint bytes it cannot read as
        // a gRPC message; refused before anything is read or recorded (docs/grpc.md).
        return Err(Answered::refused(
            Code::InvalidArgument,
            "An idempotent method takes content-type application/grpc or application/grpc+proto.",
            None,
        ));
    }
    let consumer = (layer.consumer)(parts)
        .and_then(|c| check_consumer(&c).map(|()| c))
        .map_err(|error| {
            tracing::warn!(target: "idem_tower", %error, "idempotency: no consumer");
            Answered::rejected(error.problem(), None)
        })?;
    tracing::Span::current().record("consumer", consumer.as_str());
    let rejected = |error: &Error| Answered::rejected(&problem_of(error), Some(consumer.clone()));
    let from_metadata =
        crate::key::from_headers(&parts.headers, &config.key_metadata).map_err(|e| rejected(&e))?;
    if from_metadata.is_none() && method.key_from_message.is_none() && method.required {
        // No key can come from the message: refused before the body is read, as HTTP does.
        return Err(rejected(&Error::KeyMissing));
    }
    // The message and its 5-byte prefix; the limit reported is the policy's, on the message.
    let max = idem.policy().max_body_bytes;
    let body = read_request_body(&parts.headers, body, max.saturating_add(5))
        .await
        .map_err(|e| match e {
            Error::BodyTooLarge { actual, .. } => rejected(&Error::BodyTooLarge {
                limit: max,
                actual: actual.saturating_sub(5),
            }),
            e => rejected(&e),
        })?;
    let message = match single_message(&body) {
        Ok(message) => message,
        Err(FrameError::NotOneMessage) => {
            let problem = Problem::new(
                400,
                "not-unary",
                "An idempotent method takes exactly one request message.",
                false,
            );
            return Err(Answered::rejected(&problem, Some(consumer)));
        }
        Err(FrameError::Compressed) => {
            let mut answered = Answered::rejected(
                &Problem::new(
                    501,
                    "compressed-message",
                    "An idempotent method takes uncompressed messages (grpc-encoding identity).",
                    false,
                ),
                Some(consumer),
            );
            answered
                .answer
                .metadata
                .push(("grpc-accept-encoding".into(), b"identity".to_vec()));
            return Err(answered);
        }
    };
    if let Some(check) = &method.validate {
        // A message the handler could not decode never reaches it (C8: nothing began).
        check(message).map_err(|status| {
            Answered::refused(status.code(), status.message(), Some(consumer.clone()))
        })?;
    }
    let from_message = method
        .key_from_message
        .as_ref()
        .and_then(|key| key(message));
    if let (Some(field), Some(entry)) = (&from_message, &from_metadata) {
        if field != entry {
            return Err(Answered::refused(
                Code::InvalidArgument,
                "The request carries two different idempotency keys (its field and the metadata entry).",
                Some(consumer),
            ));
        }
    }
    let echo = from_message.is_none() && from_metadata.is_some();
    let key = from_message.or(from_metadata);
    if key.is_none() && !method.required {
        return Ok(Prepared::Unkeyed(body));
    }
    let request = idem
        .request(&consumer, "POST", &method.path)
        .path(&method.path)
        // Every gRPC message under one media type (`application/grpc` and `+proto` alike),
        // never the same as an HTTP body of the same bytes.
        .content_type("application/grpc")
        .body(message)
        .key(key.as_deref())
        .build()
        .map_err(|e| match e {
            Error::InvalidInput {
                field: field @ (Field::Consumer | Field::Route),
                reason,
            } => {
                let error = ConsumerError::misconfigured(format!("invalid {field}: {reason}"));
                tracing::error!(target: "idem_tower", %error, "idempotency: bad scope");
                Answered::rejected(error.problem(), Some(consumer.clone()))
            }
            e => rejected(&e),
        })?;
    let echo = echo
        .then(|| parts.headers.get(&config.key_metadata).cloned())
        .flatten()
        .map(|value| (config.key_metadata.clone(), value));
    Ok(Prepared::Keyed {
        request,
        consumer,
        body,
        echo,
    })
}

/// What the execution needs of the settings.
struct Rules {
    max_response: usize,
    refusals: Vec<Code>,
    policy: Policy,
    answer_timeout: Duration,
}

/// The execution, which outlives the call: the inner service, its answer buffered and
/// classified (C8). Nothing here depends on the client still being there.
async fn execute<Inner, S, RB>(
    mut inner: Inner,
    parts: Parts,
    body: Bytes,
    ctx: Context<S>,
    rules: Rules,
) -> Result<Reply, Failure<String>>
where
    Inner: Service<Request<GrpcBody>, Response = Response<RB>>,
    Inner::Future: Send + 'static,
    Inner::Error: fmt::Display,
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
    S: Store + 'static,
{
    let mut request = Request::from_parts(parts, GrpcBody::new(Full::new(body)));
    request.extensions_mut().insert(Reservation::new(ctx));
    let call: ResponseFuture<RB, Inner::Error> = Box::pin(inner.call(request));
    let response = match call.await {
        Ok(response) => response,
        Err(error) => return Err(unknown(error.to_string())),
    };
    let (head, body) = response.into_parts();
    if let Some(Completed(completion)) = head.extensions.get::<Completed>() {
        return Ok(Reply::Completed(completion.clone()));
    }
    let deadline = tokio::time::sleep(rules.answer_timeout);
    let read = read_answer(
        &head.headers,
        body,
        rules.max_response,
        &rules.policy,
        deadline,
    );
    let answer = match read.await {
        Ok(answer) => answer,
        Err(AnswerError::Late) => {
            tracing::error!(
                target: "idem_tower",
                timeout_ms = rules.answer_timeout.as_millis() as u64,
                "idempotency: the answer did not end within answer_timeout; outcome unknown"
            );
            return Err(unknown(format!(
                "the answer did not end within {:?} of its head",
                rules.answer_timeout
            )));
        }
        Err(AnswerError::NotUnary) => {
            tracing::error!(
                target: "idem_tower",
                "idempotency: the method answered more than one message; storing INTERNAL"
            );
            let answer = GrpcAnswer::error(
                Code::Internal,
                "The method answered more than one message: not a unary answer.",
            );
            return Ok(Reply::Executed(answer.into_stored()));
        }
        Err(AnswerError::Read(ResponseReadError::TooLarge)) => {
            return Ok(too_large(rules.max_response));
        }
        Err(AnswerError::Read(ResponseReadError::Failed(error))) => {
            return Err(unknown(format!("the answer's body failed: {error}")))
        }
    };
    let code = answer.code();
    // A handler's own error status is sent trailers-only (tonic's form for `Err(Status)`). A
    // status in the trailers of an answer whose head was sent as a success came after the
    // handler returned its answer, its effect done (tonic's `OUT_OF_RANGE` for an answer it
    // could not encode): never a refusal.
    let refusal = answer.trailers_only && rules.refusals.contains(&code);
    // The limit is on what is stored (C12): a refusal is sent and stores nothing, so its
    // status's size never turns it into a stored INTERNAL that burns the key (C8).
    let oversized = stored_size(&answer, &rules.policy) > rules.max_response;
    let stored = answer.into_stored();
    let marked = super::mark::meaning(&head.extensions);
    if let Some(OutcomeUnknown { note }) = head.extensions.get::<OutcomeUnknown>() {
        let error = "the method said its outcome is unknown".to_owned();
        if oversized {
            return Err(unknown(error).noting(note.clone()));
        }
        return Err(Failure::unknown_with(error, stored).noting(note.clone()));
    }
    if head.extensions.get::<NothingHappened>().is_some() || marked == Some(false) {
        return Ok(Reply::Refused(stored));
    }
    if head.extensions.get::<Happened>().is_some() || marked == Some(true) || !refusal {
        if oversized {
            return Ok(too_large(rules.max_response));
        }
        return Ok(Reply::Executed(stored));
    }
    Ok(Reply::Refused(stored))
}

/// The stored `INTERNAL` of an answer over `max_response_bytes` (C12): its effect ran, its
/// answer cannot be kept.
fn too_large(max_response: usize) -> Reply {
    tracing::error!(
        target: "idem_tower",
        max_response,
        "idempotency: the answer is over max_response_bytes; storing INTERNAL"
    );
    let answer = GrpcAnswer::error(
        Code::Internal,
        "The server produced an answer too large to store.",
    );
    Reply::Executed(answer.into_stored())
}

/// The size an answer is stored with, as the limit counts it: its messages, the status's
/// message and details, and the metadata kept with them (the trailers are already the kept
/// ones; of the initial metadata, what the policy stores and what travels with the messages).
/// Metadata sent but never stored does not count.
fn stored_size(answer: &GrpcAnswer, policy: &Policy) -> usize {
    let kept = |name: &str| name == "grpc-encoding" || policy.stores_header(name);
    answer
        .metadata
        .iter()
        .filter(|(name, _)| kept(name))
        .chain(&answer.trailers)
        .fold(answer.body.len(), |size, (name, value)| {
            size.saturating_add(name.len()).saturating_add(value.len())
        })
}

/// The execution with its panics caught (C7, C8): a panicking handler may have run its effect,
/// so its key keeps the gRPC outcome unknown (`INTERNAL`), sent to the caller as to every
/// retry. Left to the engine, a panic would store its HTTP 500, which no gRPC replay can send,
/// and reset the caller's stream.
async fn caught(
    execution: impl Future<Output = Result<Reply, Failure<String>>>,
) -> Result<Reply, Failure<String>> {
    // `execute` is an `async fn`: the inner service is called, and may panic, when polled.
    match idem_core::store::CatchUnwind::new(execution).await {
        Ok(result) => result,
        Err(panic) => Err(panicked(&*panic)),
    }
}

/// The outcome unknown of a panic, its message logged.
fn panicked(panic: &(dyn std::any::Any + Send)) -> Failure<String> {
    let message = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic");
    tracing::error!(target: "idem_tower", panic = message, "idempotency: the method panicked; outcome unknown");
    let error = format!("the method panicked: {message}");
    unknown(error.clone()).noting(error)
}

/// An outcome unknown (C8): the key kept, an `INTERNAL` answer stored for it.
fn unknown(error: String) -> Failure<String> {
    let answer = GrpcAnswer::error(Code::Internal, Problem::OUTCOME_UNKNOWN);
    Failure::unknown_with(error, answer.into_stored())
}

/// Why a handler's answer could not be buffered for storing.
enum AnswerError {
    /// Too large, or its body failed.
    Read(ResponseReadError),
    /// A second message began: a streaming method listed as unary.
    NotUnary,
    /// It did not end by its deadline.
    Late,
}

/// The trailing metadata kept in a stored answer whatever the policy's allow-list says: the
/// status itself.
const STATUS_TRAILERS: &[&str] = &["grpc-status", "grpc-message", "grpc-status-details-bin"];

/// Whether a trailer is stored: the status entries always, any other by the policy's
/// allow-list, the rule of the initial metadata (`Policy::stores_header`).
fn stores_trailer(policy: &Policy, name: &str) -> bool {
    STATUS_TRAILERS.contains(&name) || policy.stores_header(name)
}

/// Whether `data`, the start of a response body, holds more than one message: the first
/// message's 5-byte prefix says where it ends, and anything after that is a second one.
fn second_message_began(data: &[u8]) -> bool {
    match data.split_first_chunk::<5>() {
        Some(([_, length @ ..], rest)) => {
            let length = usize::try_from(u32::from_be_bytes(*length)).unwrap_or(usize::MAX);
            rest.len() > length
        }
        None => false,
    }
}

/// A handler's answer, read whole: head metadata, body, trailers. An answer whose head has
/// `grpc-status` is trailers-only: everything but its `content-type` is a trailer. Reading
/// stops at the limit, and as soon as a second message begins (a streaming answer never
/// ends: it is not read on).
async fn read_answer<RB>(
    head: &HeaderMap,
    body: RB,
    limit: usize,
    policy: &Policy,
    deadline: tokio::time::Sleep,
) -> Result<GrpcAnswer, AnswerError>
where
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut deadline = std::pin::pin!(deadline);
    let mut data = Vec::new();
    let mut trailers = HeaderMap::new();
    loop {
        let next = std::future::poll_fn(|cx| match body.as_mut().poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(Some(frame)),
            Poll::Pending => deadline.as_mut().poll(cx).map(|()| None),
        });
        let frame = match next.await {
            Some(Some(frame)) => frame,
            Some(None) => break,
            None => return Err(AnswerError::Late),
        };
        let frame = frame.map_err(|e| AnswerError::Read(ResponseReadError::Failed(e.into())))?;
        match frame.into_data() {
            Ok(chunk) => {
                if data.len().saturating_add(chunk.len()) > limit {
                    return Err(AnswerError::Read(ResponseReadError::TooLarge));
                }
                data.extend_from_slice(&chunk);
                if second_message_began(&data) {
                    return Err(AnswerError::NotUnary);
                }
            }
            Err(frame) => {
                if let Ok(more) = frame.into_trailers() {
                    trailers.extend(more);
                    // The trailers end the answer: a body polled on after them (tonic's, when
                    // it failed to encode the message, holds the unsent bytes) is not read.
                    break;
                }
            }
        }
    }
    let body = data;
    let entries = |map: &HeaderMap| -> Vec<(String, Vec<u8>)> {
        map.iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect()
    };
    let stored_trailers = |list: Vec<(String, Vec<u8>)>| -> Vec<(String, Vec<u8>)> {
        list.into_iter()
            .filter(|(n, _)| stores_trailer(policy, n))
            .collect()
    };
    let trailers_only = head.contains_key("grpc-status") && body.is_empty() && trailers.is_empty();
    let answer = if trailers_only {
        let (metadata, trailers) = entries(head)
            .into_iter()
            .partition(|(n, _)| n == "content-type");
        GrpcAnswer {
            metadata,
            body,
            trailers: stored_trailers(trailers),
            trailers_only: true,
        }
    } else {
        GrpcAnswer {
            metadata: entries(head),
            body,
            trailers: stored_trailers(entries(&trailers)),
            trailers_only: false,
        }
    };
    // The status's message and details and the metadata kept count against the limit too,
    // once the answer is known to be stored (`execute`, C12): a refusal stores nothing.
    Ok(answer)
}

/// The answer for the engine's result (C7, C8, the mapping of docs/grpc.md).
fn respond(
    config: &GrpcConfig,
    result: Result<Outcome, RunError<String>>,
    echo: Option<(HeaderName, HeaderValue)>,
    consumer: String,
) -> Answered {
    let disposition = match &result {
        Ok(outcome) => outcome.kind(),
        Err(error) => error.kind(),
    };
    let replayed = (
        HeaderName::from_static("idempotent-replayed"),
        HeaderValue::from_static("true"),
    );
    let stored = |response: &StoredResponse, extra: Vec<Option<(HeaderName, HeaderValue)>>| {
        match GrpcAnswer::from_stored(response) {
            Ok(answer) => (answer, extra.into_iter().flatten().collect()),
            Err(error) => {
                tracing::error!(target: "idem_tower", %error, "idempotency: undecodable stored answer");
                (
                    problem_answer(&crate::render::problem_for(&error)),
                    Vec::new(),
                )
            }
        }
    };
    let problem = |p: &Problem| (problem_answer(p), Vec::new());
    let (answer, extra) = match result {
        Ok(Outcome::Executed(response)) => stored(&response, vec![echo]),
        Ok(Outcome::Refused(response)) => stored(&response, vec![]),
        Ok(Outcome::Answered(Answer::Replay(response))) => {
            stored(&response, vec![Some(replayed), echo])
        }
        Ok(Outcome::Answered(Answer::InFlight { retry_after })) => problem(
            &Problem::new(
                409,
                "request-in-progress",
                "A call with this idempotency key is still being processed.",
                true,
            )
            .with_retry_after(retry_after.min(config.max_retry_after)),
        ),
        Ok(Outcome::Answered(answer)) => match crate::render::answer_problem(&answer) {
            Some(p) => problem(&p),
            None => problem(&crate::render::problem_for(&Error::CorruptRecord(
                "unexpected answer".into(),
            ))),
        },
        Err(RunError::Idem(error)) => problem(&problem_of(&error)),
        Err(RunError::Unknown { error, response }) => {
            tracing::error!(target: "idem_tower", %error, "idempotency: outcome unknown, stored");
            stored(&response, vec![echo])
        }
        Err(RunError::Incomplete(error) | RunError::InDoubt(error)) => {
            tracing::error!(target: "idem_tower", %error, "idempotency: the answer is not stored yet");
            problem(&crate::service::pending())
        }
        Err(other) => {
            tracing::error!(target: "idem_tower", error = ?other, "idempotency: execution failed");
            problem(&crate::service::unknown())
        }
    };
    Answered {
        answer,
        extra,
        disposition,
        consumer: Some(consumer),
    }
}

/// The problem for one of idem's errors, worded for gRPC where the HTTP one names a header:
/// built from the error itself (its field and reason), never from the HTTP wording.
fn problem_of(error: &Error) -> Problem {
    let mut problem = crate::render::problem_for(error);
    match error {
        Error::KeyMissing => {
            problem.detail = "This method requires an idempotency key (the idempotency-key metadata entry, or the request's own field).".into();
        }
        Error::InvalidInput {
            field: Field::Key,
            reason,
        } => problem.detail = format!("Invalid idempotency key: {reason}."),
        _ => {}
    }
    problem
}

/// A problem as a trailers-only gRPC answer: its code ([`grpc_code_of`]), its detail as
/// `grpc-message`, and when it has a retry delay a `google.rpc.RetryInfo` in
/// `grpc-status-details-bin`, `retry-after` in whole seconds and `grpc-retry-pushback-ms`.
pub(crate) fn problem_answer(problem: &Problem) -> GrpcAnswer {
    let code = grpc_code_of(problem);
    let answer = GrpcAnswer::error(code, &problem.detail);
    match problem.retry_after {
        Some(delay) => answer
            .with_trailer(
                "grpc-status-details-bin",
                retry_details(code as i32, &problem.detail, delay),
            )
            .with_trailer(
                "retry-after",
                crate::render::retry_after_secs(delay).to_string(),
            )
            // gRFC A6: the one delay gRPC's own retry policies (grpc-core, grpc-java,
            // grpc-go) read; they ignore RetryInfo and retry-after.
            .with_trailer("grpc-retry-pushback-ms", delay.as_millis().to_string()),
        None => answer,
    }
}

/// The response sent, with what was done in its extensions and one log line.
fn finish(answered: Answered) -> Response<GrpcBody> {
    let code = answered.answer.code();
    let span = tracing::Span::current();
    span.record("outcome", answered.disposition.name());
    span.record("code", code as i32);
    tracing::debug!(
        target: "idem_tower",
        outcome = answered.disposition.name(),
        consumer = answered.consumer.as_deref().unwrap_or("-"),
        code = code as i32,
        "idempotency"
    );
    let mut response = answered.answer.into_http(&answered.extra);
    response.extensions_mut().insert(Handled {
        disposition: answered.disposition,
        consumer: answered.consumer,
    });
    response
}
