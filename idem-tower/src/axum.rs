//! axum integration (feature `axum`): the reservation as an extractor, the markers as responses.

use crate::marker::{Completed, Happened, NothingHappened, OutcomeUnknown};
use crate::reservation::Reservation;
use axum_core::extract::{FromRequestParts, OptionalFromRequestParts};
use axum_core::response::{IntoResponse, IntoResponseParts, Response, ResponseParts};
use http::request::Parts;
use idem_core::render::Problem;
use idem_core::Store;
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
                let mut response = problem.into_response();
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
