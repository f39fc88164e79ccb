//! axum integration (feature `axum`): what idem answers, as axum responses.
//!
//! Every answer idem renders is a [`StoredResponse`] (a replay or a problem); these impls send it as it is, so a handler returns it without converting it by
//! hand: `stored.into_response()`, `error.into_response()`.

use crate::error::Error;
use crate::problem::Problem;
use crate::response::StoredResponse;
use axum_core::body::Body;
use axum_core::response::{IntoResponse, Response};

/// The response byte for byte: its status, its headers in their order (a name given twice is
/// sent twice), its body. A status outside 100..=599 is sent as a 500, and a header `http`
/// refuses (a name that is not a token, a value with CR or LF; [`StoredResponse::validate`]
/// says which) is left out and logged: a stored record was checked before it was stored, so
/// only a response built by hand can carry one.
///
/// ```
/// use axum_core::response::IntoResponse;
/// use idem_core::StoredResponse;
/// let stored = StoredResponse::new(201, r#"{"id":"ch_1"}"#)
///     .with_header("content-type", "application/json")
///     .with_header("idempotent-replayed", "true");
/// let response = stored.into_response();
/// assert_eq!(response.status(), 201);
/// assert_eq!(response.headers()["idempotent-replayed"], "true");
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl IntoResponse for StoredResponse {
    fn into_response(self) -> Response {
        self.into_http(Body::from)
    }
}

/// The problem as RFC 9457 `application/problem+json` ([`Problem::to_response`]).
///
/// ```
/// use axum_core::response::IntoResponse;
/// use idem_core::render::Problem;
/// let response = Problem::new(400, "event-invalid", "The payload is not an event.", false).into_response();
/// assert_eq!(response.status(), 400);
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        self.to_response().into_response()
    }
}

/// [`render::error`](super::error): the error's problem with its status (400 for a bad key, 413, 503 with
/// `Retry-After` for a store that is down...), so a handler can answer idem's errors with `?`.
///
/// ```
/// use axum_core::response::IntoResponse;
/// use idem_core::IdempotencyKey;
/// let error = IdempotencyKey::new("").expect_err("an empty key");
/// assert_eq!(error.into_response().status(), 400);
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl IntoResponse for Error {
    fn into_response(self) -> Response {
        crate::render::error(&self).into_response()
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
        let response = stored.into_response();
        assert_eq!(response.status(), StatusCode::PAYMENT_REQUIRED);
        let tags: Vec<_> = response.headers().get_all("x-tag").iter().collect();
        assert_eq!(tags, ["a", "b"]);
        let body = read_body(response);
        assert_eq!(body, b"\x00declined\xff");
    }

    #[test]
    fn c07_an_unsendable_status_or_header_never_panics() {
        let response = StoredResponse::new(700, "x")
            .with_header("bad name", "v")
            .with_header("x-ok", "kept")
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
