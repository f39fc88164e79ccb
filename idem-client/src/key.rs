//! The idempotency key of one logical operation: the caller's own, or a fresh UUID v4.

use std::fmt;

/// The longest key accepted, in bytes (the server side's rule C1).
pub const MAX_KEY_LEN: usize = idem_core::IdempotencyKey::MAX_LEN;

/// The idempotency key of one logical operation: sent unchanged on every attempt of that
/// operation, and never on another one.
///
/// A key is what servers built on `idem` accept: 1..=255 bytes of visible ASCII (0x21..=0x7E),
/// checked by [`idem_core::IdempotencyKey`] itself. [`IdempotencyKey::random`] makes a UUID v4
/// from the system's random source; [`IdempotencyKey::new`] takes the caller's own (an order
/// id, a job id: whatever names the operation in the caller's system, so that even a restarted
/// caller sends the same key).
///
/// On the wire the key is written as the server reads it (see [`IdempotencyKey::to_header`]):
/// bare when it is made of token characters only, else as an RFC 8941 sf-string, so that
/// `q83vEg==`, `a,b` and `"k"` are keys of their own.
///
/// Its `Debug` form hides the value (keys end up in logs); [`IdempotencyKey::as_str`] and
/// `Display` give it.
///
/// ```
/// use idem_client::IdempotencyKey;
///
/// let key = IdempotencyKey::new("order-42-payment").expect("a valid key");
/// assert_eq!(key.as_str(), "order-42-payment");
/// assert!(IdempotencyKey::new("has space").is_err());
///
/// let fresh = IdempotencyKey::random().expect("the system has a random source");
/// assert_eq!(fresh.as_str().len(), 36);
/// assert_ne!(fresh, IdempotencyKey::random().expect("random"));
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(idem_core::IdempotencyKey);

/// Why a caller's key was refused (nothing was sent): the server side's own reason, from
/// [`idem_core::IdempotencyKey`] (empty, too long, a byte outside visible ASCII and where, a
/// header value that is neither a bare token nor an sf-string).
///
/// ```
/// use idem_client::IdempotencyKey;
///
/// let refused = IdempotencyKey::new("a\u{e9}").expect_err("not ASCII");
/// assert!(refused.to_string().contains("byte 1"), "{refused}");
/// assert!(matches!(refused.reason(), idem_core::Error::InvalidInput { .. }));
/// ```
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct InvalidKey(idem_core::Error);

impl InvalidKey {
    /// The server side's error, as `idem_core` reports it.
    pub fn reason(&self) -> &idem_core::Error {
        &self.0
    }
}

impl IdempotencyKey {
    /// The caller's own key, checked as servers built on `idem` check it: 1..=255 bytes of
    /// visible ASCII.
    ///
    /// ```
    /// use idem_client::IdempotencyKey;
    ///
    /// assert!(IdempotencyKey::new("").is_err());
    /// assert!(IdempotencyKey::new("k".repeat(256)).is_err());
    /// // Any visible ASCII, quotes and commas too: the header form quotes what needs it.
    /// assert!(IdempotencyKey::new("\"k\",v=1").is_ok());
    /// ```
    pub fn new(key: impl Into<String>) -> Result<Self, InvalidKey> {
        idem_core::IdempotencyKey::new(&key.into())
            .map(Self)
            .map_err(InvalidKey)
    }

    /// The key in a header value, read as servers built on `idem` read it
    /// ([`idem_core::IdempotencyKey::from_header`]): an sf-string (`"..."`, with `\"` and
    /// `\\` escaped) or a bare token.
    ///
    /// ```
    /// use idem_client::IdempotencyKey;
    ///
    /// let quoted = IdempotencyKey::from_header(b"\"q83vEg==\"").expect("an sf-string");
    /// assert_eq!(quoted.as_str(), "q83vEg==");
    /// assert_eq!(IdempotencyKey::from_header(b"abc").expect("bare").as_str(), "abc");
    /// assert!(IdempotencyKey::from_header(b"q83vEg==").is_err(), "`=` is not a token character");
    /// ```
    pub fn from_header(value: &[u8]) -> Result<Self, InvalidKey> {
        idem_core::IdempotencyKey::from_header(value)
            .map(Self)
            .map_err(InvalidKey)
    }

    /// The header value that servers built on `idem` read back as this key: the key itself
    /// when every byte is a token character (`A-Z a-z 0-9` and ``! # $ % & ' * + - . ^ _ ` |
    /// ~ : /``), else an RFC 8941 sf-string with `\` and `"` escaped.
    ///
    /// ```
    /// use idem_client::IdempotencyKey;
    ///
    /// let header = |k: &str| IdempotencyKey::new(k).expect("a key").to_header();
    /// assert_eq!(header("order-42"), "order-42");
    /// assert_eq!(header("q83vEg=="), "\"q83vEg==\"");
    /// assert_eq!(header("\"k\""), "\"\\\"k\\\"\"");
    /// ```
    pub fn to_header(&self) -> String {
        let key = self.as_str();
        if key.bytes().all(is_bare) {
            return key.to_owned();
        }
        let mut out = String::with_capacity(key.len() + 2);
        out.push('"');
        for c in key.chars() {
            if matches!(c, '"' | '\\') {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
        out
    }

    /// A fresh random key: a UUID v4 (RFC 9562) in its hyphenated lower-case form, from the
    /// operating system's random source.
    ///
    /// ```
    /// let key = idem_client::IdempotencyKey::random().expect("a random source");
    /// assert_eq!(key.as_str().as_bytes()[14], b'4'); // the version nibble
    /// ```
    pub fn random() -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)?;
        let key = idem_core::IdempotencyKey::new(&uuid_v4(bytes))
            .expect("a hyphenated UUID is a valid key");
        Ok(Self(key))
    }

