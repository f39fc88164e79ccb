//! The request headers a [`WebhookScheme`](super::WebhookScheme) reads, whatever HTTP library
//! carried them: a slice or `Vec` of `(name, value)` pairs, or (feature `http`) an
//! `http::HeaderMap`.
//!
//! Names are compared without regard to ASCII case, as HTTP does. A scheme reads each header
//! it needs with [`single`], which refuses what no sender sends: the header twice, a value
//! over [`MAX_HEADER_LEN`] bytes, or bytes other than visible ASCII and spaces.

use super::signature::{SignatureError, MAX_EVENT_ID_LEN, MAX_HEADER_LEN};

/// Request headers, looked up by name.
///
/// ```
/// use idem_signature::Headers;
/// let headers = [("X-GitHub-Event", "push"), ("x-github-delivery", "72d3162e")];
/// assert_eq!(headers.values("x-github-event"), vec![&b"push"[..]]);
/// assert!(headers.values("x-hub-signature-256").is_empty());
/// ```
pub trait Headers {
    /// Every value of the header `name` (compared without regard to ASCII case), in the order
    /// received; empty when the request has none.
    fn values(&self, name: &str) -> Vec<&[u8]>;
}

impl<T: Headers + ?Sized> Headers for &T {
    fn values(&self, name: &str) -> Vec<&[u8]> {
        (**self).values(name)
    }
}

impl<N: AsRef<str>, V: AsRef<[u8]>> Headers for [(N, V)] {
    fn values(&self, name: &str) -> Vec<&[u8]> {
        self.iter()
            .filter(|(n, _)| n.as_ref().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_ref())
            .collect()
    }
}

impl<N: AsRef<str>, V: AsRef<[u8]>, const K: usize> Headers for [(N, V); K] {
    fn values(&self, name: &str) -> Vec<&[u8]> {
        self.as_slice().values(name)
    }
}

impl<N: AsRef<str>, V: AsRef<[u8]>> Headers for Vec<(N, V)> {
    fn values(&self, name: &str) -> Vec<&[u8]> {
        self.as_slice().values(name)
    }
}

#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
impl Headers for http::HeaderMap {
    fn values(&self, name: &str) -> Vec<&[u8]> {
        self.get_all(name)
            .iter()
            .map(http::HeaderValue::as_bytes)
            .collect()
    }
}

/// The one value of header `name`, trimmed of surrounding spaces and tabs: `Ok(None)` when
/// absent, [`SignatureError::Malformed`] when it is sent more than once, is longer than
/// [`MAX_HEADER_LEN`] bytes, or holds a byte that is neither visible ASCII nor a space or tab.
pub fn single<'h>(headers: &'h dyn Headers, name: &str) -> Result<Option<&'h str>, SignatureError> {
    let values = headers.values(name);
    let value = match values.as_slice() {
        [] => return Ok(None),
        [one] => *one,
        _ => return Err(SignatureError::Malformed("header sent more than once")),
    };
    if value.len() > MAX_HEADER_LEN {
        return Err(SignatureError::Malformed("header too long"));
    }
    if !value
        .iter()
        .all(|b| matches!(b, b' ' | b'\t' | 0x21..=0x7e))
    {
        return Err(SignatureError::Malformed("header is not visible ASCII"));
    }
    // Visible ASCII and blanks only: valid UTF-8.
    let text = std::str::from_utf8(value)
        .map_err(|_| SignatureError::Malformed("header is not visible ASCII"))?;
    Ok(Some(text.trim_matches(|c| c == ' ' || c == '\t')))
}

/// The one value of the required header `name`, as [`single`], and
/// [`SignatureError::MissingHeader`] when it is absent or empty.
pub fn required<'h>(
    headers: &'h dyn Headers,
    name: &'static str,
) -> Result<&'h str, SignatureError> {
    match single(headers, name)? {
        Some(value) if !value.is_empty() => Ok(value),
        _ => Err(SignatureError::MissingHeader(name)),
    }
}

