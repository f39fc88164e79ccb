//! Errors in Stripe's shape: `{"error": {"type": .., "code": .., "message": .., "param": ..}}`.
//! Every 401 names the schemes the server accepts in `WWW-Authenticate`; a 405 and the 502 of a
//! card network that did not answer are also RFC 9457 problems (`application/problem+json`,
//! with the `error` object beside `type`, `title`, `status` and `detail`); a 503 carries
//! `Retry-After`.

use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use idem::tower::render::Problem;
use idem::tower::{NothingHappened, OutcomeUnknown};
use idem::StoredResponse;
use serde::Serialize;
use serving::Refusal;

/// The challenges of a 401: the API key as a Bearer token, or as the Basic user name.
pub(crate) const CHALLENGES: [&str; 2] = [
    "Bearer realm=\"payments\"",
    "Basic realm=\"payments\", charset=\"UTF-8\"",
];

/// An API error, as Stripe's clients expect it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ApiError {
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
    pub(crate) fn invalid(
        code: &str,
        param: Option<&'static str>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code: code.to_owned(),
            message: message.into(),
            param,
        }
    }

    /// A 404 `resource_missing`.
    pub(crate) fn missing(what: &str, id: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            code: "resource_missing".to_owned(),
            param: Some("id"),
            ..Self::invalid("", None, format!("No such {what}: '{id}'"))
        }
    }

    /// A 401 `authentication_error`: the `Authorization` header is malformed.
    pub(crate) fn unauthenticated() -> Self {
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
    pub(crate) fn unavailable() -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "api_error",
            code: "database_unavailable".to_owned(),
            message: "The database is unavailable; retry later with the same idempotency key."
                .to_owned(),
            param: None,
        }
    }

    /// A 405 `invalid_request_error`: the path exists, not with this method (the router adds
    /// `Allow`).
    pub(crate) fn method_not_allowed() -> Self {
        Self {
            status: StatusCode::METHOD_NOT_ALLOWED,
            code: "method_not_allowed".to_owned(),
            ..Self::invalid(
                "",
                None,
                "This method is not allowed on this path; the Allow header lists those that are.",
            )
        }
    }

    /// The answer to a request whose body was refused before routing (too large, too slow,
    /// no room to buffer it, broken).
    pub(crate) fn refused_body(refusal: Refusal) -> Self {
        let status = StatusCode::from_u16(refusal.status()).unwrap_or(StatusCode::BAD_REQUEST);
        match refusal {
            Refusal::TooLarge { limit } => Self {
                status,
                ..Self::invalid(
                    "body_too_large",
                    None,
                    format!("The body is over the limit of {limit} bytes."),
                )
            },
            Refusal::TimedOut { after } => Self {
                status,
                ..Self::invalid(
                    "request_timeout",
                    None,
                    format!(
                        "The body did not arrive within {} ms; retry with the same idempotency key.",
                        after.as_millis()
                    ),
                )
            },
            Refusal::Busy => Self {
                code: "server_busy".to_owned(),
                message: "The server is busy receiving other requests; retry later with the same idempotency key."
                    .to_owned(),
                ..Self::unavailable()
            },
            Refusal::Broken => Self::invalid(
                "body_incomplete",
                None,
                "The body could not be read to its end.",
            ),
        }
    }

    /// A 502 `api_error`: the card network did not answer the authorization in time, so the
    /// card may have been charged. Stored in doubt ([`outcome_unknown`](Self::outcome_unknown))
    /// and replayed to every retry with the key until the reconciler settles it.
    pub(crate) fn network_no_answer() -> Self {
        Self {
            status: StatusCode::BAD_GATEWAY,
            kind: "api_error",
            code: "card_network_timeout".to_owned(),
            message: "The card network did not answer; the charge may have gone through. Do not \
                      retry with another key: retries with this idempotency key get this answer \
                      until the charge is reconciled, then the charge if it was made."
                .to_owned(),
            param: None,
        }
    }

    /// A 409 `idempotency_error`: the card network already authorised another charge under
    /// this request's key (its key was released after a failure and reused with other
    /// parameters); nothing was charged.
    pub(crate) fn network_key_reused() -> Self {
        Self {
            status: StatusCode::CONFLICT,
            kind: "idempotency_error",
            code: "network_key_reused".to_owned(),
            message: "The card network already authorised another charge under this idempotency \
                      key; retry with the original parameters, or use another key."
                .to_owned(),
            param: None,
        }
    }

    /// A 500 `api_error`: the server failed (nothing is said of the cause).
    pub(crate) fn internal() -> Self {
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
    pub(crate) fn nothing_happened(self) -> Response {
        (NothingHappened, self).into_response()
    }

    /// The error as a response whose outcome is unknown: the layer stores it marked in doubt
    /// with `note` (what the reconciler asks the card network by) and replays it to every
    /// retry; the effect never runs again blind (C8).
    pub(crate) fn outcome_unknown(self, note: String) -> Response {
        (OutcomeUnknown::noting(note), self).into_response()
    }

    /// The problem kind of an error that is also an RFC 9457 problem.
    fn problem_kind(&self) -> Option<&'static str> {
        match self.status {
            StatusCode::METHOD_NOT_ALLOWED => Some("method-not-allowed"),
            StatusCode::BAD_GATEWAY => Some("outcome-unknown"),
            _ => None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = if let Some(kind) = self.problem_kind() {
            // A problem (RFC 9457) that is also a Stripe error: `type`, `title`, `status`,
            // `detail`, and the `error` object Stripe's clients read.
            let problem = Problem::new(self.status.as_u16(), kind, &self.message, false);
            let body = serde_json::json!({
                "type": problem.type_uri(),
                "title": problem.kind,
                "status": problem.status,
                "detail": problem.detail,
                "error": &self,
            });
            let mut response = (self.status, Json(body)).into_response();
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/problem+json"),
            );
            response
        } else {
            (self.status, Json(Envelope { error: &self })).into_response()
        };
        let headers = response.headers_mut();
        // An error is about this attempt: no cache keeps it (as the layer's problems).
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            for challenge in CHALLENGES {
                headers.append(WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
            }
        }
        response
    }
}

