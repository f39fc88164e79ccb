//! Whose request it is: the account behind the API key, which idempotency keys are scoped to.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use idem::tower::ConsumerError;

/// The account of requests that carry no API key (the demo accepts them).
pub(crate) const ANONYMOUS: &str = "acct_anonymous";

/// The account a request belongs to: derived from its API key (`Authorization: Bearer sk_...`,
/// or Basic with the key as user name, as `curl -u sk_test_123:` sends it), never the key
/// itself, so logs never hold a credential. No `Authorization` at all is the anonymous account;
/// a malformed one is refused (401).
pub(crate) fn account(parts: &Parts) -> Result<String, ConsumerError> {
    let Some(value) = parts.headers.get(AUTHORIZATION) else {
        return Ok(ANONYMOUS.to_owned());
    };
    let value = value
        .to_str()
        .map_err(|_| ConsumerError::unauthenticated())?;
    let key = api_key(value).ok_or_else(ConsumerError::unauthenticated)?;
    let digest = blake3::hash(key.as_bytes()).to_hex();
    Ok(format!("acct_{}", &digest[..16]))
}

/// The API key in an `Authorization` value, if it is well formed.
fn api_key(value: &str) -> Option<String> {
    let (scheme, credentials) = value.trim().split_once(' ')?;
    let credentials = credentials.trim();
    let key = if scheme.eq_ignore_ascii_case("bearer") {
        credentials.to_owned()
    } else if scheme.eq_ignore_ascii_case("basic") {
        let decoded = String::from_utf8(base64_decode(credentials)?).ok()?;
        decoded.split(':').next()?.to_owned()
    } else {
        return None;
    };
    let valid = !key.is_empty() && key.len() <= 255 && key.bytes().all(|b| b.is_ascii_graphic());
    valid.then_some(key)
}

/// Standard base64 (padding optional), for Basic credentials.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.trim_end_matches('=').bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(((acc >> bits) & 0xff) as u8);
        }
    }
    Some(out)
}

/// The account as an extractor, for the endpoints outside the idempotency layer (reads).
#[derive(Debug, Clone)]
pub(crate) struct Account(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Account {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        account(parts)
            .map(Account)
            .map_err(|_| crate::errors::ApiError::unauthenticated().into_response())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(auth: Option<&str>) -> Parts {
        let mut builder = axum::http::Request::builder();
        if let Some(auth) = auth {
            builder = builder.header(AUTHORIZATION, auth);
        }
        builder.body(()).expect("request").into_parts().0
    }

    #[test]
    fn bearer_and_basic_name_the_same_account_and_never_the_key() {
        let bearer = account(&parts(Some("Bearer sk_test_123"))).expect("bearer");
        // "sk_test_123:" in base64, as curl -u sk_test_123: sends it.
        let basic = account(&parts(Some("Basic c2tfdGVzdF8xMjM6"))).expect("basic");
        assert_eq!(bearer, basic);
        assert!(!bearer.contains("sk_test"));
        assert_ne!(
            bearer,
            account(&parts(Some("Bearer sk_test_456"))).expect("other")
        );
        assert_eq!(account(&parts(None)).expect("anonymous"), ANONYMOUS);
        for bad in ["Bearer", "Token abc", "Basic !!!", "Bearer a b"] {
            assert!(account(&parts(Some(bad))).is_err(), "{bad}");
        }
    }
}
