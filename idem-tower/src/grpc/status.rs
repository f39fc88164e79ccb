//! The gRPC status table: the layer's answers as gRPC codes, the handler's codes as refusals or
//! stored answers (C8), and each code's HTTP equivalent.

use crate::render::Problem;
use tonic::Code;

/// The gRPC code of one of the layer's problems (docs/grpc.md, the mapping table):
///
/// | problem | HTTP | gRPC |
/// |---|---|---|
/// | key missing or invalid (C1), invalid request | 400 | `INVALID_ARGUMENT` |
/// | no consumer | 401 | `UNAUTHENTICATED` |
/// | in flight (C5) | 409 | `ABORTED` (+ `RetryInfo`) |
/// | message over the limit (C12) | 413 | `RESOURCE_EXHAUSTED` |
/// | mismatch (C3) | 422 | `FAILED_PRECONDITION` |
/// | outcome pending (the completion is not stored yet) | 500, retryable | `UNAVAILABLE` |
/// | outcome unknown, internal | 500 | `INTERNAL` |
/// | store unavailable (C13) | 503 | `UNAVAILABLE` (+ `RetryInfo`) |
///
/// ```
/// use idem_tower::render::Problem;
/// use idem_tower::grpc_code_of;
/// let reused = Problem::new(422, "idempotency-key-reused", "reused", false);
/// assert_eq!(grpc_code_of(&reused), tonic::Code::FailedPrecondition);
/// ```
pub fn grpc_code_of(problem: &Problem) -> Code {
    match problem.status {
        400 | 414 | 431 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        409 => Code::Aborted,
        413 | 429 => Code::ResourceExhausted,
        422 => Code::FailedPrecondition,
        501 => Code::Unimplemented,
        503 => Code::Unavailable,
        500 if problem.retryable => Code::Unavailable,
        400..=499 => Code::FailedPrecondition,
        _ => Code::Internal,
    }
}

/// The HTTP status that google.rpc.Code documents for each gRPC code (OK 200, INVALID_ARGUMENT
/// 400, NOT_FOUND 404, ABORTED 409, UNAVAILABLE 503...): the status a gRPC answer is stored
/// under, so that the record reads sensibly (`idem inspect`). It decides nothing: which codes
/// are stored is [`DEFAULT_GRPC_REFUSALS`]' business.
///
/// ```
/// assert_eq!(idem_tower::http_status_of(tonic::Code::Unavailable), 503);
/// ```
pub fn http_status_of(code: Code) -> u16 {
    match code {
        Code::Ok => 200,
        Code::Cancelled => 499,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
        Code::DeadlineExceeded => 504,
        Code::NotFound => 404,
        Code::AlreadyExists | Code::Aborted => 409,
        Code::PermissionDenied => 403,
        Code::ResourceExhausted => 429,
        Code::Unimplemented => 501,
        Code::Unavailable => 503,
        Code::Unauthenticated => 401,
        Code::Unknown | Code::Internal | Code::DataLoss => 500,
    }
}

/// The codes by which a handler says it refused the request before executing it (C8), the
/// gRPC mirror of the engine's `Policy::refusals`: an answer with one of them is sent, not
/// stored, and the key released, so the corrected retry with the same key runs.
///
/// They are the codes whose HTTP equivalents are default refusals (`INVALID_ARGUMENT`,
/// `FAILED_PRECONDITION` and `OUT_OF_RANGE` are 400, `UNAUTHENTICATED` 401,
/// `PERMISSION_DENIED` 403, `NOT_FOUND` 404, `RESOURCE_EXHAUSTED` 429), plus `UNIMPLEMENTED`
/// (an unknown method or an unsupported encoding: nothing ran). Every other code is stored and
/// replayed: `OK`, a business answer such as `ALREADY_EXISTS` or `ABORTED`, and
/// `UNKNOWN`, `INTERNAL`, `UNAVAILABLE`, `DEADLINE_EXCEEDED`, `DATA_LOSS`, `CANCELLED`, after
/// which the effect may have run (as the HTTP layer stores a 500). A handler that answers a
/// refusal code after its effect ran marks its response [`Happened`](crate::Happened); one
/// whose effect rolled back marks it [`NothingHappened`](crate::NothingHappened).
pub const DEFAULT_GRPC_REFUSALS: [Code; 8] = [
    Code::InvalidArgument,
    Code::FailedPrecondition,
    Code::OutOfRange,
    Code::Unauthenticated,
    Code::PermissionDenied,
    Code::NotFound,
    Code::ResourceExhausted,
    Code::Unimplemented,
];

/// `grpc-message`: percent-encoded as the gRPC protocol requires (every byte outside
/// printable ASCII, and `%`).
pub(crate) fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for byte in message.bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c08_refusals_are_the_codes_whose_http_equivalents_the_engine_refuses() {
        let policy = idem_core::Policy::default();
        for code in DEFAULT_GRPC_REFUSALS {
            if code != Code::Unimplemented {
                assert!(policy.is_refusal(http_status_of(code)), "{code:?}");
            }
        }
        for code in [
            Code::Ok,
            Code::Unknown,
            Code::Internal,
            Code::Unavailable,
            Code::Aborted,
            Code::AlreadyExists,
            Code::DeadlineExceeded,
            Code::DataLoss,
        ] {
            assert!(!DEFAULT_GRPC_REFUSALS.contains(&code), "{code:?}");
            assert!(!policy.is_refusal(http_status_of(code)), "{code:?}");
        }
    }

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(percent_encode("a b"), "a b");
        assert_eq!(percent_encode("100%"), "100%25");
        assert_eq!(percent_encode("é\n"), "%C3%A9%0A");
    }
}
