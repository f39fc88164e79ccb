//! What is retried: by method (whether a key is needed), by status, by transport error.

use reqwest::{Method, StatusCode};

/// Whether `method` is safe by HTTP's own definition (RFC 9110 §9.2.1: GET, HEAD, OPTIONS,
/// TRACE): read-only, so it is sent and retried without an idempotency key. Every other
/// method gets one: POST, PATCH and extension methods, and PUT and DELETE too. PUT and DELETE
/// are idempotent by HTTP, but a retry of one can still do harm (a PUT retried after a later
/// PUT of the same resource undoes it; a DELETE retried returns 404 instead of its first
/// answer); servers built on `idem` protect them when keyed (idem-tower's optional methods),
/// and a server that does not know the header ignores it.
///
/// ```
/// use idem_client::is_safe_method;
/// use reqwest::Method;
///
/// assert!(is_safe_method(&Method::GET));
/// assert!(!is_safe_method(&Method::PUT));
/// assert!(!is_safe_method(&Method::POST));
/// ```
pub fn is_safe_method(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// Whether an answer with `status` is retried (with the same key): 408 (the server gave up
/// reading the request, as a slow upload), 409 (the same key is still being processed), 429
/// (rate limited), and 500, 502, 503, 504 (the server or a proxy in
/// front of it failed or was unavailable: with the key, a retry gets the stored answer if the
/// first attempt ran).
///
/// Never retried: every other 4xx (400, 401, 403, 404, 422, ...: the same request would get
/// the same answer) and the other 5xx (501 Not Implemented, 505 HTTP Version Not Supported,
/// 507, 508, 511, ...: they describe the server's configuration, which a retry does not
/// change). Answers below 400 are the result. An answer marked `Idempotent-Replayed: true` is
/// never retried, whatever its status: it is the operation's stored answer, and a retry would
/// only get it again.
///
/// ```
/// use idem_client::is_retryable_status;
/// use reqwest::StatusCode;
///
/// assert!(is_retryable_status(StatusCode::CONFLICT));
/// assert!(is_retryable_status(StatusCode::SERVICE_UNAVAILABLE));
/// assert!(!is_retryable_status(StatusCode::UNPROCESSABLE_ENTITY));
/// assert!(!is_retryable_status(StatusCode::NOT_IMPLEMENTED));
/// ```
pub fn is_retryable_status(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 409 | 429 | 500 | 502 | 503 | 504)
}

/// Whether an answer with `status` (400 or above) may come from a request that ran (fully or
/// in part): 409 (one attempt of this key is running right now), any 5xx, and any status past
/// 599 (no standard meaning: a broken or hostile server or proxy, which got the request). Only
/// a 4xx other than 409 says the server refused this attempt.
pub(crate) fn may_have_run(status: StatusCode) -> bool {
    status == StatusCode::CONFLICT || !status.is_client_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_decision_by_status() {
        let retried = [408, 409, 429, 500, 502, 503, 504];
        let not_retried = [
            400, 401, 402, 403, 404, 405, 406, 410, 411, 412, 413, 414, 415, 418, 421, 422, 423,
            424, 425, 426, 428, 431, 451, 499, 501, 505, 506, 507, 508, 510, 511, 599,
        ];
        for code in retried {
            let status = StatusCode::from_u16(code).expect("a status");
            assert!(is_retryable_status(status), "{code} is retried");
        }
        for code in not_retried {
            let status = StatusCode::from_u16(code).expect("a status");
            assert!(!is_retryable_status(status), "{code} is not retried");
        }
        for code in [200, 201, 202, 204, 301, 302, 304] {
            let status = StatusCode::from_u16(code).expect("a status");
            assert!(!is_retryable_status(status), "{code} is a result");
        }
    }

    #[test]
    fn only_409_and_5xx_and_beyond_leave_the_outcome_in_doubt() {
        for code in [409, 500, 501, 502, 503, 504, 599, 600, 999] {
            assert!(
                may_have_run(StatusCode::from_u16(code).expect("status")),
                "{code}"
            );
        }
        for code in [400, 401, 403, 404, 422, 429] {
            assert!(
                !may_have_run(StatusCode::from_u16(code).expect("status")),
                "{code}"
            );
        }
    }

    #[test]
    fn every_method_but_the_safe_ones_needs_a_key() {
        for method in [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE] {
            assert!(is_safe_method(&method), "{method}");
        }
        let custom = Method::from_bytes(b"CHARGE").expect("an extension method");
        for method in [
            Method::POST,
            Method::PATCH,
            Method::PUT,
            Method::DELETE,
            Method::CONNECT,
            custom,
        ] {
            assert!(!is_safe_method(&method), "{method}");
        }
    }
}
