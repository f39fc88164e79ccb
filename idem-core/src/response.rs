//! The response that is stored and replayed (C7, C8).

use crate::error::{Error, Field};

/// A response as stored and replayed byte for byte (C7): any status (a 402 replays as a 402,
/// C8), the [stored headers](crate::Policy::stores_header), the body.
///
/// ```
/// use idem_core::StoredResponse;
/// let resp = StoredResponse::new(201, r#"{"id":"ch_1"}"#).with_header("Content-Type", "application/json");
/// assert_eq!(resp.status, 201);
/// assert_eq!(resp.header("content-type"), Some(&b"application/json"[..]));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoredResponse {
    /// The HTTP status, 100..=599.
    pub status: u16,
    /// Header names (lower-cased) and raw values, in the order given.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body bytes.
    pub body: Vec<u8>,
}

impl StoredResponse {
    /// A response with no headers.
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// Adds a header (the name is lower-cased).
    pub fn with_header(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        self.headers
            .push((name.to_ascii_lowercase(), value.as_ref().to_vec()));
        self
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// Checks the status and every header, so that nothing unreplayable is stored.
    pub fn validate(&self) -> Result<(), Error> {
        if !(100..=599).contains(&self.status) {
            return Err(Error::invalid(
                Field::Response,
                format!("status {} is not in 100..=599", self.status),
            ));
        }
        for (name, value) in &self.headers {
            if name.is_empty() || !name.bytes().all(is_token_byte) {
                return Err(Error::invalid(
                    Field::Header,
                    format!("header name {name:?}"),
                ));
            }
            // RFC 9110 field-value: no control character but tab (CR, LF, NUL, DEL...).
            if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
                return Err(Error::invalid(
                    Field::Header,
                    format!("value of {name} contains a control character"),
                ));
            }
        }
        Ok(())
    }

    /// Lower-cases the names and keeps those `allowed` accepts and not [`is_never_stored`].
    pub fn retain_headers(&mut self, allowed: impl Fn(&str) -> bool) {
        for (name, _) in &mut self.headers {
            name.make_ascii_lowercase();
        }
        self.headers
            .retain(|(name, _)| !is_never_stored(name) && allowed(name));
    }
}

/// Headers that give a body its meaning, stored with it whatever the allow-list says (C7):
/// `Content-Type`, `Content-Encoding`, `Content-Language`, `Location`, `Content-Location`.
///
/// ```
/// use idem_core::is_always_stored;
/// assert!(is_always_stored("Content-Encoding"));
/// assert!(!is_always_stored("x-request-id"));
/// ```
pub fn is_always_stored(name: &str) -> bool {
    const ALWAYS: &[&str] = &[
        "content-type",
        "content-encoding",
        "content-language",
        "location",
        "content-location",
    ];
    ALWAYS.iter().any(|h| h.eq_ignore_ascii_case(name))
}

/// Headers never stored (C7): cookies, dates, credentials, rate limits, hop-by-hop framing.
///
/// ```
/// use idem_core::is_never_stored;
/// assert!(is_never_stored("Set-Cookie"));
/// assert!(is_never_stored("x-ratelimit-remaining"));
/// assert!(!is_never_stored("content-type"));
/// ```
pub fn is_never_stored(name: &str) -> bool {
    const EXACT: &[&str] = &[
        "set-cookie",
        "set-cookie2",
        "cookie",
        "date",
        "authorization",
        "proxy-authorization",
        "www-authenticate",
        "proxy-authenticate",
        "authentication-info",
        "retry-after",
        "ratelimit",
        "ratelimit-policy",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "upgrade",
        "trailer",
        "te",
        "idempotent-replayed",
    ];
    const PREFIXES: &[&str] = &[
        "x-ratelimit",
        "x-rate-limit",
        "ratelimit-",
        "x-api-key",
        "x-auth",
    ];
    EXACT.iter().any(|h| h.eq_ignore_ascii_case(name))
        || PREFIXES.iter().any(|p| {
            name.len() >= p.len() && name.as_bytes()[..p.len()].eq_ignore_ascii_case(p.as_bytes())
        })
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c07_denied_headers_are_dropped_even_when_allowed() {
        let mut r = StoredResponse::new(200, "x")
            .with_header("Content-Type", "text/plain")
            .with_header("Set-Cookie", "s=1")
            .with_header("Date", "now")
            .with_header("Authorization", "Bearer t")
            .with_header("X-RateLimit-Remaining", "9")
            .with_header("RateLimit-Reset", "1")
            .with_header("X-Other", "kept?");
        r.retain_headers(|_| true);
        let names: Vec<_> = r.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["content-type", "x-other"]);
        r.retain_headers(|n| n == "content-type");
        assert_eq!(r.headers.len(), 1);
    }

    #[test]
    fn invalid_status_and_headers_are_typed_errors() {
        assert!(StoredResponse::new(99, "").validate().is_err());
        assert!(StoredResponse::new(600, "").validate().is_err());
        assert!(StoredResponse::new(599, "").validate().is_ok());
        assert!(StoredResponse::new(200, "")
            .with_header("bad name", "v")
            .validate()
            .is_err());
        for bad in ["a\r\nb: c", "a\x01b", "a\x7fb", "nul\0"] {
            assert!(StoredResponse::new(200, "")
                .with_header("x", bad)
                .validate()
                .is_err());
        }
        assert!(StoredResponse::new(200, "")
            .with_header("x", "tab\tand \u{e9}")
            .validate()
            .is_ok());
    }
}
