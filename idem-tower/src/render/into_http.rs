//! `http` responses of stored answers: what the HTTP layer sends and what [`Http`](crate::Http)
//! sends, written once.

use http::header::{HeaderName, HeaderValue};
use http::{Response, StatusCode};
use idem_core::StoredResponse;

/// The response byte for byte as an [`http::Response`], its body made by `body`: its status,
/// its headers in their order (a name given twice is sent twice), its body. A status outside
/// 100..=599 is sent as a 500, and a header `http` refuses (a name that is not a token, a value
/// with CR or LF; [`StoredResponse::validate`] says which) is left out and logged: a stored
/// record was checked before it was stored, so only a response built by hand can carry one.
///
/// ```
/// use idem_core::StoredResponse;
/// use idem_tower::render::into_http;
/// let stored = StoredResponse::new(201, "charged").with_header("content-type", "text/plain");
/// let response: http::Response<Vec<u8>> = into_http(stored, |body| body);
/// assert_eq!(response.status(), 201);
/// assert_eq!(response.headers()["content-type"], "text/plain");
/// assert_eq!(response.body(), b"charged");
/// ```
pub fn into_http<B>(stored: StoredResponse, body: impl FnOnce(Vec<u8>) -> B) -> Response<B> {
    let status = match StatusCode::from_u16(stored.status) {
        Ok(status) if (100..=599).contains(&stored.status) => status,
        _ => {
            tracing::error!(target: "idem", status = stored.status, "a response with an invalid status sent as a 500");
            StatusCode::INTERNAL_SERVER_ERROR
        }
    };
    let mut response = Response::new(body(stored.body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    for (name, value) in stored.headers {
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(&value),
        ) {
            (Ok(name), Ok(value)) => {
                headers.append(name, value);
            }
            _ => {
                tracing::error!(target: "idem", header = %name, "a header left out of a response")
            }
        }
    }
    response
}
