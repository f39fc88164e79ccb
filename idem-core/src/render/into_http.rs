//! `http` responses of stored answers (feature `http`, on with `axum`): what the HTTP layer
//! sends and what axum's `IntoResponse` sends, written once.

use crate::response::StoredResponse;
use http::header::{HeaderName, HeaderValue};
use http::{Response, StatusCode};

impl StoredResponse {
    /// The response byte for byte as an [`http::Response`], its body made by `body`: its
    /// status, its headers in their order (a name given twice is sent twice), its body. A status
    /// outside 100..=599 is sent as a 500, and a header `http` refuses (a name that is not a
    /// token, a value with CR or LF; [`StoredResponse::validate`] says which) is left out and
    /// logged: a stored record was checked before it was stored, so only a response built by
    /// hand can carry one.
    ///
    /// ```
    /// use idem_core::StoredResponse;
    /// let stored = StoredResponse::new(201, "charged").with_header("content-type", "text/plain");
    /// let response: http::Response<Vec<u8>> = stored.into_http(|body| body);
    /// assert_eq!(response.status(), 201);
    /// assert_eq!(response.headers()["content-type"], "text/plain");
    /// assert_eq!(response.body(), b"charged");
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "http")))]
    pub fn into_http<B>(self, body: impl FnOnce(Vec<u8>) -> B) -> Response<B> {
        let status = match StatusCode::from_u16(self.status) {
            Ok(status) if (100..=599).contains(&self.status) => status,
            _ => {
                tracing::error!(target: "idem", status = self.status, "a response with an invalid status sent as a 500");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        let mut response = Response::new(body(self.body));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        for (name, value) in self.headers {
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
}
