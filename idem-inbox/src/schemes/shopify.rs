//! Shopify's scheme: `X-Shopify-Hmac-Sha256: <base64>`, the standard base64 HMAC-SHA256 of the
//! raw body under the app's client secret (or the store's webhook signing key), its bytes as
//! shown; the topic in `X-Shopify-Topic`. Only the body is signed, and there is no signed
//! timestamp (`X-Shopify-Triggered-At` is not covered by the HMAC): a captured delivery
//! verifies forever, under any headers. docs/inbox.md, "Shopify".
//!
//! **The key** is `<X-Shopify-Topic> <blake3 hex of the raw body>`, derived from what the
//! signature covers. Shopify's retries (8 over 4 hours) re-send the original payload, so they
//! are duplicates, and so is a captured delivery replayed under fresh id headers, which are
//! not signed. Shopify's own sources disagree on the id to deduplicate on: its "Ignore
//! duplicate webhooks" guide names `X-Shopify-Event-Id` (the same across the webhooks of one
//! event, so also across distinct deliveries of one merchant action, one per subscription),
//! while other material has `X-Shopify-Webhook-Id` stay or change across retries; neither is
//! signed, so neither is the key. The topic is part of the key, so that one payload announced
//! under two topics is two events; a replayer can therefore make one run per topic it sends
//! (the header is not signed): only Shopify's spelling is accepted (lowercase letters, digits,
//! `_`, `/`, `.`), and handlers act on the topics they subscribed to only, their meaning taken
//! from the verified body.
//! `X-Shopify-Event-Id`, when sent, is kept as [`VerifiedEvent::delivery_id`], for logs and
//! audit.

use crate::body_signed::{body_key, event_name, verify_body_signature};
use crate::headers::{event_id, required, single, Headers};
use crate::mac::{decode_base64_mac, split_secrets, to_base64, Keys, MAC_LEN};
use crate::scheme::{VerifiedEvent, WebhookScheme};
use crate::signature::SignatureError;
use idem_core::Error;
#[cfg(any(doc, test))]
use idem_core::Field;
use idem_signature::debug_without_secrets;

/// The signature header.
pub const SHOPIFY_HMAC_HEADER: &str = "x-shopify-hmac-sha256";
/// Shopify's event id: for logs and audit, not the key (it is not signed, and it is shared by
/// the deliveries of one merchant action).
pub const SHOPIFY_EVENT_ID_HEADER: &str = "x-shopify-event-id";
/// The topic (`orders/create`, `orders/paid`, ...): the first part of the key.
pub const SHOPIFY_TOPIC_HEADER: &str = "x-shopify-topic";

/// The secrets of one Shopify app (or store webhook): one, or the new and the old while the
/// client secret is rotated. `Debug` never shows a secret.
///
/// ```
/// use idem_inbox::{ShopifyScheme, WebhookScheme};
/// let scheme = ShopifyScheme::new(["shpss_secret"])?;
/// let body = br#"{"id":820982911946154508}"#;
/// let hmac = scheme.sign(body);
/// let headers = [
///     ("X-Shopify-Hmac-Sha256", hmac.as_str()),
///     ("X-Shopify-Event-Id", "98880550-7158-44d4-b7cd-2c97c8a091b5"),
///     ("X-Shopify-Topic", "orders/paid"),
/// ];
/// let event = scheme.verify(&headers, body, 0)?;
/// assert!(event.event_id().is_some_and(|key| key.starts_with("orders/paid ")));
/// assert_eq!(event.event_type(), Some("orders/paid"));
/// assert_eq!(event.delivery_id(), Some("98880550-7158-44d4-b7cd-2c97c8a091b5"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct ShopifyScheme {
    keys: Keys,
}

debug_without_secrets!(ShopifyScheme);

impl ShopifyScheme {
    /// A scheme with `secrets` (their bytes are the HMAC keys; the first one signs in
    /// [`sign`](Self::sign)). [`Error::InvalidInput`] on [`Field::Config`] when there is none
    /// or one is empty. Any non-empty secret is accepted: it is the one Shopify shows; a key of
    /// your own choosing should be random and at least 32 bytes long.
    ///
    /// ```
    /// use idem_inbox::ShopifyScheme;
    /// assert!(ShopifyScheme::new(["shpss_a", "shpss_b"]).is_ok());
    /// assert!(ShopifyScheme::new(Vec::<&str>::new()).is_err());
    /// ```
    pub fn new(secrets: impl IntoIterator<Item = impl AsRef<[u8]>>) -> Result<Self, Error> {
        Ok(Self {
            keys: Keys::new(secrets, "Shopify webhook secret")?,
        })
    }

