//! Errors in Stripe's shape: `{"error": {"type": .., "code": .., "message": .., "param": ..}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use idem::tower::NothingHappened;
use idem::{Problem, StoredResponse};
use serde::Serialize;

/// An API error, as Stripe's clients expect it.
#[derive(Debug, Clone, Serialize)]
pub struct ApiError {
    #[serde(skip)]
    pub status: StatusCode,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub code: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub param: Option<&'static str>,
}

#[derive(Serialize)]
struct Envelope<'a> {
    error: &'a ApiError,
}

impl ApiError {
    /// A 400 `invalid_request_error`.
    pub fn invalid(code: &str, param: Option<&'static str>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code: code.to_owned(),
            message: message.into(),
            param,
        }
    }

    /// A 404 `resource_missing`.
    pub fn missing(what: &str, id: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            code: "resource_missing".to_owned(),
            param: Some("id"),
            ..Self::invalid("", None, format!("No such {what}: '{id}'"))
        }
    }

    /// A 401 `authentication_error`: the `Authorization` header is malformed.
    pub fn unauthenticated() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            kind: "authentication_error",
            code: "api_key_invalid".to_owned(),
            message: "Invalid API key: send it as a Bearer token or as the Basic user name."
                .to_owned(),
            param: None,
        }
    }

    /// A 503 `api_error` with `Retry-After`: the database is unreachable or busy; retry.
    pub fn unavailable() -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "api_error",
            code: "database_unavailable".to_owned(),
            message: "The database is unavailable; retry later with the same idempotency key."
                .to_owned(),
            param: None,
        }
    }

    /// A 500 `api_error`: the server failed (nothing is said of the cause).
    pub fn internal() -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "api_error",
            code: "internal_error".to_owned(),
            message: "The server could not complete the request.".to_owned(),
            param: None,
        }
    }

    fn body(&self) -> String {
        serde_json::to_string(&Envelope { error: self }).unwrap_or_default()
    }

    /// The error as a response that releases the idempotency key: nothing happened (a request
    /// refused before its effect, or a transaction that rolled back), so a corrected retry
    /// may run with the same key, as Stripe does for requests that fail validation.
    pub fn nothing_happened(self) -> Response {
        (NothingHappened, self).into_response()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(Envelope { error: &self })).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        response
    }
}

/// The idempotency layer's problems in Stripe's shape. A 409 for a request in flight stays
/// retryable: no header tells clients not to retry it.
pub fn render_problem(problem: &Problem) -> StoredResponse {
    let (kind, code) = match problem.kind {
        "idempotency-key-missing" => ("invalid_request_error", "idempotency_key_missing"),
        "idempotency-key-invalid" => ("invalid_request_error", "idempotency_key_invalid"),
        "invalid-request" => ("invalid_request_error", "parameter_invalid"),
        "body-too-large" => ("invalid_request_error", "body_too_large"),
        "idempotency-key-reused" => ("idempotency_error", "idempotency_key_reused"),
        "request-in-progress" => ("idempotency_error", "idempotency_key_in_use"),
        "consumer-unknown" => ("authentication_error", "api_key_invalid"),
        "store-unavailable" => ("api_error", "store_unavailable"),
        other => ("api_error", other),
    };
    let error = ApiError {
        status: StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        kind,
        code: code.replace('-', "_"),
        message: problem.detail.clone(),
        param: None,
    };
    StoredResponse::new(problem.status, error.body())
        .with_header("content-type", "application/json")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_key_is_a_stripe_idempotency_error() {
        let problem = Problem::new(
            422,
            "idempotency-key-reused",
            "used with another request",
            false,
        );
        let http = render_problem(&problem);
        let body: serde_json::Value = serde_json::from_slice(&http.body).expect("json");
        assert_eq!(http.status, 422);
        assert_eq!(body["error"]["type"], "idempotency_error");
        assert_eq!(body["error"]["code"], "idempotency_key_reused");
    }
}