    /// The key's value (its header form is [`IdempotencyKey::to_header`]).
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// The key as `idem_core` (the server side) holds it.
    pub fn as_core(&self) -> &idem_core::IdempotencyKey {
        &self.0
    }
}

/// Whether `c` may be sent in a bare key: the characters `idem_core`'s header parser reads
/// bare (an RFC 9110 `tchar`, or `:` and `/` as an RFC 8941 sf-token allows).
fn is_bare(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&c)
}

/// The hyphenated form of the UUID v4 made of `bytes` (version and variant bits set).
fn uuid_v4(mut bytes: [u8; 16]) -> String {
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let mut out = String::with_capacity(36);
    for (i, byte) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey(<{} bytes>)", self.as_str().len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key read back by the server side's parser from its header form.
    fn round_trip(key: &str) -> String {
        let key = IdempotencyKey::new(key).expect("a valid key");
        let header = key.to_header();
        idem_core::IdempotencyKey::from_header(header.as_bytes())
            .unwrap_or_else(|e| panic!("{header:?} refused by the server: {e}"))
            .as_str()
            .to_owned()
    }

    #[test]
    fn c01_every_printable_ascii_key_shape_reads_back_as_itself_on_the_server() {
        let mut keys = vec![
            "\"k\"".to_owned(),
            "\\".to_owned(),
            "\\\"".to_owned(),
            "\"".to_owned(),
            "q83vEg==".to_owned(),
            "a,b".to_owned(),
            "k=v".to_owned(),
            "k;p=1".to_owned(),
            "\"k\";p=1".to_owned(),
            "~".repeat(MAX_KEY_LEN),
            "\"".repeat(MAX_KEY_LEN),
        ];
        for c in (0x21u8..=0x7E).map(char::from) {
            keys.push(c.to_string());
            keys.push(format!("{c}{c}"));
            keys.push(format!("a{c}b"));
            keys.push(format!("{c}key"));
            keys.push(format!("key{c}"));
        }
        for key in keys {
            assert_eq!(round_trip(&key), key, "{key:?}");
        }
    }

    #[test]
    fn c01_a_key_of_token_characters_is_sent_bare_and_any_other_quoted() {
        let header = |k: &str| IdempotencyKey::new(k).expect("key").to_header();
        assert_eq!(
            header("8e03978e-40d5-43e8-bc93-6894a57f9324"),
            "8e03978e-40d5-43e8-bc93-6894a57f9324"
        );
        assert_eq!(header("urn:job/7"), "urn:job/7");
        assert_eq!(header("a,b"), "\"a,b\"");
        assert_eq!(header("a\\b"), "\"a\\\\b\"");
        // `"abc"` and `abc` are two keys, on the wire too.
        assert_ne!(header("\"abc\""), header("abc"));
        assert_ne!(round_trip("\"abc\""), round_trip("abc"));
    }

    #[test]
    fn c01_keys_are_checked_by_the_server_sides_rules_with_the_real_position() {
        assert!(IdempotencyKey::new("!").is_ok());
        assert!(IdempotencyKey::new("~".repeat(MAX_KEY_LEN)).is_ok());
        let long = IdempotencyKey::new("~".repeat(MAX_KEY_LEN + 1)).expect_err("too long");
        assert!(long.to_string().contains("256 bytes"), "{long}");
        for (key, at) in [("ab\tc", 2), ("a b", 1), ("\u{7f}", 0), ("abcd\u{e9}", 4)] {
            let error = IdempotencyKey::new(key).expect_err("not visible ASCII");
            assert!(
                error.to_string().contains(&format!("byte {at} ")),
                "{key:?}: {error}"
            );
        }
        assert!(IdempotencyKey::new("").is_err());
    }

    #[test]
    fn a_header_value_is_read_as_the_server_reads_it() {
        let read = |v: &[u8]| IdempotencyKey::from_header(v).map(|k| k.as_str().to_owned());
        assert_eq!(read(b"abc").expect("bare"), "abc");
        assert_eq!(read(b"\"abc\"").expect("quoted"), "abc");
        assert_eq!(read(b"\"a\\\"b\"").expect("escaped"), "a\"b");
        for refused in [&b"q83vEg=="[..], b"a,b", b"k=v", b""] {
            assert!(read(refused).is_err(), "{refused:?}");
        }
    }

    #[test]
    fn uuid_v4_sets_the_version_and_variant_bits_and_keeps_the_rest() {
        assert_eq!(uuid_v4([0xff; 16]), "ffffffff-ffff-4fff-bfff-ffffffffffff");
        assert_eq!(uuid_v4([0x00; 16]), "00000000-0000-4000-8000-000000000000");
        let bytes = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc,
            0xde, 0xf0,
        ];
        assert_eq!(uuid_v4(bytes), "12345678-9abc-4ef0-9234-56789abcdef0");
    }

    #[test]
    fn random_keys_are_valid_uuid_v4s_and_differ() {
        let keys: Vec<IdempotencyKey> = (0..64)
            .map(|_| IdempotencyKey::random().expect("a random source"))
            .collect();
        for key in &keys {
            let text = key.as_str();
            assert_eq!(text.len(), 36, "{text}");
            assert_eq!(key.to_header(), text, "a UUID is sent bare");
            assert_eq!(&text[14..15], "4", "{text}");
            assert!(matches!(&text[19..20], "8" | "9" | "a" | "b"), "{text}");
        }
        let distinct: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(distinct.len(), keys.len());
    }

    #[test]
    fn debug_never_shows_the_value() {
        let key = IdempotencyKey::new("secret-order-7").expect("valid");
        let shown = format!("{key:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert_eq!(key.to_string(), "secret-order-7");
    }
}
