//! The `Idempotency-Key` header: present once at most, read by [`IdempotencyKey::from_header`].

use http::header::{HeaderMap, HeaderName};
use idem_core::{Error, Field, IdempotencyKey};

/// The key a request carries in `header`, unquoted: `None` when the header is absent. Two
/// headers, or a value that is neither an sf-string nor a bare token
/// ([`IdempotencyKey::from_header`]), are [`Error::InvalidInput`] (400, C1).
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
    IdempotencyKey::from_header(value.as_bytes()).map(|key| Some(key.as_str().to_owned()))
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
    fn c01_an_absent_key_is_none_and_a_present_one_is_read() {
        assert_eq!(key(&[]).expect("absent"), None);
        assert_eq!(
            key(&[b"\"abc-1\""]).expect("sf-string").as_deref(),
            Some("abc-1")
        );
    }

    #[test]
    fn c01_a_key_sent_twice_or_in_another_form_is_invalid() {
        for bad in [&[&b"a"[..], b"b"][..], &[b"a, b"], &[b"k;p=1"]] {
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
