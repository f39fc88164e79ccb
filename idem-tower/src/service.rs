//! `Idempotent`: the service the layer wraps around an application's.

use crate::bounds::{IncomingBody, OutgoingBody, ProtectedService};
use crate::canonical::JsonForm;
use crate::config::{Config, Protection, ServerErrors};
use crate::consumer::ConsumerError;
use crate::convert::{
    read_request_body, read_response, to_http, BoxError, RequestBody, ResponseReadError,
};
use crate::disposition::Handled;
use crate::layer::IdempotencyLayer;
use crate::limits::{check_consumer, check_path, RouteFrom};
use crate::marker::{Completed, Happened, NothingHappened, OutcomeUnknown};
use crate::render::problem;
use crate::render::Problem;
use crate::reservation::Reservation;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, LOCATION};
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use idem_core::{
    Answer, Context, Error, EventKind, Failure, Field, Idempotency, Outcome, Reply, RunError,
    Store, StoredResponse,
};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};
use tower_layer::Layer;
use tower_service::Service;
use tracing::Instrument;

/// The future of [`Idempotent`]'s responses.
pub type ResponseFuture<RB, E> = Pin<Box<dyn Future<Output = Result<Response<RB>, E>> + Send>>;

/// The layer wraps an application's service in an [`Idempotent`].
impl<Inner, S, C> Layer<Inner> for IdempotencyLayer<S, C> {
    type Service = Idempotent<Inner, S, C>;

    fn layer(&self, inner: Inner) -> Self::Service {
        Idempotent::new(inner, self.clone())
    }
}

/// The service [`IdempotencyLayer`] wraps around an application's (see the layer's docs).
pub struct Idempotent<Inner, S, C> {
    inner: Inner,
    layer: Arc<IdempotencyLayer<S, C>>,
}

impl<Inner, S, C> Idempotent<Inner, S, C> {
    pub(crate) fn new(inner: Inner, layer: IdempotencyLayer<S, C>) -> Self {
        Self {
            inner,
            layer: Arc::new(layer),
        }
    }
}

impl<Inner: Clone, S, C> Clone for Idempotent<Inner, S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: Arc::clone(&self.layer),
        }
    }
}

impl<Inner: fmt::Debug, S: fmt::Debug, C> fmt::Debug for Idempotent<Inner, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotent")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl<Inner, S, C, B, RB> Service<Request<B>> for Idempotent<Inner, S, C>
where
    // The response type names `RB` for the impl; the rest of what the layer needs of the
    // service is `ProtectedService`, written once.
    Inner: Service<Request<RequestBody>, Response = Response<RB>> + ProtectedService<RB> + Clone,
    B: IncomingBody,
    RB: OutgoingBody,
    S: Store + 'static,
    C: Fn(&Parts) -> Result<String, ConsumerError> + Send + Sync + 'static,
{
    type Response = Response<RB>;
    type Error = Inner::Error;
    type Future = ResponseFuture<RB, Inner::Error>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let config = &self.layer.config;
        let has_key = request.headers().contains_key(&config.key_header);
        if config.protection(request.method(), has_key) == Protection::PassThrough {
            return Box::pin(
                self.inner
                    .call(request.map(|body| body.map_err(Into::into).boxed_unsync())),
            );
        }
        // The instance that was polled ready goes with the request; a fresh clone stays.
        let fresh = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, fresh);
        let layer = Arc::clone(&self.layer);
        // One span per protected request, inside the caller's (its trace id, its request id):
        // the engine's events nest in it, and the outcome is recorded on it when known.
        let span = tracing::info_span!(
            target: "idem_tower",
            "idem.http",
            method = %request.method(),
            route = tracing::field::Empty,
            consumer = tracing::field::Empty,
            outcome = tracing::field::Empty,
            status = tracing::field::Empty,
        );
        Box::pin(async move { Ok(protect(layer, ready, request).await) }.instrument(span))
    }
}

/// What the execution gives back when nothing is to be stored, or it failed.
#[derive(Debug)]
enum Unstored {
    /// The handler marked its response [`NothingHappened`]: send it, the key is released.
    Released(StoredResponse),
    /// The inner service or the response's body failed after the handler started.
    Failed(String),
}