/// An id or name header's value (`webhook-id`, `X-GitHub-Delivery`, `X-GitHub-Event`,
/// `X-Shopify-Topic`, ...) as the inbox may use it: at most [`MAX_EVENT_ID_LEN`] bytes, no
/// blank inside (so that a name joined to another part by a space stays unambiguous).
pub fn event_id(value: &str) -> Result<String, SignatureError> {
    if value.len() > MAX_EVENT_ID_LEN {
        return Err(SignatureError::Malformed("event id too long"));
    }
    if value.contains([' ', '\t']) {
        return Err(SignatureError::Malformed("event id holds a blank"));
    }
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_without_regard_to_case_and_values_keep_their_order() {
        let headers = vec![
            ("Webhook-Id".to_owned(), b"a".to_vec()),
            ("other".to_owned(), b"x".to_vec()),
            ("WEBHOOK-ID".to_owned(), b"b".to_vec()),
        ];
        assert_eq!(headers.values("webhook-id"), vec![&b"a"[..], &b"b"[..]]);
        assert!(headers.values("webhook-timestamp").is_empty());
    }

    #[test]
    fn single_refuses_repeats_overlong_and_non_ascii_values() {
        let twice = [("h", "a"), ("H", "b")];
        assert_eq!(
            single(&twice, "h"),
            Err(SignatureError::Malformed("header sent more than once"))
        );
        let long = "a".repeat(MAX_HEADER_LEN + 1);
        let at_limit = "a".repeat(MAX_HEADER_LEN);
        assert_eq!(
            single(&[("h", long.as_str())], "h"),
            Err(SignatureError::Malformed("header too long"))
        );
        assert_eq!(
            single(&[("h", at_limit.as_str())], "h"),
            Ok(Some(at_limit.as_str()))
        );
        for bad in ["caf\u{e9}", "a\0b", "a\nb", "\u{7f}"] {
            assert_eq!(
                single(&[("h", bad)], "h"),
                Err(SignatureError::Malformed("header is not visible ASCII")),
                "{bad:?}"
            );
        }
        let raw: [(&str, &[u8]); 1] = [("h", &[0xff, 0xfe])];
        assert_eq!(
            single(&raw, "h"),
            Err(SignatureError::Malformed("header is not visible ASCII"))
        );
        assert_eq!(single(&[("h", " \tv \t")], "h"), Ok(Some("v")));
        assert_eq!(single(&[("h", "v")], "other"), Ok(None));
    }

    #[cfg(feature = "http")]
    #[test]
    fn an_http_header_map_gives_every_value_of_a_name() {
        let mut map = http::HeaderMap::new();
        map.append("webhook-id", http::HeaderValue::from_static("msg_1"));
        map.append("Webhook-Id", http::HeaderValue::from_static("msg_2"));
        assert_eq!(
            Headers::values(&map, "WEBHOOK-ID"),
            vec![&b"msg_1"[..], &b"msg_2"[..]]
        );
        assert_eq!(
            single(&map, "webhook-id"),
            Err(SignatureError::Malformed("header sent more than once"))
        );
        let opaque = http::HeaderValue::from_bytes(b"caf\xe9").expect("an opaque value");
        map.insert("x-github-delivery", opaque);
        assert_eq!(
            single(&map, "x-github-delivery"),
            Err(SignatureError::Malformed("header is not visible ASCII"))
        );
    }

    #[test]
    fn required_treats_empty_as_missing() {
        assert_eq!(
            required(&[("h", "  ")], "h"),
            Err(SignatureError::MissingHeader("h"))
        );
        assert_eq!(
            required(&[("x", "v")], "h"),
            Err(SignatureError::MissingHeader("h"))
        );
        assert_eq!(required(&[("h", "v")], "h"), Ok("v"));
    }

    #[test]
    fn ids_are_bounded_and_hold_no_blank() {
        let at_limit = "d".repeat(MAX_EVENT_ID_LEN);
        assert_eq!(event_id(&at_limit), Ok(at_limit.clone()));
        assert_eq!(
            event_id(&format!("{at_limit}d")),
            Err(SignatureError::Malformed("event id too long"))
        );
        for blank in ["a b", "a\tb"] {
            assert_eq!(
                event_id(blank),
                Err(SignatureError::Malformed("event id holds a blank"))
            );
        }
        assert_eq!(event_id("a,b"), Ok("a,b".to_owned()));
    }
}
