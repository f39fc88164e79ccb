//! axum integration (feature `axum`): the reservation as an extractor, the markers as responses,
//! and what idem answers as axum responses ([`Http`]).

use crate::marker::{Completed, Happened, NothingHappened, OutcomeUnknown};
use crate::render::Problem;
use crate::reservation::Reservation;
use axum_core::extract::{FromRequestParts, OptionalFromRequestParts};
use axum_core::response::{IntoResponse, IntoResponseParts, Response, ResponseParts};
use http::request::Parts;
use idem_core::{Error, Store, StoredResponse};
use std::convert::Infallible;

/// Extracts the reservation of the request being executed. Outside the layer (the route is not
/// under it, or the layer is built over another store type) it is refused with a 500: a
/// handler that completes in its own transaction must never run unprotected. The refusal is
/// marked [`NothingHappened`], so under the layer the key is given back, not burnt. Use
/// `Option<Reservation<S>>` on routes where a key is optional.
impl<S, State> FromRequestParts<State> for Reservation<S>
where
    S: Store + 'static,
    State: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &State) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Reservation<S>>()
            .cloned()
            .ok_or_else(|| {
                tracing::error!(
                    target: "idem_tower",
                    "Reservation extracted outside IdempotencyLayer (or over another store type)"
                );
                let problem = Problem::new(
                    500,
                    "idempotency-layer-missing",
                    "The server is not configured to run this request idempotently.",
                    false,
                );
                // The handler never runs: the key goes back instead of storing this 500.
                let mut response = Http(problem).into_response();
                response.extensions_mut().insert(NothingHappened);
                response
            })
    }
}

impl<S, State> OptionalFromRequestParts<State> for Reservation<S>
where
    S: Store + 'static,
    State: Send + Sync,
{
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _: &State,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<Reservation<S>>().cloned())
    }
}

impl IntoResponseParts for NothingHappened {
    type Error = Infallible;

    fn into_response_parts(self, mut res: ResponseParts) -> Result<ResponseParts, Self::Error> {
        res.extensions_mut().insert(self);
        Ok(res)
    }
}

impl IntoResponseParts for Happened {
    type Error = Infallible;

    fn into_response_parts(self, mut res: ResponseParts) -> Result<ResponseParts, Self::Error> {
        res.extensions_mut().insert(self);
        Ok(res)
    }
}

impl IntoResponseParts for OutcomeUnknown {
    type Error = Infallible;

    fn into_response_parts(self, mut res: ResponseParts) -> Result<ResponseParts, Self::Error> {
        res.extensions_mut().insert(self);
        Ok(res)
    }
}

impl IntoResponse for Completed {
    fn into_response(self) -> Response {
        self.into_http()
    }
}

/// What idem answers, as an axum response (as axum's `Json(T)` or `Html(T)` are): a
/// [`StoredResponse`] sent byte for byte, a [`Problem`] as `application/problem+json`, an
/// [`Error`] as its problem with its status. A handler returns `Http(stored)`, or answers idem's
/// errors with `.map_err(Http)?`.
///
/// ```
/// use axum_core::response::IntoResponse;
/// use idem_core::{IdempotencyKey, StoredResponse};
/// use idem_tower::{render::Problem, Http};
/// let stored = StoredResponse::new(201, r#"{"id":"ch_1"}"#)
///     .with_header("content-type", "application/json")
///     .with_header("idempotent-replayed", "true");
/// let response = Http(stored).into_response();
/// assert_eq!(response.status(), 201);
/// assert_eq!(response.headers()["idempotent-replayed"], "true");
///
/// let problem = Problem::new(400, "event-invalid", "The payload is not an event.", false);
/// let response = Http(problem).into_response();
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
///
/// let error = IdempotencyKey::new("").expect_err("an empty key");
/// assert_eq!(Http(error).into_response().status(), 400);
/// ```
#[derive(Debug, Clone, Copy, Default)]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub struct Http<T>(pub T);

/// The response byte for byte ([`render::into_http`](crate::render::into_http)): its status,
/// its headers in their order, its body; a status outside 100..=599 is sent as a 500, a header
/// `http` refuses is left out and logged.
impl IntoResponse for Http<StoredResponse> {
    fn into_response(self) -> Response {
        crate::render::into_http(self.0, axum_core::body::Body::from)
    }
}

/// The problem as RFC 9457 `application/problem+json` ([`Problem::to_response`]).
impl IntoResponse for Http<Problem> {
    fn into_response(self) -> Response {
        Http(self.0.to_response()).into_response()
    }
}

/// [`render::error`](crate::render::error): the error's problem with its status (400 for a bad
/// key, 413, 503 with `Retry-After` for a store that is down...).
impl IntoResponse for Http<Error> {
    fn into_response(self) -> Response {
        Http(crate::render::error(&self.0)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    #[test]
    fn c07_a_stored_response_is_sent_byte_for_byte() {
        let stored = StoredResponse::new(402, b"\x00declined\xff".to_vec())
            .with_header("content-type", "application/octet-stream")
            .with_header("x-tag", "a")
            .with_header("x-tag", "b");
        let response = Http(stored).into_response();
        assert_eq!(response.status(), StatusCode::PAYMENT_REQUIRED);
        let tags: Vec<_> = response.headers().get_all("x-tag").iter().collect();
        assert_eq!(tags, ["a", "b"]);
        let body = read_body(response);
        assert_eq!(body, b"\x00declined\xff");
    }

    #[test]
    fn c07_an_unsendable_status_or_header_never_panics() {
        let response = Http(
            StoredResponse::new(700, "x")
                .with_header("bad name", "v")
                .with_header("x-ok", "kept"),
        )
        .into_response();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(response.headers().len(), 1);
    }

    fn read_body(response: Response) -> Vec<u8> {
        use http_body::Body as _;
        let mut body = response.into_body();
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut out = Vec::new();
        while let std::task::Poll::Ready(Some(frame)) =
            std::pin::Pin::new(&mut body).poll_frame(&mut cx)
        {
            if let Ok(data) = frame.expect("an in-memory body").into_data() {
                out.extend_from_slice(&data);
            }
        }
        out
    }
}