/// A protected request, from its head to the response sent.
async fn protect<Inner, S, C, B, RB>(
    layer: Arc<IdempotencyLayer<S, C>>,
    inner: Inner,
    request: Request<B>,
) -> Response<RB>
where
    Inner: ProtectedService<RB>,
    B: IncomingBody,
    RB: OutgoingBody,
    S: Store + 'static,
    C: Fn(&Parts) -> Result<String, ConsumerError> + Send + Sync + 'static,
{
    let started = Instant::now();
    let config = &layer.config;
    let (parts, body) = request.into_parts();
    let (route, from) = route_of(&parts);
    tracing::Span::current().record("route", route.as_str());
    if let Err(problem) = check_path(&parts.method, &route, from) {
        tracing::warn!(target: "idem_tower", len = route.len(), "idempotency: path too long");
        let response = config.render(&problem);
        return finish(response, None, EventKind::Rejected, None, &route, started);
    }
    let consumer = match (layer.consumer)(&parts).and_then(|c| check_consumer(&c).map(|()| c)) {
        Ok(consumer) => {
            tracing::Span::current().record("consumer", consumer.as_str());
            consumer
        }
        Err(error) => {
            tracing::warn!(target: "idem_tower", route, %error, "idempotency: no consumer");
            let response = config.render(error.problem());
            return finish(response, None, EventKind::Rejected, None, &route, started);
        }
    };
    let prepared = prepare(&layer.idem, config, &parts, body, &consumer, &route).await;
    let (request, key) = match prepared {
        Ok(prepared) => prepared,
        Err(error) => {
            let problem = match error {
                // The application's route template (a client's path and consumer were checked
                // above), not the client's request: a server fault, never a 400 the client is
                // told not to retry.
                Error::InvalidInput {
                    field: field @ (Field::Consumer | Field::Route),
                    reason,
                } => {
                    let error = ConsumerError::misconfigured(format!("invalid {field}: {reason}"));
                    tracing::error!(target: "idem_tower", route, %error, "idempotency: bad scope");
                    error.problem().clone()
                }
                error => crate::render::problem_for(&error),
            };
            let response = config.render(&problem);
            return finish(
                response,
                None,
                EventKind::Rejected,
                Some(consumer),
                &route,
                started,
            );
        }
    };
    let accepted = config
        .accept_in_flight
        .as_ref()
        .map(|location| location(&parts, &key.text));
    let body = key.body;
    let rules = Rules {
        max_response: config.max_response_bytes,
        server_errors: config.server_errors,
    };
    let result = layer
        .idem
        .run(&request, move |ctx| execute(inner, parts, body, ctx, rules))
        .await;
    let (response, echo, disposition) = respond(config, result, accepted);
    let echo = echo.then_some((&config.key_header, &key.header));
    finish(response, echo, disposition, Some(consumer), &route, started)
}

/// The key as received (echoed back) and as text, with the buffered body.
struct Keyed {
    header: HeaderValue,
    text: String,
    body: Bytes,
}

/// Everything checked before anything is recorded: the key (400), the body (413), the request
/// as idem sees it (scope and fingerprint).
async fn prepare<S: Store, B>(
    idem: &Idempotency<S>,
    config: &Config,
    parts: &Parts,
    body: B,
    consumer: &str,
    route: &str,
) -> Result<(idem_core::Request, Keyed), Error>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let key = crate::key::from_headers(&parts.headers, &config.key_header)?;
    // A missing key on a required method: the builder says so (400). The media type counts
    // (C3).
    let (content_type, body) = if key.is_some() {
        let content_type = content_type(&parts.headers)?;
        let body = read_request_body(&parts.headers, body, idem.policy().max_body_bytes).await?;
        (content_type, body)
    } else {
        (None, Bytes::new())
    };
    let uri = original_uri(parts);
    let path = uri
        .path_and_query()
        .map_or_else(|| uri.path(), |pq| pq.as_str());
    let mut builder = idem
        .request(consumer, parts.method.as_str(), route)
        .path(path)
        .key(key.as_deref());
    if let Some(content_type) = content_type {
        builder = builder.content_type(content_type);
    }
    for name in &config.fingerprint_headers {
        for value in parts.headers.get_all(name) {
            builder = builder.header(name.as_str(), value.as_bytes());
        }
    }
    let exclude: Vec<&str> = config.json_exclude.iter().map(String::as_str).collect();
    let json = (config.json != JsonForm::Raw).then_some(exclude.as_slice());
    let media = content_type.map(idem_core::media_type).unwrap_or_default();
    // A body that does not canonicalise is fingerprinted as it is.
    let canonical = crate::canonical::by_media_type(&media, &body, json, config.canonical_form);
    let request = crate::canonical::request(builder.body(&body), canonical.as_ref(), config.json)?;
    let header = parts
        .headers
        .get(&config.key_header)
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static(""));
    let text = key.unwrap_or_default();
    Ok((request, Keyed { header, text, body }))
}