    /// A scheme from a comma-separated list (`"new, old"`), spaces around each trimmed, empty
    /// items skipped (a secret holding a comma or surrounding spaces must be given to
    /// [`new`](Self::new)).
    ///
    /// ```
    /// use idem_inbox::ShopifyScheme;
    /// let a = ShopifyScheme::from_comma_separated("new, old")?;
    /// assert_eq!(a.sign(b"x"), ShopifyScheme::new(["new"])?.sign(b"x"));
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn from_comma_separated(secrets: &str) -> Result<Self, Error> {
        Self::new(split_secrets(secrets))
    }

    /// The `X-Shopify-Hmac-Sha256` value Shopify would send for `body` under the first
    /// secret: 44 characters of standard, padded base64. For tests and fixtures.
    ///
    /// ```
    /// use idem_inbox::ShopifyScheme;
    /// let hmac = ShopifyScheme::new(["hush"])?.sign(b"{}");
    /// assert_eq!(hmac.len(), 44);
    /// assert!(hmac.ends_with('='));
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn sign(&self, body: &[u8]) -> String {
        to_base64(&self.keys.first_mac(&[body]))
    }
}

impl WebhookScheme for ShopifyScheme {
    fn name(&self) -> &'static str {
        "shopify"
    }

    /// Checks `X-Shopify-Hmac-Sha256` (required: 44 characters of standard padded base64)
    /// against the body under every secret, then reads `X-Shopify-Topic` (required) and
    /// `X-Shopify-Event-Id` (optional), both without blanks and at most
    /// [`MAX_EVENT_ID_LEN`](crate::signature::MAX_EVENT_ID_LEN) bytes, the topic in Shopify's
    /// spelling (lowercase letters, digits, `_`, `/`, `.`). The event id is
    /// `<topic> <blake3 hex of the body>`, its type the topic, the delivery id
    /// `X-Shopify-Event-Id`. `now_unix` is unused: Shopify signs no time.
    fn verify(
        &self,
        headers: &dyn Headers,
        body: &[u8],
        _now_unix: i64,
    ) -> Result<VerifiedEvent, SignatureError> {
        verify_body_signature(&self.keys, headers, SHOPIFY_HMAC_HEADER, decode, body)?;
        let topic = event_name(required(headers, SHOPIFY_TOPIC_HEADER)?, |b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'/' | b'.')
        })?;
        let delivery = single(headers, SHOPIFY_EVENT_ID_HEADER)?
            .filter(|id| !id.is_empty())
            .map(event_id)
            .transpose()?;
        Ok(
            VerifiedEvent::new(Some(body_key(&topic, body)), Some(topic), None)
                .with_delivery_id(delivery),
        )
    }
}

