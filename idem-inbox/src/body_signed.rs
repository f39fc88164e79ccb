//! What the schemes that sign the raw body only (GitHub, Shopify) share: the check of their one
//! signature header against the body under every secret, and the inbox key derived from what
//! that signature covers.
//!
//! Their id headers (`X-GitHub-Delivery`, `X-Shopify-Event-Id`, `X-Shopify-Webhook-Id`) are not
//! signed: a captured delivery replayed under fresh ids would verify and, keyed on those ids,
//! run its effect again each time. The key is therefore `<event name> <blake3 hex of the raw
//! body>`: the sender's redeliveries and retries re-send the same bytes (a duplicate), and a
//! replayed capture is a duplicate too, whatever ids it carries. The event name (`X-GitHub-Event`,
//! `X-Shopify-Topic`) is not signed either; it is part of the key so that one body announced
//! under two names (a Shopify order created paid: `orders/create`, `orders/paid`) is two
//! events. A replayer can therefore make one run per name it sends: names are held to the
//! sender's own spelling ([`event_name`]: no case or spelling variants of a name that a
//! handler might take loosely), and a handler acts on the names it subscribed to only,
//! ignoring any other.

use super::headers::{event_id, single, Headers};
use super::mac::{Keys, MAC_LEN};
use super::signature::SignatureError;

/// Checks the signature in header `name` against the raw `body` under every key of `keys`.
/// [`SignatureError::Missing`] without the header, `Malformed("empty header")` when it is
/// empty, what `decode` says when its value is not a MAC in the sender's encoding, and
/// [`SignatureError::Mismatch`] when it is not the body's MAC under any key.
pub(crate) fn verify_body_signature(
    keys: &Keys,
    headers: &dyn Headers,
    name: &str,
    decode: impl Fn(&str) -> Result<[u8; MAC_LEN], SignatureError>,
    body: &[u8],
) -> Result<(), SignatureError> {
    let signature = match single(headers, name)? {
        None => return Err(SignatureError::Missing),
        Some("") => return Err(SignatureError::Malformed("empty header")),
        Some(signature) => signature,
    };
    let candidate = decode(signature)?;
    if keys.any_matches(&[body], &[candidate]) {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// The event name header's `value`, refused unless every byte is one the sender spells its
/// names with (`spelled`): GitHub's are lowercase letters, digits and `_` (`pull_request`,
/// `projects_v2_item`), Shopify's add `/` and `.` (`orders/create`, `customer.tags_added`).
pub(crate) fn event_name(
    value: &str,
    spelled: impl Fn(u8) -> bool,
) -> Result<String, SignatureError> {
    let name = event_id(value)?;
    if name.is_empty() || !name.bytes().all(spelled) {
        return Err(SignatureError::Malformed(
            "not an event name of this sender",
        ));
    }
    Ok(name)
}

/// The inbox key of a body-signed delivery: `<event name> <64 lowercase hex digits of the
/// blake3 hash of the raw body>` (what `b3sum` prints for the body). The name holds no blank
/// (see `headers::event_id`), so the two parts never run into each other.
pub(crate) fn body_key(event_name: &str, body: &[u8]) -> String {
    format!("{event_name} {}", blake3::hash(body).to_hex())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mac::decode_hex_mac;

    fn hex(value: &str) -> Result<[u8; MAC_LEN], SignatureError> {
        decode_hex_mac(value).ok_or(SignatureError::Malformed("not hex"))
    }

    #[test]
    fn the_key_is_the_name_and_the_bodys_blake3_hex() {
        // blake3 of the empty input, from the BLAKE3 specification's test vectors
        // (github.com/BLAKE3-team/BLAKE3, test_vectors/test_vectors.json, input_len 0).
        assert_eq!(
            body_key("ping", b""),
            "ping af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
        assert_ne!(body_key("ping", b"a"), body_key("ping", b"b"));
        assert_ne!(body_key("push", b"a"), body_key("ping", b"a"));
    }

    #[test]
    fn event_names_are_held_to_the_senders_spelling() {
        let github = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_';
        for name in ["pull_request", "projects_v2_item"] {
            assert_eq!(event_name(name, github).as_deref(), Ok(name));
        }
        for variant in ["Issues", "issues-1", "issues ", "", "issues/x", "issues.x"] {
            assert!(event_name(variant, github).is_err(), "{variant:?}");
        }
    }

    #[test]
    fn the_signature_header_is_required_decoded_and_checked() -> Result<(), idem_core::Error> {
        let keys = Keys::new(["k"], "secret")?;
        let good = crate::mac::to_hex(&keys.first_mac(&[b"body"]));
        let check = |value: &str, body: &[u8]| {
            verify_body_signature(&keys, &[("sig", value)], "sig", hex, body)
        };
        assert_eq!(check(&good, b"body"), Ok(()));
        assert_eq!(check(&good, b"bodY"), Err(SignatureError::Mismatch));
        assert_eq!(
            check("zz", b"body"),
            Err(SignatureError::Malformed("not hex"))
        );
        assert_eq!(
            check("", b"body"),
            Err(SignatureError::Malformed("empty header"))
        );
        let none: [(&str, &str); 0] = [];
        assert_eq!(
            verify_body_signature(&keys, &none, "sig", hex, b"body"),
            Err(SignatureError::Missing)
        );
        Ok(())
    }
}