/// The request's `Content-Type` as a handler reads it (`HeaderValue::to_str`). One sent twice,
/// or with a byte beyond visible ASCII, is refused (400, C12), nothing recorded: the layer and
/// the handler could read two types there (a handler's parser chosen by a default), and so one
/// key's body under one fingerprint as two different requests.
fn content_type(headers: &http::HeaderMap) -> Result<Option<&str>, Error> {
    let mut values = headers.get_all(CONTENT_TYPE).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Error::invalid(
            Field::Header,
            "Content-Type sent more than once",
        ));
    }
    let unreadable = |_| Error::invalid(Field::Header, "a Content-Type beyond visible ASCII");
    value.to_str().map(Some).map_err(unreadable)
}

/// What the execution needs of the settings.
struct Rules {
    max_response: usize,
    server_errors: ServerErrors,
}

/// The execution, which outlives the request's future: the inner service, its response
/// buffered and classified. Nothing here depends on the client still being connected.
async fn execute<Inner, S, RB>(
    mut inner: Inner,
    parts: Parts,
    body: Bytes,
    ctx: Context<S>,
    rules: Rules,
) -> Result<Reply, Failure<Unstored>>
where
    Inner: Service<Request<RequestBody>, Response = Response<RB>>,
    Inner::Future: Send + 'static,
    Inner::Error: fmt::Display,
    RB: Body,
    RB::Error: Into<BoxError>,
    S: Store + 'static,
{
    let body = Full::new(body)
        .map_err(|never| match never {})
        .boxed_unsync();
    let mut request = Request::from_parts(parts, body);
    request.extensions_mut().insert(Reservation::new(ctx));
    // Boxed so that the task's future names no projection through `RequestBody`'s error type
    // (rustc cannot then prove it `Send` for every lifetime).
    let call: ResponseFuture<RB, Inner::Error> = Box::pin(inner.call(request));
    let response = match call.await {
        Ok(response) => response,
        Err(error) => return Err(Failure::unknown(Unstored::Failed(error.to_string()))),
    };
    let (head, body) = response.into_parts();
    if let Some(Completed(completion)) = head.extensions.get::<Completed>() {
        return Ok(Reply::Completed(completion.clone()));
    }
    let max_response = rules.max_response;
    let stored = match read_response(&head, body, max_response).await {
        Ok(stored) => stored,
        Err(ResponseReadError::TooLarge) => {
            tracing::error!(
                target: "idem_tower",
                max_response,
                "idempotency: the response is over max_response_bytes; storing a 500"
            );
            return Ok(Reply::Respond(problem(
                500,
                "response-too-large",
                "The server produced a response too large to store.",
                false,
            )));
        }
        Err(ResponseReadError::Failed(error)) => {
            let error = format!("the response body failed: {error}");
            return Err(Failure::unknown(Unstored::Failed(error)));
        }
    };
    if let Some(OutcomeUnknown { note }) = head.extensions.get::<OutcomeUnknown>() {
        let error = Unstored::Failed("the handler said its outcome is unknown".to_owned());
        return Err(Failure::unknown_with(error, stored).noting(note.clone()));
    }
    if head.extensions.get::<NothingHappened>().is_some()
        || (rules.server_errors == ServerErrors::Release && head.status.is_server_error())
    {
        return Err(Failure::nothing_happened(Unstored::Released(stored)));
    }
    // Unmarked, the engine's policy decides by the status: a refusal (400, 422...) is sent and
    // released, anything else stored (C8).
    if head.extensions.get::<Happened>().is_some() {
        return Ok(Reply::Executed(stored));
    }
    Ok(Reply::Respond(stored))
}

