//! The `Idempotency-Key` header: a bare token, or an RFC 8941 sf-string (quoted).

use http::header::{HeaderMap, HeaderName};
use idem_core::{Error, Field};

/// The key a request carries in `header`, unquoted: `None` when the header is absent. Two
/// headers, a value that is not visible ASCII, a malformed sf-string or one with parameters
/// are [`Error::InvalidInput`] (400, C1); the length and the characters of the key itself are
/// checked by the request builder.
pub(crate) fn from_headers(
    headers: &HeaderMap,
    header: &HeaderName,
) -> Result<Option<String>, Error> {
    let mut values = headers.get_all(header).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Error::invalid(Field::Key, "sent more than once"));
    }
    let text = std::str::from_utf8(value.as_bytes())
        .map_err(|_| Error::invalid(Field::Key, "not visible ASCII"))?
        .trim_matches([' ', '\t']);
    match text.strip_prefix('"') {
        Some(quoted) => unquote(quoted).map(Some),
        None => Ok(Some(text.to_owned())),
    }
}

/// The inside of an sf-string (RFC 8941 §3.3.3) whose opening quote was consumed: `\"` and
/// `\\` are the only escapes, and nothing may follow the closing quote (no parameters).
fn unquote(rest: &str) -> Result<String, Error> {
    let malformed = || Error::invalid(Field::Key, "malformed quoted string");
    let mut out = String::with_capacity(rest.len());
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped @ ('"' | '\\')) => out.push(escaped),
                _ => return Err(malformed()),
            },
            '"' => {
                return match chars.next() {
                    None => Ok(out),
                    Some(_) => Err(malformed()),
                }
            }
            c => out.push(c),
        }
    }
    Err(malformed())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn key(values: &[&[u8]]) -> Result<Option<String>, Error> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(
                "idempotency-key",
                HeaderValue::from_bytes(v).expect("a header value"),
            );
        }
        from_headers(&headers, &HeaderName::from_static("idempotency-key"))
    }

    #[test]
    fn c01_bare_and_quoted_keys_are_the_same_key() {
        assert_eq!(key(&[]).expect("absent"), None);
        assert_eq!(key(&[b"abc-1"]).expect("bare").as_deref(), Some("abc-1"));
        assert_eq!(
            key(&[b"\"abc-1\""]).expect("sf-string").as_deref(),
            Some("abc-1")
        );
        assert_eq!(
            key(&[b"  \"a\\\"b\\\\c\" "]).expect("escapes").as_deref(),
            Some("a\"b\\c")
        );
    }

    #[test]
    fn c01_malformed_or_repeated_keys_are_invalid() {
        for bad in [
            &[&b"\"open"[..]][..],
            &[b"\"a\";p=1"],
            &[b"\"a\\n\""],
            &[b"\xff\xfe"],
            &[b"a", b"b"],
        ] {
            let err = key(bad).expect_err("invalid");
            assert!(
                matches!(
                    err,
                    Error::InvalidInput {
                        field: Field::Key,
                        ..
                    }
                ),
                "{bad:?}"
            );
        }
    }
}
