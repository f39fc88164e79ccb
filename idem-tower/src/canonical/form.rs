//! Canonical forms: one `application/x-www-form-urlencoded` body, one byte string (C3), as
//! [`canonical_json`](super::canonical_json) is for JSON.

use idem_core::{Error, Field};

/// Canonicalises an `application/x-www-form-urlencoded` body for fingerprinting (C3), so that
/// one form always gives the same bytes whatever order its fields were sent in and however its
/// characters were percent-encoded.
///
/// The body is read as the WHATWG URL Standard reads it: fields separated by `&` (empty ones
/// skipped), a name and a value separated by the first `=` (a field without one has an empty
/// value), `+` is a space and `%XX` the byte it names. A `%` that is not followed by two hex
/// digits is refused ([`Error::InvalidInput`] on the body): a body the reader would take two
/// ways is not canonicalised (the HTTP layer then fingerprints its raw bytes).
///
/// A form of distinct plain names (ASCII letters, digits, `_` and `-`; distinct also without
/// regard to ASCII case, as ASP.NET Core reads them) is a map: the output has
/// its fields sorted by the bytes of their decoded name. Any other form is a list, whose order
/// is meaning, also between names, and keeps the order it was sent in: a handler reading the
/// pairs in order sees `item=tea&note=gift&item=cake` put the note on the tea; PHP reads
/// `a[]=1&a[0]=2` as `[2]` and `a[0]=2&a[]=1` as `[2, 1]`, and `a.b` and `a_b` as one name;
/// Rack 2 reads `a]` and `a` as one. Every byte but `A-Z a-z 0-9 * - . _` is written as `%XX`
/// in uppercase hex, a space as `+`. So `b=2&a=%7e` and `a=~&b=2` are the same request;
/// `a=1&a=2` and `a=2&a=1` are not, nor are `a=1&b=0&a=2` and `a=1&a=2&b=0`.
///
/// ```
/// use idem_tower::canonical::canonical_form;
/// let sent = canonical_form(b"currency=eur&amount=1000&note=caf%C3%A9+au+lait")?;
/// let resent = canonical_form("amount=1000&note=café au lait&currency=eur".as_bytes())?;
/// assert_eq!(sent, resent);
/// assert_eq!(sent, b"amount=1000&currency=eur&note=caf%C3%A9+au+lait");
/// assert!(canonical_form(b"amount=100%").is_err());
/// # Ok::<(), idem_core::Error>(())
/// ```
pub fn canonical_form(body: &[u8]) -> Result<Vec<u8>, Error> {
    let mut fields = Vec::new();
    for field in body.split(|&b| b == b'&').filter(|f| !f.is_empty()) {
        let (name, value) = match field.iter().position(|&b| b == b'=') {
            Some(at) => (&field[..at], &field[at + 1..]),
            None => (field, &[][..]),
        };
        fields.push((decode(name)?, decode(value)?));
    }
    // Sorted only where no reader of forms can tell the order: distinct plain names.
    let plain = |name: &[u8]| {
        !name.is_empty()
            && name
                .iter()
                .all(|&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    // Distinct also without regard to ASCII case: ASP.NET Core reads `Amount` and `amount`
    // as one name.
    let mut names: Vec<Vec<u8>> = fields
        .iter()
        .map(|(name, _)| name.to_ascii_lowercase())
        .collect();
    names.sort_unstable();
    if fields.iter().all(|(name, _)| plain(name)) && names.windows(2).all(|pair| pair[0] != pair[1])
    {
        fields.sort_by(|a, b| a.0.cmp(&b.0));
    }
    let mut out = Vec::with_capacity(body.len());
    for (i, (name, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(b'&');
        }
        encode(name, &mut out);
        out.push(b'=');
        encode(value, &mut out);
    }
    Ok(out)
}

/// `+` to a space, `%XX` to its byte.
fn decode(encoded: &[u8]) -> Result<Vec<u8>, Error> {
    let mut out = Vec::with_capacity(encoded.len());
    let mut bytes = encoded.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'+' => out.push(b' '),
            b'%' => {
                let high = bytes.next().and_then(|&h| hex(h));
                let low = bytes.next().and_then(|&l| hex(l));
                match (high, low) {
                    (Some(high), Some(low)) => out.push(high << 4 | low),
                    _ => {
                        return Err(Error::invalid(
                            Field::Body,
                            "a form body with a `%` not followed by two hex digits",
                        ))
                    }
                }
            }
            b => out.push(b),
        }
    }
    Ok(out)
}

