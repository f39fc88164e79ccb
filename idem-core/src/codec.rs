//! The stored form of a response (C12), big-endian: `b'I'`, version `1`, status `u16`, header
//! count `u16`, per header name length `u16`, name, value length `u32`, value; body length
//! `u32`, body. Trailing or missing bytes are corruption.

use crate::error::{Error, Field};
use crate::response::StoredResponse;

const MAGIC: u8 = b'I';
const VERSION: u8 = 1;

impl StoredResponse {
    /// Encodes the response for storage.
    ///
    /// ```
    /// use idem_core::StoredResponse;
    /// let resp = StoredResponse::new(402, "declined").with_header("content-type", "text/plain");
    /// assert_eq!(StoredResponse::decode(&resp.encode()?)?, resp);
    /// assert!(StoredResponse::decode(b"garbage").is_err());
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        let too_big =
            |what: &str| Error::invalid(Field::Response, format!("{what} too large to store"));
        let mut out = Vec::with_capacity(16 + self.body.len());
        out.extend([MAGIC, VERSION]);
        out.extend(self.status.to_be_bytes());
        let count = u16::try_from(self.headers.len()).map_err(|_| too_big("header count"))?;
        out.extend(count.to_be_bytes());
        for (name, value) in &self.headers {
            let n = u16::try_from(name.len()).map_err(|_| too_big("header name"))?;
            out.extend(n.to_be_bytes());
            out.extend(name.as_bytes());
            let v = u32::try_from(value.len()).map_err(|_| too_big("header value"))?;
            out.extend(v.to_be_bytes());
            out.extend(value);
        }
        let b = u32::try_from(self.body.len()).map_err(|_| too_big("body"))?;
        out.extend(b.to_be_bytes());
        out.extend(&self.body);
        Ok(out)
    }

    /// The status, from the first [`STATUS_PREFIX_LEN`](Self::STATUS_PREFIX_LEN) bytes.
    ///
    /// ```
    /// use idem_core::StoredResponse;
    /// let encoded = StoredResponse::new(402, "declined").encode()?;
    /// assert_eq!(StoredResponse::status_of(&encoded[..StoredResponse::STATUS_PREFIX_LEN])?, 402);
    /// assert!(StoredResponse::status_of(b"IX").is_err());
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn status_of(encoded: &[u8]) -> Result<u16, Error> {
        let mut r = Reader::new("stored response", encoded);
        if r.take(2)? != [MAGIC, VERSION] {
            return Err(corrupt("unknown magic or version"));
        }
        let status = u16::from_be_bytes(r.array()?);
        if !(100..=599).contains(&status) {
            return Err(corrupt(format!("status {status}")));
        }
        Ok(status)
    }

    /// How many leading bytes of an encoded response [`StoredResponse::status_of`] needs.
    pub const STATUS_PREFIX_LEN: usize = 4;

    /// Decodes a stored response; anything malformed is [`Error::CorruptRecord`], never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        let status = Self::status_of(bytes)?;
        let rest = bytes.get(Self::STATUS_PREFIX_LEN..).unwrap_or_default();
        let mut r = Reader::new("stored response", rest);
        let count = u16::from_be_bytes(r.array()?);
        let mut headers = Vec::with_capacity(usize::from(count).min(64));
        for _ in 0..count {
            let n = usize::from(u16::from_be_bytes(r.array()?));
            let name = std::str::from_utf8(r.take(n)?)
                .map_err(|_| corrupt("header name is not UTF-8"))?
                .to_owned();
            let v = u32::from_be_bytes(r.array()?) as usize;
            headers.push((name, r.take(v)?.to_vec()));
        }
        let b = u32::from_be_bytes(r.array()?) as usize;
        let body = r.take(b)?.to_vec();
        if !r.rest.is_empty() {
            return Err(corrupt(format!("{} trailing bytes", r.rest.len())));
        }
        Ok(Self {
            status,
            headers,
            body,
        })
    }
}

fn corrupt(why: impl Into<String>) -> Error {
    Error::CorruptRecord(format!("stored response: {}", why.into()))
}

/// Reads a stored form front to back; running short is corruption of `what`.
pub(crate) struct Reader<'a> {
    pub(crate) rest: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(what: &'static str, bytes: &'a [u8]) -> Self {
        Self { rest: bytes, what }
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        let what = self.what;
        let (head, rest) = self
            .rest
            .split_at_checked(n)
            .ok_or_else(|| Error::CorruptRecord(format!("{what}: truncated")))?;
        self.rest = rest;
        Ok(head)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], Error> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn c12_decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = StoredResponse::decode(&bytes);
        }

        #[test]
        fn c12_truncated_or_extended_encodings_are_corrupt(status in 100u16..600, body in proptest::collection::vec(any::<u8>(), 0..64), cut in 0usize..80) {
            let enc = StoredResponse::new(status, body).with_header("content-type", "x").encode().expect("encodes");
            let cut = cut.min(enc.len() - 1);
            prop_assert!(matches!(StoredResponse::decode(&enc[..cut]), Err(Error::CorruptRecord(_))));
            let mut longer = enc.clone();
            longer.push(0);
            prop_assert!(matches!(StoredResponse::decode(&longer), Err(Error::CorruptRecord(_))));
        }

        #[test]
        fn round_trip(status in 100u16..600, body in proptest::collection::vec(any::<u8>(), 0..64), v in proptest::collection::vec(any::<u8>(), 0..16)) {
            let resp = StoredResponse::new(status, body).with_header("etag", v);
            prop_assert_eq!(StoredResponse::decode(&resp.encode().expect("encodes")).expect("decodes"), resp);
        }
    }
}
