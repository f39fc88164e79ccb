//! What a request means (C3): a blake3 digest over its length-prefixed parts.

use crate::error::Error;
use std::fmt;
use std::sync::LazyLock;

/// The fingerprint's derivation, its context absorbed once per process (a new one hashes the
/// context first: a compression per request; a clone copies the hasher's state).
static DERIVATION: LazyLock<blake3::Hasher> =
    LazyLock::new(|| blake3::Hasher::new_derive_key("idem 2026 request fingerprint v1"));

/// A 32-byte blake3 digest of a request's meaning (C3): method, concrete path and query, body
/// media type, the headers the caller names, and the body. Parts are tagged and
/// length-prefixed (no two requests share an encoding) and may come in any order. Same key,
/// other fingerprint: [`Answer::Mismatch`](crate::Answer::Mismatch) (HTTP 422).
///
/// ```
/// use idem_core::Fingerprint;
/// let a = Fingerprint::builder().method("POST").path("/charges").body(b"{\"amount\":100}").finish();
/// let b = Fingerprint::builder().path("/charges").body(b"{\"amount\":100}").method("POST").finish();
/// let c = Fingerprint::builder().method("POST").path("/charges").body(b"{\"amount\":200}").finish();
/// assert_eq!(a, b);
/// assert_ne!(a, c);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Starts a fingerprint.
    pub fn builder<'a>() -> FingerprintBuilder<'a> {
        FingerprintBuilder::default()
    }

    /// Wraps 32 stored bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// Reads a stored fingerprint; anything but 32 bytes is [`Error::CorruptRecord`].
    pub fn from_slice(bytes: &[u8]) -> Result<Self, Error> {
        <[u8; 32]>::try_from(bytes)
            .map(Self)
            .map_err(|_| Error::CorruptRecord(format!("fingerprint of {} bytes", bytes.len())))
    }

    /// The digest bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..)")
    }
}

/// Collects the parts of a [`Fingerprint`]. Call order does not matter, but for the values of
/// one header name: they keep the order they were given in.
#[derive(Debug, Default, Clone)]
pub struct FingerprintBuilder<'a> {
    method: Vec<u8>,
    path: Vec<u8>,
    headers: Vec<(String, Vec<u8>)>,
    /// The media type of `Content-Type`, normalised; empty when the request named none.
    media_type: String,
    body: &'a [u8],
    /// Raw bytes, canonical JSON or a canonical form: domains that never collide.
    domain: Domain,
}

/// What the body's bytes are, each its own domain of the digest (C3): raw bytes, canonical JSON
/// and a canonical form never share a digest. The HTTP layer makes bodies canonical (idem-tower's
/// `canonical` module); idem does not parse them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) enum Domain {
    /// The bytes as sent.
    #[default]
    Raw,
    /// Canonical JSON: keys sorted, no whitespace, one escaping, volatile fields removed.
    Json,
    /// A canonical `application/x-www-form-urlencoded` body: fields sorted, one encoding.
    Form,
}

impl Domain {
    /// The body's tag in the digest.
    fn tag(self) -> u8 {
        match self {
            Domain::Raw => b'B',
            Domain::Json => b'J',
            Domain::Form => b'F',
        }
    }
}

impl<'a> FingerprintBuilder<'a> {
    /// The HTTP method, in upper case: `post` and `POST` are one request (C3).
    pub fn method(mut self, method: &str) -> Self {
        self.method = method.to_ascii_uppercase().into_bytes();
        self
    }

    /// The request's `Content-Type` (C3): the same bytes as JSON and as a form are two requests.
    /// Only its [`media_type`] counts: `Application/JSON; charset=utf-8` is `application/json`.
    /// No `Content-Type` (not calling it) is a request of its own too.
    ///
    /// ```
    /// use idem_core::Fingerprint;
    /// let body = b"amount=100&currency=usd";
    /// let form = Fingerprint::builder().media_type("application/x-www-form-urlencoded").body(body).finish();
    /// let json = Fingerprint::builder().media_type("application/json").body(body).finish();
    /// let same = Fingerprint::builder().media_type("Application/X-WWW-Form-Urlencoded; charset=UTF-8").body(body).finish();
    /// assert_ne!(form, json);
    /// assert_eq!(form, same);
    /// ```
    pub fn media_type(mut self, content_type: &str) -> Self {
        self.media_type = media_type(content_type);
        self
    }

    /// The concrete path and query (`/customers/cus_A/refunds?notify=1`), not a route template.
    pub fn path(mut self, path: &str) -> Self {
        self.path = path.as_bytes().to_vec();
        self
    }

    /// A header that is part of the request's meaning. Names are case-insensitive; the order
    /// of different names does not matter, the order of one name's field lines does (RFC 9110
    /// §5.3: they are a list).
    pub fn header(mut self, name: &str, value: &[u8]) -> Self {
        self.headers
            .push((name.to_ascii_lowercase(), value.to_vec()));
        self
    }

    /// The raw body bytes.
    pub fn body(self, body: &'a [u8]) -> Self {
        self.in_domain(body, Domain::Raw)
    }

    /// A JSON body already made canonical (idem-tower's `canonical::canonical_json`), hashed in
    /// a domain of its own (C3). The bytes are hashed as given, unchecked.
    ///
    /// ```
    /// use idem_core::Fingerprint;
    /// let canonical = br#"{"amount":100}"#;
    /// let json = Fingerprint::builder().canonical_json(canonical).finish();
    /// let form = Fingerprint::builder().canonical_form(canonical).finish();
    /// let raw = Fingerprint::builder().body(canonical).finish();
    /// assert_ne!(json, raw);
    /// assert_ne!(json, form);
    /// ```
    pub fn canonical_json(self, canonical: &'a [u8]) -> Self {
        self.in_domain(canonical, Domain::Json)
    }