/// The response for the engine's result, whether it carries the key's echo, and what was done.
/// `accepted` is `Some` on an asynchronous endpoint, with the `Location` of its 202, if any.
fn respond(
    config: &Config,
    result: Result<Outcome, RunError<Unstored>>,
    accepted: Option<Option<String>>,
) -> (StoredResponse, bool, EventKind) {
    let disposition = match &result {
        Ok(outcome) => outcome.kind(),
        Err(error) => error.kind(),
    };
    let (response, echo) = match result {
        Ok(Outcome::Executed(stored)) => (stored, true),
        Ok(Outcome::Refused(response)) => (response, false),
        Ok(Outcome::Answered(answer @ Answer::Replay(_))) => (crate::render::answer(&answer), true),
        Ok(Outcome::Answered(Answer::InFlight { retry_after })) => {
            // The time left on the lease, capped: a 409 and a 202 alike.
            let retry_after = retry_after.min(config.max_retry_after);
            let response = match accepted {
                Some(location) => {
                    let accepted = crate::render::accepted(retry_after);
                    match location {
                        Some(location) => accepted.with_header(LOCATION.as_str(), location),
                        None => accepted,
                    }
                }
                None => {
                    let busy: Answer = Answer::InFlight { retry_after };
                    match crate::render::answer_problem(&busy) {
                        Some(problem) => config.render(&problem),
                        None => crate::render::answer(&busy),
                    }
                }
            };
            (response, false)
        }
        Ok(Outcome::Answered(answer)) => {
            let response = match crate::render::answer_problem(&answer) {
                Some(problem) => config.render(&problem),
                None => crate::render::answer(&answer),
            };
            (response, false)
        }
        Err(RunError::Idem(error)) => (config.render(&crate::render::problem_for(&error)), false),
        Err(RunError::Released(Unstored::Released(response))) => (response, false),
        Err(RunError::Unknown { error, response }) => {
            tracing::error!(target: "idem_tower", error = %describe(&error), "idempotency: outcome unknown, stored");
            (response, true)
        }
        Err(RunError::Incomplete(error)) => {
            tracing::error!(target: "idem_tower", %error, "idempotency: the completion is not stored yet");
            (config.render(&pending()), false)
        }
        Err(RunError::InDoubt(error)) => {
            tracing::error!(target: "idem_tower", %error, "idempotency: the commit's outcome is in doubt");
            (config.render(&pending()), false)
        }
        Err(other) => {
            tracing::error!(target: "idem_tower", error = ?other, "idempotency: execution failed");
            (config.render(&unknown()), false)
        }
    };
    (response, echo, disposition)
}

fn describe(error: &Unstored) -> &str {
    match error {
        Unstored::Released(_) => "released",
        Unstored::Failed(error) => error,
    }
}

/// The problem for an execution whose answer is not stored yet (the store could not be written
/// within the lease, or a commit's outcome is in doubt): the key is kept and resolves by itself
/// (the completion lands, or the lease passes with nothing committed), so a retry with the same
/// key is answered in flight, then the stored answer, or runs once. Only where the completion
/// is atomic with the effect: on Redis a process cut off past the lease leaves the key to
/// another process's takeover, which runs the effect again (C14).
pub(crate) fn pending() -> Problem {
    Problem::new(
        500,
        "outcome-pending",
        "The request may have taken effect and its answer is not recorded yet; retry with the same key.",
        true,
    )
}

/// The problem for an execution whose result could not be recorded: the effect may have run.
pub(crate) fn unknown() -> Problem {
    Problem::outcome_unknown()
}

/// The response sent: the key echoed where it belongs, what was done in the extensions, and
/// one log line.
fn finish<RB: From<Bytes>>(
    response: StoredResponse,
    echo: Option<(&HeaderName, &HeaderValue)>,
    disposition: EventKind,
    consumer: Option<String>,
    route: &str,
    started: Instant,
) -> Response<RB> {
    let mut response = to_http::<RB>(response);
    // Under the header the client sent it in (the layer's `key_header`).
    if let Some((name, key)) = echo {
        if !key.is_empty() {
            response.headers_mut().insert(name.clone(), key.clone());
        }
    }
    let span = tracing::Span::current();
    span.record("outcome", disposition.name());
    span.record("status", response.status().as_u16());
    tracing::debug!(
        target: "idem_tower",
        outcome = disposition.name(),
        consumer = consumer.as_deref().unwrap_or("-"),
        route,
        status = response.status().as_u16(),
        latency_ms = millis(started.elapsed()),
        "idempotency"
    );
    response.extensions_mut().insert(Handled {
        disposition,
        consumer,
    });
    response
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The route the key is scoped to: the matched route template where the router gives one
/// (axum), else the concrete path.
fn route_of(parts: &Parts) -> (String, RouteFrom) {
    #[cfg(feature = "axum")]
    if let Some(matched) = parts.extensions.get::<axum::extract::MatchedPath>() {
        return (matched.as_str().to_owned(), RouteFrom::Template);
    }
    (parts.uri.path().to_owned(), RouteFrom::Path)
}

/// The URI the client sent: under a nested axum router the request's URI lost its prefix
/// (`/customers/cus_A`), which must stay in the fingerprint (C3).
fn original_uri(parts: &Parts) -> &http::Uri {
    #[cfg(feature = "axum")]
    if let Some(original) = parts.extensions.get::<axum::extract::OriginalUri>() {
        return &original.0;
    }
    &parts.uri
}