/// A refused body in Stripe's shape (the [`serving::BodyGate`]'s renderer).
pub(crate) fn render_refusal(refusal: Refusal) -> Response {
    ApiError::refused_body(refusal).into_response()
}

/// The idempotency layer's problems in Stripe's shape. A 409 for a request in flight stays
/// retryable: no header tells clients not to retry it.
pub(crate) fn render_problem(problem: &Problem) -> StoredResponse {
    let (kind, code) = match problem.kind {
        "idempotency-key-missing" => ("invalid_request_error", "idempotency_key_missing"),
        "idempotency-key-invalid" => ("invalid_request_error", "idempotency_key_invalid"),
        "invalid-request" => ("invalid_request_error", "parameter_invalid"),
        "body-too-large" => ("invalid_request_error", "body_too_large"),
        "path-too-long" => ("invalid_request_error", "path_too_long"),
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
    let response = StoredResponse::new(problem.status, error.body())
        .with_header("content-type", "application/json");
    if problem.status == 401 {
        CHALLENGES
            .iter()
            .fold(response, |r, c| r.with_header("www-authenticate", *c))
    } else {
        response
    }
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

    #[test]
    fn every_401_carries_the_challenges() {
        let problem = Problem::new(401, "consumer-unknown", "no owner", false);
        let http = render_problem(&problem);
        let challenges: Vec<&[u8]> = http
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("www-authenticate"))
            .map(|(_, v)| v.as_slice())
            .collect();
        assert_eq!(challenges.len(), 2, "{:?}", http.headers);
        let response = ApiError::unauthenticated().into_response();
        assert_eq!(
            response.headers().get_all(WWW_AUTHENTICATE).iter().count(),
            2
        );
    }
}