    /// A form body already made canonical (idem-tower's `canonical::canonical_form`), as
    /// [`canonical_json`](Self::canonical_json).
    pub fn canonical_form(self, canonical: &'a [u8]) -> Self {
        self.in_domain(canonical, Domain::Form)
    }

    pub(crate) fn in_domain(mut self, body: &'a [u8], domain: Domain) -> Self {
        self.body = body;
        self.domain = domain;
        self
    }

    /// Computes the digest.
    pub fn finish(mut self) -> Fingerprint {
        // By name only, and stable: one name's values keep the order they came in.
        self.headers.sort_by(|a, b| a.0.cmp(&b.0));
        let mut hasher = DERIVATION.clone();
        part(&mut hasher, b'M', &self.method);
        part(&mut hasher, b'P', &self.path);
        // Only when named, so that requests without a `Content-Type` keep their digest.
        if !self.media_type.is_empty() {
            part(&mut hasher, b'T', self.media_type.as_bytes());
        }
        hasher.update(b"H");
        hasher.update(&(self.headers.len() as u64).to_le_bytes());
        for (name, value) in &self.headers {
            part(&mut hasher, b'N', name.as_bytes());
            part(&mut hasher, b'V', value);
        }
        // A canonical body and raw bytes that happen to equal it are different requests.
        part(&mut hasher, self.domain.tag(), self.body);
        Fingerprint(*hasher.finalize().as_bytes())
    }
}

/// The media type of a `Content-Type` value as the fingerprint counts it (C3): `type/subtype`,
/// trimmed and in lower case, without parameters.
///
/// ```
/// assert_eq!(idem_core::media_type(" Application/JSON; charset=UTF-8"), "application/json");
/// ```
pub fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim_matches([' ', '\t'])
        .to_ascii_lowercase()
}

fn part(hasher: &mut blake3::Hasher, tag: u8, bytes: &[u8]) {
    hasher.update(&[tag]);
    hasher.update(&(bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(method: &str, route: &str, body: &[u8]) -> Fingerprint {
        Fingerprint::builder()
            .method(method)
            .path(route)
            .body(body)
            .finish()
    }

    #[test]
    fn c03_parts_are_length_prefixed_so_shifted_boundaries_differ() {
        assert_ne!(fp("POST", "/ab", b"c"), fp("POST", "/a", b"bc"));
        assert_ne!(fp("POS", "T/a", b""), fp("POST", "/a", b""));
        assert_ne!(fp("POST", "/a", b""), fp("PUT", "/a", b""));
        let canonical = Fingerprint::builder()
            .canonical_json(br#"{"a":2,"b":1}"#)
            .finish();
        let raw = Fingerprint::builder().body(br#"{"a":2,"b":1}"#).finish();
        assert_ne!(
            canonical, raw,
            "canonical JSON and raw bytes are separate domains"
        );
    }

    #[test]
    fn c03_named_headers_count_and_are_order_and_case_insensitive() {
        let base = Fingerprint::builder().method("POST").path("/a");
        let x = base
            .clone()
            .header("X-Tenant", b"1")
            .header("x-mode", b"live")
            .finish();
        let y = base
            .clone()
            .header("x-mode", b"live")
            .header("x-tenant", b"1")
            .finish();
        let z = base
            .clone()
            .header("x-tenant", b"2")
            .header("x-mode", b"live")
            .finish();
        assert_eq!(x, y);
        assert_ne!(x, z);
        assert_ne!(x, base.finish());
    }

    #[test]
    fn c03_the_method_is_normalised() {
        assert_eq!(fp("post", "/a", b"x"), fp("POST", "/a", b"x"));
        assert_eq!(fp("Post", "/a", b"x"), fp("POST", "/a", b"x"));
    }

    #[test]
    fn c03_the_media_type_counts_and_its_spelling_does_not() {
        let with = |ct: &str| {
            Fingerprint::builder()
                .method("POST")
                .path("/a")
                .media_type(ct)
                .body(b"amount=100")
                .finish()
        };
        assert_ne!(
            with("application/json"),
            with("application/x-www-form-urlencoded")
        );
        assert_eq!(
            with("application/json"),
            with(" Application/JSON ;charset=utf-8")
        );
        assert_eq!(with("text/plain; a=1; b=2"), with("text/plain; b=2; a=1"));
        assert_ne!(with("application/json"), fp("POST", "/a", b"amount=100"));
        // No Content-Type: the digest of a request built before media types counted.
        assert_eq!(with(""), fp("POST", "/a", b"amount=100"));
    }

    #[test]
    fn c03_canonical_forms_and_raw_bytes_are_separate_domains() {
        let form = Fingerprint::builder().canonical_form(b"a=1&b=2").finish();
        let json = Fingerprint::builder().canonical_json(b"a=1&b=2").finish();
        let raw = Fingerprint::builder().body(b"a=1&b=2").finish();
        assert_ne!(form, raw);
        assert_ne!(form, json);
    }

    #[test]
    fn corrupt_stored_fingerprint_is_typed() {
        assert!(matches!(
            Fingerprint::from_slice(&[0; 31]),
            Err(Error::CorruptRecord(_))
        ));
        assert!(Fingerprint::from_slice(&[0; 32]).is_ok());
    }
}