/// 44 characters of standard padded base64 into the MAC.
fn decode(value: &str) -> Result<[u8; MAC_LEN], SignatureError> {
    decode_base64_mac(value).ok_or(SignatureError::Malformed(
        "no signature of 44 characters of base64",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    // Shopify publishes no test vector. This one was computed on this machine with OpenSSL,
    // an implementation independent of this crate:
    //   printf '%s' '{"id":820982911946154508,"email":"jon@example.com","total_price":"598.94"}' \
    //     | openssl dgst -sha256 -hmac 'shpss_0123456789abcdef' -binary | base64
    const SECRET: &str = "shpss_0123456789abcdef";
    const BODY: &[u8] =
        br#"{"id":820982911946154508,"email":"jon@example.com","total_price":"598.94"}"#;
    const OPENSSL_HMAC: &str = "rnO4XcrgmH780hciWvCkvyRkkXJb7ShA7J0ABF8/SMQ=";
    const EVENT: &str = "98880550-7158-44d4-b7cd-2c97c8a091b5";
    /// The key of `BODY` under `orders/paid`: the blake3 hex of the body computed independently
    /// of this crate with the Python `blake3` package (1.0.11):
    ///   python3 -c 'import blake3; print(blake3.blake3(BODY).hexdigest())'
    const KEY: &str =
        "orders/paid 7dff610ab13551cc414726639b775367cdfdddbf438ff3246e213033a356f90b";

    fn headers(hmac: &str) -> Vec<(&'static str, String)> {
        vec![
            ("X-Shopify-Hmac-Sha256", hmac.to_owned()),
            ("X-Shopify-Event-Id", EVENT.to_owned()),
            ("X-Shopify-Topic", "orders/paid".to_owned()),
            (
                "X-Shopify-Webhook-Id",
                "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043".to_owned(),
            ),
        ]
    }

    fn malformed(reason: &'static str) -> Result<VerifiedEvent, SignatureError> {
        Err(SignatureError::Malformed(reason))
    }

    #[test]
    fn an_hmac_computed_by_openssl_verifies_and_sign_reproduces_it() -> TestResult {
        let scheme = ShopifyScheme::new([SECRET])?;
        assert_eq!(scheme.sign(BODY), OPENSSL_HMAC);
        let event = scheme.verify(&headers(OPENSSL_HMAC), BODY, 0)?;
        assert_eq!(event.event_id(), Some(KEY));
        assert_eq!(event.event_type(), Some("orders/paid"));
        assert_eq!(event.delivery_id(), Some(EVENT));
        assert_eq!(event.signed_at(), None);
        Ok(())
    }

    /// `headers()` with `name` set to `value` (or removed when `None`).
    fn replaced(name: &'static str, value: Option<&str>) -> Vec<(&'static str, String)> {
        let mut h = headers(OPENSSL_HMAC);
        h.retain(|(n, _)| *n != name);
        if let Some(value) = value {
            h.push((name, value.to_owned()));
        }
        h
    }

    #[test]
    fn the_key_is_the_topic_and_the_body_never_an_unsigned_id() -> TestResult {
        let scheme = ShopifyScheme::new([SECRET])?;
        // The same signed body under another event id, another webhook id, or none: the same
        // key (a retry or a replay is a duplicate); the event id is still reported.
        for (name, value) in [
            ("X-Shopify-Event-Id", Some("another-event")),
            ("X-Shopify-Event-Id", None),
            ("X-Shopify-Webhook-Id", Some("another-webhook")),
        ] {
            let event = scheme.verify(&replaced(name, value), BODY, 0)?;
            assert_eq!(event.event_id(), Some(KEY), "{name}: {value:?}");
        }
        assert_eq!(
            scheme
                .verify(&replaced("X-Shopify-Event-Id", Some("e-2")), BODY, 0)?
                .delivery_id(),
            Some("e-2")
        );
        assert_eq!(
            scheme
                .verify(&replaced("X-Shopify-Event-Id", None), BODY, 0)?
                .delivery_id(),
            None
        );
        // The same body under another topic is another key: one run per distinct topic.
        assert_eq!(
            scheme
                .verify(&replaced("X-Shopify-Topic", Some("orders/create")), BODY, 0)?
                .event_id(),
            Some(KEY.replacen("orders/paid", "orders/create", 1).as_str())
        );
        Ok(())
    }

    /// Reproduces the replay of a captured delivery through the inbox: one signed body posted
    /// under new event ids and webhook ids runs its effect once.
    #[tokio::test]
    async fn a_replay_under_new_event_ids_is_a_duplicate_with_no_second_effect() -> TestResult {
        use crate::{Ack, Delivery, Inbox, Receipt};
        use idem_core::{Idempotency, MemoryStore};
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;

        let scheme = ShopifyScheme::new([SECRET])?;
        let inbox = Inbox::new(Idempotency::new(MemoryStore::new()));
        let effects = Arc::new(AtomicUsize::new(0));
        let mut receipts = Vec::new();
        for n in 0..3 {
            let mut h = replaced("X-Shopify-Event-Id", Some(&format!("event-{n}")));
            h.retain(|(name, _)| *name != "X-Shopify-Webhook-Id");
            h.push(("X-Shopify-Webhook-Id", format!("webhook-{n}")));
            let (delivery, verified) = Delivery::verify_with(&scheme, "shopify", &h, BODY, 0)?;
            let id = verified.event_id().ok_or("a key")?;
            let event = inbox.event_json(&delivery, id.as_bytes(), &[])?;
            let effects = Arc::clone(&effects);
            receipts.push(
                inbox
                    .receive(&event, move |_ctx| async move {
                        effects.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::io::Error>(Ack::Done)
                    })
                    .await?,
            );
        }
        assert_eq!(effects.load(Ordering::SeqCst), 1);
        assert!(matches!(receipts.first(), Some(Receipt::Processed(_))));
        assert!(receipts
            .iter()
            .skip(1)
            .all(|r| matches!(r, Receipt::Duplicate(_))));
        Ok(())
    }

    #[test]
    fn another_body_or_secret_is_a_mismatch() -> TestResult {
        let scheme = ShopifyScheme::new([SECRET])?;
        let mut body = BODY.to_vec();
        body.push(b' ');
        assert_eq!(
            scheme.verify(&headers(OPENSSL_HMAC), &body, 0),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            ShopifyScheme::new(["shpss_other"])?.verify(&headers(OPENSSL_HMAC), BODY, 0),
            Err(SignatureError::Mismatch)
        );
        Ok(())
    }

    #[test]
    fn rotation_accepts_the_old_and_the_new_secret_and_refuses_a_rotated_out_one() -> TestResult {
        let receiver = ShopifyScheme::from_comma_separated("shpss_new, shpss_old")?;
        for sender in ["shpss_new", "shpss_old"] {
            let hmac = ShopifyScheme::new([sender])?.sign(BODY);
            assert!(
                receiver.verify(&headers(&hmac), BODY, 0).is_ok(),
                "{sender}"
            );
        }
        let old = ShopifyScheme::new(["shpss_old"])?.sign(BODY);
        assert_eq!(
            ShopifyScheme::new(["shpss_new"])?.verify(&headers(&old), BODY, 0),
            Err(SignatureError::Mismatch)
        );
        Ok(())
    }

    #[test]
    fn malformed_signatures_are_refused() -> TestResult {
        let scheme = ShopifyScheme::new([SECRET])?;
        let hex = "a".repeat(64);
        let cases: Vec<(String, &'static str)> = vec![
            (String::new(), "empty header"),
            // Not base64; unpadded; hex instead of base64; URL-safe alphabet; a prefix.
            (
                "not base64 at all!".to_owned(),
                "no signature of 44 characters of base64",
            ),
            (
                OPENSSL_HMAC.trim_end_matches('=').to_owned(),
                "no signature of 44 characters of base64",
            ),
            (hex, "no signature of 44 characters of base64"),
            (
                format!("sha256={OPENSSL_HMAC}"),
                "no signature of 44 characters of base64",
            ),
            (
                format!("{}\u{e9}", &OPENSSL_HMAC[..42]),
                "header is not visible ASCII",
            ),
            ("A".repeat(9000), "header too long"),
        ];
        for (signature, reason) in cases {
            assert_eq!(
                scheme.verify(&headers(&signature), BODY, 0),
                malformed(reason),
                "{signature:?}"
            );
        }
        // The vector ends in `Q=`: 2 unused low bits in `Q`; `R` differs only there (the same
        // 32 bytes to a lenient decoder), a non-canonical encoding, refused.
        let non_canonical = OPENSSL_HMAC.replace("MQ=", "MR=");
        assert_ne!(non_canonical, OPENSSL_HMAC);
        assert_eq!(
            scheme.verify(&headers(&non_canonical), BODY, 0),
            malformed("no signature of 44 characters of base64")
        );
        // The vector holds a `/`; in the URL-safe alphabet it is `_`, which is refused.
        let url_safe = OPENSSL_HMAC.replace('/', "_");
        assert_ne!(url_safe, OPENSSL_HMAC);
        assert_eq!(
            scheme.verify(&headers(&url_safe), BODY, 0),
            malformed("no signature of 44 characters of base64")
        );
        Ok(())
    }

    #[test]
    fn missing_signature_or_topic_is_refused_and_the_event_id_is_optional() -> TestResult {
        let scheme = ShopifyScheme::new([SECRET])?;
        assert_eq!(
            scheme.verify(&replaced("X-Shopify-Hmac-Sha256", None), BODY, 0),
            Err(SignatureError::Missing)
        );
        assert_eq!(
            scheme.verify(&replaced("X-Shopify-Topic", None), BODY, 0),
            Err(SignatureError::MissingHeader(SHOPIFY_TOPIC_HEADER))
        );
        assert!(scheme
            .verify(&replaced("X-Shopify-Event-Id", None), BODY, 0)
            .is_ok());
        assert_eq!(
            scheme.verify(&replaced("X-Shopify-Topic", Some("orders paid")), BODY, 0),
            malformed("event id holds a blank")
        );
        Ok(())
    }

    #[test]
    fn configuration_without_a_usable_secret_is_refused_and_debug_hides_secrets() -> TestResult {
        for result in [
            ShopifyScheme::new(Vec::<Vec<u8>>::new()),
            ShopifyScheme::new(["a", ""]),
            ShopifyScheme::from_comma_separated(""),
        ] {
            assert!(matches!(
                result,
                Err(Error::InvalidInput {
                    field: Field::Config,
                    ..
                })
            ));
        }
        let shown = format!("{:?}", ShopifyScheme::new(["shpss_very_secret"])?);
        assert!(!shown.contains("very_secret"), "{shown}");
        Ok(())
    }
}
