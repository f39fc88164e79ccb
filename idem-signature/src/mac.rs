//! HMAC-SHA256 under one or more secrets, as every webhook scheme uses it: keys made once
//! from the configured secrets, a constant-time check of candidates against every key (no early
//! exit), and the hex and base64 forms senders put in their headers.

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use idem_core::{Error, Field};

/// HMAC-SHA256.
pub type HmacSha256 = Hmac<Sha256>;

/// The length of an HMAC-SHA256 in bytes.
pub const MAC_LEN: usize = 32;

/// Standard base64 (RFC 4648 §4) that accepts the padding or its absence and non-zero unused
/// bits in the last character: for secrets, read as leniently as the Standard Webhooks
/// reference Python library reads them (some dashboards show them without padding).
const STANDARD_ANY_PADDING: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// One HMAC state per secret, already keyed; never empty. `Debug` shows how many, never one.
#[derive(Clone)]
pub struct Keys(Vec<HmacSha256>);

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("secrets", &self.0.len())
            .finish()
    }
}

impl Keys {
    /// Keys for `secrets` (raw key bytes). [`Error::InvalidInput`] on [`Field::Config`] when
    /// there is none or one is empty; `what` names the secrets in the message.
    pub fn new(
        secrets: impl IntoIterator<Item = impl AsRef<[u8]>>,
        what: &str,
    ) -> Result<Self, Error> {
        let mut keys = Vec::new();
        for secret in secrets {
            let secret = secret.as_ref();
            if secret.is_empty() {
                return Err(Error::invalid(Field::Config, format!("a {what} is empty")));
            }
            // HMAC accepts keys of any length; the error branch is unreachable in practice.
            let key = HmacSha256::new_from_slice(secret)
                .map_err(|_| Error::invalid(Field::Config, format!("a {what} is unusable")))?;
            keys.push(key);
        }
        if keys.is_empty() {
            return Err(Error::invalid(
                Field::Config,
                format!("at least one {what} is required"),
            ));
        }
        Ok(Self(keys))
    }

    /// How many secrets.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never: a `Keys` holds at least one secret (for the convention that `len` comes with it).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The MAC of the concatenated `parts` under every key, in order.
    pub fn macs(&self, parts: &[&[u8]]) -> Vec<[u8; MAC_LEN]> {
        self.0.iter().map(|key| mac_of(key, parts)).collect()
    }

    /// The MAC of the concatenated `parts` under the first key.
    pub fn first_mac(&self, parts: &[&[u8]]) -> [u8; MAC_LEN] {
        // Never empty (checked in `new`); `take(1)` keeps this free of indexing.
        self.0
            .iter()
            .take(1)
            .map(|key| mac_of(key, parts))
            .next()
            .unwrap_or([0; MAC_LEN])
    }

    /// Whether any of `candidates` is the MAC of the concatenated `parts` under any key. Every
    /// candidate is checked against every key in constant time, without stopping at a match:
    /// the time taken does not tell which secret or candidate matched, nor how many bytes of a
    /// forgery were right.
    pub fn any_matches(&self, parts: &[&[u8]], candidates: &[[u8; MAC_LEN]]) -> bool {
        let mut matched = false;
        for key in &self.0 {
            let mut mac = key.clone();
            for part in parts {
                mac.update(part);
            }
            for candidate in candidates {
                // `verify_slice` compares in constant time.
                matched |= mac.clone().verify_slice(candidate).is_ok();
            }
        }
        matched
    }
}

/// `impl Debug` for a scheme holding its secrets in a `keys: Keys` field: shows how many
/// secrets, never one, and the named plain fields.
#[doc(hidden)]
#[macro_export]
macro_rules! debug_without_secrets {
    ($scheme:ident $(, $field:ident)*) => {
        impl std::fmt::Debug for $scheme {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($scheme))
                    .field("secrets", &self.keys.len())
                    $(.field(stringify!($field), &self.$field))*
                    .finish()
            }
        }
    };
}

