//! The answers the engine stores in place of a handler's (C8): RFC 9457 problems, as the bytes
//! idem-tower's `render::Problem` makes of them (its tests pin them). The engine renders
//! nothing else.

use crate::response::StoredResponse;

/// The stored 500 of an unknown outcome (C8): the effect may have run.
pub(crate) fn outcome_unknown() -> StoredResponse {
    stored_500(
        r#"{"type":"https://idem.rs/problems/outcome-unknown","title":"outcome-unknown","status":500,"detail":"The request failed and may have taken effect; do not send it again with another key.","retryable":false}"#,
    )
}

/// The stored 500 in place of a response that cannot be stored.
pub(crate) fn invalid_response() -> StoredResponse {
    stored_500(
        r#"{"type":"https://idem.rs/problems/invalid-response","title":"invalid-response","status":500,"detail":"The server produced a response that could not be stored.","retryable":false}"#,
    )
}

fn stored_500(body: &'static str) -> StoredResponse {
    StoredResponse::new(500, body)
        .with_header("content-type", "application/problem+json")
        .with_header("cache-control", "no-store")
}