fn hex(digit: u8) -> Option<u8> {
    char::from(digit)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// The URL Standard's form serialisation: unreserved bytes as they are, a space as `+`,
/// everything else `%XX`.
fn encode(decoded: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in decoded {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'*' | b'-' | b'.' | b'_' => out.push(b),
            b' ' => out.push(b'+'),
            b => out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::canonical_form;
    use proptest::prelude::*;

    fn canon(body: &str) -> String {
        String::from_utf8(canonical_form(body.as_bytes()).expect("a form")).expect("ASCII")
    }

    #[test]
    fn c03_golden_canonical_forms() {
        // Pinned: a change here changes stored fingerprints.
        for (body, expected) in [
            ("", ""),
            ("b=2&a=1", "a=1&b=2"),
            ("a=2&a=1&b=0", "a=2&a=1&b=0"),
            ("b=0&a=2&a=1", "b=0&a=2&a=1"),
            ("b=1&a%5B%5D=2", "b=1&a%5B%5D=2"),
            ("b=1&a.c=2", "b=1&a.c=2"),
            ("a%5B0%5D=2&a%5B%5D=1", "a%5B0%5D=2&a%5B%5D=1"),
            (
                "item=tea&note=gift&item=cake",
                "item=tea&note=gift&item=cake",
            ),
            ("flag&x=", "flag=&x="),
            ("&&a=1&&", "a=1"),
            ("n=%7e%7E~", "n=%7E%7E%7E"),
            ("n=a+b%20c", "n=a+b+c"),
            ("n=%2B", "n=%2B"),
            ("k%3Dv=1=2", "k%3Dv=1%3D2"),
            ("é=ü", "%C3%A9=%C3%BC"),
            ("n=%ff", "n=%FF"),
        ] {
            assert_eq!(canon(body), expected, "{body:?}");
        }
    }

    #[test]
    fn c03_a_form_that_repeats_a_name_keeps_its_order_between_names() {
        // A note on the tea, then on the cake: two requests, never one fingerprint.
        assert_ne!(
            canon("item=tea&note=gift&item=cake"),
            canon("item=tea&item=cake&note=gift")
        );
        // Distinct names: a map, one request in any order.
        assert_eq!(canon("note=gift&item=tea"), canon("item=tea&note=gift"));
    }

    #[test]
    fn c03_a_broken_percent_escape_is_refused() {
        for body in ["a=%", "a=%4", "a=%zz", "%g1=2"] {
            assert!(canonical_form(body.as_bytes()).is_err(), "{body:?}");
        }
    }

    proptest! {
        #[test]
        fn c03_any_field_order_gives_one_form(
            fields in proptest::collection::btree_map("[a-z0-9_-]{1,6}", "[ -~]{0,8}", 0..6),
            seed in any::<u64>(),
        ) {
            let encode = |s: &str| {
                let mut out = Vec::new();
                super::encode(s.as_bytes(), &mut out);
                String::from_utf8(out).expect("ASCII")
            };
            let mut pairs: Vec<String> = fields.iter().map(|(n, v)| format!("{}={}", encode(n), encode(v))).collect();
            let sorted = pairs.join("&");
            let shift = usize::try_from(seed).unwrap_or(0) % pairs.len().max(1);
            pairs.rotate_left(shift);
            prop_assert_eq!(canonical_form(pairs.join("&").as_bytes()).expect("a form"), canonical_form(sorted.as_bytes()).expect("a form"));
            // Canonical forms are fixed points.
            let once = canonical_form(sorted.as_bytes()).expect("a form");
            prop_assert_eq!(canonical_form(&once).expect("a form"), once);
        }
    }
}
