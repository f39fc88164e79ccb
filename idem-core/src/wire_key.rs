//! The key as it arrives in an `Idempotency-Key` header or gRPC metadata (C1).

use crate::error::{Error, Field};
use crate::key::IdempotencyKey;

impl IdempotencyKey {
    /// Reads one `Idempotency-Key` header value (C1). Two forms spell the same key: an RFC 8941
    /// **sf-string** (`"..."`, `\"` and `\\` its only escapes, nothing after the quote), or a
    /// **bare value** of RFC 9110 token characters, `:` and `/` (clients send bare UUIDs).
    /// Everything else (a list, parameters, `=`, parentheses, a quote inside a bare value, a
    /// malformed sf-string) is [`Error::InvalidInput`] with the reason. Surrounding spaces and
    /// tabs are ignored; then [`IdempotencyKey::new`]'s checks apply.
    ///
    /// ```
    /// use idem_core::IdempotencyKey;
    /// let bare = IdempotencyKey::from_header(b"8e03978e-40d5-43e8-bc93-6894a57f9324")?;
    /// let quoted = IdempotencyKey::from_header(b"\"8e03978e-40d5-43e8-bc93-6894a57f9324\"")?;
    /// assert_eq!(bare, quoted);
    /// // A base64 key with padding: quote it.
    /// assert!(IdempotencyKey::from_header(b"q83vEg==").is_err());
    /// assert_eq!(IdempotencyKey::from_header(b"\"q83vEg==\"")?.as_str(), "q83vEg==");
    /// for refused in [&b"a,b"[..], b"a, b", b"k;p=1", b"\"k\";p=1", b"k(x)", b"k=v", b"mid\"quote"] {
    ///     assert!(matches!(IdempotencyKey::from_header(refused), Err(idem_core::Error::InvalidInput { .. })));
    /// }
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn from_header(value: &[u8]) -> Result<Self, Error> {
        let text = std::str::from_utf8(value)
            .map_err(|_| Error::invalid(Field::Key, "not visible ASCII"))?
            .trim_matches([' ', '\t']);
        match text.strip_prefix('"') {
            Some(quoted) => Self::new(&unquote(quoted)?),
            None => {
                bare(text)?;
                Self::new(text)
            }
        }
    }
}

/// Whether `c` may appear in a bare key: an RFC 9110 `tchar`, `:` or `/` (RFC 8941 sf-token).
fn is_bare(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&c)
}

/// Refuses a bare value with a character outside [`is_bare`], saying what it looks like.
fn bare(text: &str) -> Result<(), Error> {
    let Some(c) = text.bytes().find(|&c| !is_bare(c)) else {
        return Ok(());
    };
    let why = match c {
        b',' => "a list of values is not a key: send one".to_owned(),
        b';' => "parameters are not part of a key: send the key alone".to_owned(),
        b' ' | b'\t' => "a bare key cannot contain spaces: quote it as an sf-string".to_owned(),
        c if c.is_ascii_graphic() => format!(
            "`{}` is not a token character: quote the key as an sf-string (\"...\")",
            char::from(c)
        ),
        _ => "not visible ASCII".to_owned(),
    };
    Err(Error::invalid(Field::Key, why))
}

/// The inside of an sf-string (RFC 8941 §3.3.3) after its opening quote.
fn unquote(rest: &str) -> Result<String, Error> {
    let malformed =
        |why: &str| Error::invalid(Field::Key, format!("malformed quoted string: {why}"));
    let mut out = String::with_capacity(rest.len());
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped @ ('"' | '\\')) => out.push(escaped),
                _ => return Err(malformed("only \\\" and \\\\ are escapes")),
            },
            '"' => {
                return match chars.next() {
                    None => Ok(out),
                    Some(';') => Err(malformed("parameters are not part of a key")),
                    Some(_) => Err(malformed("something follows the closing quote")),
                }
            }
            c => out.push(c),
        }
    }
    Err(malformed("no closing quote"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(value: &[u8]) -> Result<String, Error> {
        IdempotencyKey::from_header(value).map(|k| k.as_str().to_owned())
    }

    #[test]
    fn c01_bare_and_quoted_keys_are_the_same_key() {
        assert_eq!(read(b"abc-1").expect("bare"), "abc-1");
        assert_eq!(read(b"\"abc-1\"").expect("sf-string"), "abc-1");
        assert_eq!(read(b"  \"a\\\"b\\\\c\" ").expect("escapes"), "a\"b\\c");
        assert_eq!(
            read(b"urn:uuid:1/2").expect("sf-token characters"),
            "urn:uuid:1/2"
        );
        assert_eq!(
            read(b"!#$%&'*+-.^_`|~").expect("every tchar"),
            "!#$%&'*+-.^_`|~"
        );
    }

    #[test]
    fn c01_every_other_form_is_refused_with_its_reason() {
        for (bad, why) in [
            (&b"a,b"[..], "list"),
            (b"a, b", "list"),
            (b"k;p=1", "parameters"),
            (b"\"k\";p=1", "parameters"),
            (b"k(x)", "`(`"),
            (b"k=v", "`=`"),
            (b"mid\"quote", "`\"`"),
            (b"a b", "spaces"),
            (b"k@x", "`@`"),
            (b"\"open", "closing quote"),
            (b"\"a\\n\"", "escapes"),
            (b"\"a\" b", "follows"),
            (b"\xff\xfe", "visible ASCII"),
            (b"", "empty"),
            (b"\"\"", "empty"),
        ] {
            let err = read(bad).expect_err("refused");
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
            assert!(err.to_string().contains(why), "{bad:?}: {err}");
        }
    }
}