/// The MAC of the concatenated `parts` under `key`.
fn mac_of(key: &HmacSha256, parts: &[&[u8]]) -> [u8; MAC_LEN] {
    let mut mac = key.clone();
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

/// Splits a comma-separated list of secrets as kept in one environment variable: spaces
/// around each are trimmed, empty items skipped.
pub fn split_secrets(secrets: &str) -> impl Iterator<Item = &str> {
    secrets
        .split(',')
        .map(str::trim)
        .filter(|secret| !secret.is_empty())
}

/// `mac` as lowercase hex.
pub fn to_hex(mac: &[u8]) -> String {
    mac.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// 64 hex digits (either case) into 32 bytes.
pub fn decode_hex_mac(value: &str) -> Option<[u8; MAC_LEN]> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let bytes = value.as_bytes();
    if bytes.len() != 2 * MAC_LEN {
        return None;
    }
    let mut out = [0u8; MAC_LEN];
    for (slot, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        let (hi, lo) = match pair {
            [hi, lo] => (nibble(*hi)?, nibble(*lo)?),
            _ => return None,
        };
        *slot = (hi << 4) | lo;
    }
    Some(out)
}

/// `mac` in standard base64 with padding (44 characters for 32 bytes).
pub fn to_base64(mac: &[u8]) -> String {
    STANDARD.encode(mac)
}

/// Standard padded base64 of exactly 32 bytes (44 characters) into the bytes; anything else
/// (another alphabet, no padding, another length, a byte that is not base64) is `None`.
pub fn decode_base64_mac(value: &str) -> Option<[u8; MAC_LEN]> {
    // 32 bytes are 44 characters; refusing other lengths first bounds the work.
    if value.len() != 44 {
        return None;
    }
    let mut out = [0u8; MAC_LEN];
    match STANDARD.decode_slice(value, &mut out) {
        Ok(MAC_LEN) => Some(out),
        _ => None,
    }
}

/// Standard base64, padded or not, into bytes (for secrets).
pub fn decode_base64_secret(value: &str) -> Option<Vec<u8>> {
    STANDARD_ANY_PADDING.decode(value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_decoder_roundtrips_and_refuses_junk() {
        let hex: String = (0u8..32).map(|b| format!("{b:02x}")).collect();
        let expected: Vec<u8> = (0u8..32).collect();
        assert_eq!(
            decode_hex_mac(&hex).map(|a| a.to_vec()),
            Some(expected.clone())
        );
        assert_eq!(to_hex(&expected), hex);
        assert_eq!(
            decode_hex_mac(&hex.to_ascii_uppercase()).map(|a| a.to_vec()),
            Some(expected)
        );
        assert_eq!(decode_hex_mac(&hex[..62]), None);
        assert_eq!(decode_hex_mac(&format!("{}g", &hex[..63])), None);
        // 64 bytes but not 64 ASCII characters.
        assert_eq!(decode_hex_mac(&format!("{}\u{e9}", &hex[..62])), None);
    }

    #[test]
    fn base64_mac_decoder_takes_exactly_32_padded_standard_bytes() {
        let mac: Vec<u8> = (0u8..32).collect();
        let text = to_base64(&mac);
        assert_eq!(text.len(), 44);
        assert_eq!(
            decode_base64_mac(&text).map(|a| a.to_vec()),
            Some(mac.clone())
        );
        // Unpadded, URL-safe alphabet, one byte short, junk, non-ASCII: refused.
        assert_eq!(decode_base64_mac(text.trim_end_matches('=')), None);
        let url_safe = to_base64(&[0xfb; 32]).replace('+', "-").replace('/', "_");
        assert_eq!(decode_base64_mac(&url_safe), None);
        assert_eq!(decode_base64_mac(&to_base64(&[0u8; 31])), None);
        assert_eq!(decode_base64_mac(&"*".repeat(44)), None);
        assert_eq!(decode_base64_mac(&format!("{}\u{e9}", &text[..42])), None);
    }

    #[test]
    fn secrets_decode_with_or_without_padding() {
        assert_eq!(decode_base64_secret("YWI="), Some(b"ab".to_vec()));
        assert_eq!(decode_base64_secret("YWI"), Some(b"ab".to_vec()));
        assert_eq!(decode_base64_secret("not base64!"), None);
    }

    #[test]
    fn a_match_under_any_key_counts_and_nothing_else_does() -> Result<(), Error> {
        let keys = Keys::new(["new", "old"], "secret")?;
        let old = Keys::new(["old"], "secret")?.first_mac(&[b"a", b".", b"b"]);
        assert!(keys.any_matches(&[b"a.b"], &[[0; MAC_LEN], old]));
        assert!(!keys.any_matches(&[b"a.c"], &[old]));
        assert!(!keys.any_matches(&[b"a.b"], &[]));
        assert_eq!(keys.macs(&[b"a.b"]).get(1), Some(&old));
        assert_eq!(keys.len(), 2);
        Ok(())
    }

    #[test]
    fn no_secret_or_an_empty_one_is_a_configuration_error() {
        for result in [
            Keys::new(Vec::<Vec<u8>>::new(), "secret"),
            Keys::new([""], "secret"),
            Keys::new(["a", ""], "secret"),
        ] {
            assert!(matches!(
                result,
                Err(Error::InvalidInput {
                    field: Field::Config,
                    ..
                })
            ));
        }
    }
}
