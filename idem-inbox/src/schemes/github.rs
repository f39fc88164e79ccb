//! GitHub's scheme: `X-Hub-Signature-256: sha256=<hex>`, the lowercase hex HMAC-SHA256 of the
//! raw body under the webhook's secret (the secret's bytes as typed in GitHub's settings); the
//! event's name in `X-GitHub-Event`, the delivery's GUID in `X-GitHub-Delivery`. Only the body
//! is signed, and there is no timestamp: a captured delivery verifies forever, under any
//! headers. docs/inbox.md, "GitHub".
//!
//! **The key** is `<X-GitHub-Event> <blake3 hex of the raw body>`, derived from what the
//! signature covers: a redelivery (asked for in the settings or through the REST API; GitHub
//! does not redeliver by itself) re-sends the same bytes under the same `X-GitHub-Delivery`,
//! per GitHub's "Best practices for using webhooks", so it is a duplicate; and so is a captured
//! delivery replayed under fresh `X-GitHub-Delivery` values, which are not signed. A replayer
//! can still make one run per `X-GitHub-Event` value it sends (that header is not signed
//! either): only GitHub's spelling is accepted (lowercase letters, digits, `_`), and handlers act
//! on the events they subscribed to only, their meaning taken from the verified body. The delivery GUID
//! is kept as [`VerifiedEvent::delivery_id`], for logs and audit.

use crate::body_signed::{body_key, event_name, verify_body_signature};
use crate::headers::{event_id, required, Headers};
use crate::mac::{decode_hex_mac, split_secrets, to_hex, Keys, MAC_LEN};
use crate::scheme::{VerifiedEvent, WebhookScheme};
use crate::signature::SignatureError;
#[cfg(any(doc, test))]
use crate::signature::MAX_EVENT_ID_LEN;
use idem_core::Error;
#[cfg(any(doc, test))]
use idem_core::Field;
use idem_signature::debug_without_secrets;

/// The signature header.
pub const GITHUB_SIGNATURE_HEADER: &str = "x-hub-signature-256";
/// The delivery's GUID: for logs and audit, not the key (it is not signed).
pub const GITHUB_DELIVERY_HEADER: &str = "x-github-delivery";
/// The event's name (`push`, `issues`, `ping`, ...): the first part of the key.
pub const GITHUB_EVENT_HEADER: &str = "x-github-event";

/// The secrets of one GitHub webhook: one, or the new and the old while its secret is changed
/// (GitHub signs each delivery with the one secret it has at that moment, so a receiver that
/// holds both accepts deliveries signed before and after the change). `Debug` never shows a
/// secret.
///
/// ```
/// use idem_inbox::{GitHubScheme, SignatureError, WebhookScheme};
/// let receiver = GitHubScheme::from_comma_separated("new secret, old secret")?;
/// let signed_before = GitHubScheme::new(["old secret"])?.sign(b"{}");
/// let headers = [
///     ("X-Hub-Signature-256", signed_before.as_str()),
///     ("X-GitHub-Event", "ping"),
///     ("X-GitHub-Delivery", "d-1"),
/// ];
/// assert!(receiver.verify(&headers, b"{}", 0).is_ok());
/// assert_eq!(receiver.verify(&headers, b"{ }", 0), Err(SignatureError::Mismatch));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct GitHubScheme {
    keys: Keys,
}

debug_without_secrets!(GitHubScheme);

impl GitHubScheme {
    /// A scheme with `secrets` (their bytes are the HMAC keys; the first one signs in
    /// [`sign`](Self::sign)). [`Error::InvalidInput`] on [`Field::Config`] when there is none
    /// or one is empty. A secret is free text to GitHub and any length is accepted here; choose
    /// a random one of at least 32 bytes (GitHub asks for a random string with high entropy),
    /// since anyone who guesses it can sign deliveries.
    ///
    /// ```
    /// use idem_inbox::GitHubScheme;
    /// assert!(GitHubScheme::new(["s3cret"]).is_ok());
    /// assert!(GitHubScheme::new([""]).is_err());
    /// ```
    pub fn new(secrets: impl IntoIterator<Item = impl AsRef<[u8]>>) -> Result<Self, Error> {
        Ok(Self {
            keys: Keys::new(secrets, "GitHub webhook secret")?,
        })
    }

    /// A scheme from a comma-separated list (`"new, old"`), spaces around each trimmed, empty
    /// items skipped. GitHub secrets are free text: one holding a comma, or starting or ending
    /// with a space, cannot be given this way (it would be split or trimmed) and must be given
    /// to [`new`](Self::new).
    ///
    /// ```
    /// use idem_inbox::GitHubScheme;
    /// let a = GitHubScheme::from_comma_separated(" new ,old,")?;
    /// assert_eq!(a.sign(b"x"), GitHubScheme::new(["new"])?.sign(b"x"));
    /// assert!(GitHubScheme::from_comma_separated(" , ").is_err());
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn from_comma_separated(secrets: &str) -> Result<Self, Error> {
        Self::new(split_secrets(secrets))
    }

    /// The `X-Hub-Signature-256` value GitHub would send for `body` under the first secret:
    /// `sha256=<64 lowercase hex digits>`. For tests and fixtures.
    ///
    /// ```
    /// use idem_inbox::GitHubScheme;
    /// // The example of GitHub's "Validating webhook deliveries".
    /// let scheme = GitHubScheme::new(["It's a Secret to Everybody"])?;
    /// assert_eq!(
    ///     scheme.sign(b"Hello, World!"),
    ///     "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    /// );
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn sign(&self, body: &[u8]) -> String {
        format!("sha256={}", to_hex(&self.keys.first_mac(&[body])))
    }
}

impl WebhookScheme for GitHubScheme {
    fn name(&self) -> &'static str {
        "github"
    }

    /// Checks `X-Hub-Signature-256` (required: `sha256=` then 64 hex digits, either case)
    /// against the body under every secret, then reads `X-GitHub-Event` and
    /// `X-GitHub-Delivery` (both required, at most [`MAX_EVENT_ID_LEN`] bytes, no blanks; the
    /// event's name in GitHub's spelling, lowercase letters, digits and `_`). The
    /// event id is `<X-GitHub-Event> <blake3 hex of the body>`, its type the event's name, the
    /// delivery id the GUID. `now_unix` is unused: GitHub signs no time.
    fn verify(
        &self,
        headers: &dyn Headers,
        body: &[u8],
        _now_unix: i64,
    ) -> Result<VerifiedEvent, SignatureError> {
        verify_body_signature(&self.keys, headers, GITHUB_SIGNATURE_HEADER, decode, body)?;
        let event = event_name(required(headers, GITHUB_EVENT_HEADER)?, |b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'
        })?;
        let delivery = event_id(required(headers, GITHUB_DELIVERY_HEADER)?)?;
        Ok(
            VerifiedEvent::new(Some(body_key(&event, body)), Some(event), None)
                .with_delivery_id(Some(delivery)),
        )
    }
}

/// `sha256=<64 hex digits>` into the MAC.
fn decode(value: &str) -> Result<[u8; MAC_LEN], SignatureError> {
    let hex = value
        .strip_prefix("sha256=")
        .ok_or(SignatureError::Malformed("no sha256= prefix"))?;
    decode_hex_mac(hex).ok_or(SignatureError::Malformed("no signature of 64 hex digits"))
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// GitHub's own example, from "Validating webhook deliveries"
    /// (https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries,
    /// "Testing the webhook payload validation"): secret `It's a Secret to Everybody`, payload
    /// `Hello, World!`, `X-Hub-Signature-256:
    /// sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17`.
    const DOCS_SECRET: &str = "It's a Secret to Everybody";
    const DOCS_PAYLOAD: &[u8] = b"Hello, World!";
    const DOCS_SIGNATURE: &str =
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
    /// A delivery GUID of the form GitHub sends (the one its docs show in an example delivery).
    const DELIVERY: &str = "72d3162e-cc78-11e3-81ab-4c9367dc0958";
    /// The key of `DOCS_PAYLOAD` under the event `issues`: the blake3 hex of the payload was
    /// computed independently of this crate with the Python `blake3` package (1.0.11):
    ///   python3 -c "import blake3; print(blake3.blake3(b'Hello, World!').hexdigest())"
    const DOCS_KEY: &str =
        "issues 288a86a79f20a3d6dccdca7713beaed178798296bdfa7913fa2a62d9727bf8f8";

    fn headers(signature: &str) -> Vec<(&'static str, String)> {
        vec![
            ("X-Hub-Signature-256", signature.to_owned()),
            ("X-GitHub-Delivery", DELIVERY.to_owned()),
            ("X-GitHub-Event", "issues".to_owned()),
        ]
    }

    fn malformed(reason: &'static str) -> Result<VerifiedEvent, SignatureError> {
        Err(SignatureError::Malformed(reason))
    }

    #[test]
    fn githubs_documented_vector_verifies_and_sign_reproduces_it() -> TestResult {
        let scheme = GitHubScheme::new([DOCS_SECRET])?;
        assert_eq!(scheme.sign(DOCS_PAYLOAD), DOCS_SIGNATURE);
        let event = scheme.verify(&headers(DOCS_SIGNATURE), DOCS_PAYLOAD, 0)?;
        assert_eq!(event.event_id(), Some(DOCS_KEY));
        assert_eq!(event.event_type(), Some("issues"));
        assert_eq!(event.delivery_id(), Some(DELIVERY));
        assert_eq!(event.signed_at(), None);
        // Uppercase hex is the same MAC.
        let upper = format!("sha256={}", DOCS_SIGNATURE[7..].to_ascii_uppercase());
        assert!(scheme.verify(&headers(&upper), DOCS_PAYLOAD, 0).is_ok());
        Ok(())
    }

    #[test]
    fn another_body_or_secret_is_a_mismatch() -> TestResult {
        let scheme = GitHubScheme::new([DOCS_SECRET])?;
        assert_eq!(
            scheme.verify(&headers(DOCS_SIGNATURE), b"Hello, World?", 0),
            Err(SignatureError::Mismatch)
        );
        let other = GitHubScheme::new(["It's a Secret to Everybody!"])?;
        assert_eq!(
            other.verify(&headers(DOCS_SIGNATURE), DOCS_PAYLOAD, 0),
            Err(SignatureError::Mismatch)
        );
        Ok(())
    }

    #[test]
    fn rotation_accepts_the_old_and_the_new_secret_and_refuses_a_rotated_out_one() -> TestResult {
        let receiver = GitHubScheme::from_comma_separated("new-secret, old-secret")?;
        for sender in ["new-secret", "old-secret"] {
            let signature = GitHubScheme::new([sender])?.sign(b"{}");
            assert!(
                receiver.verify(&headers(&signature), b"{}", 0).is_ok(),
                "{sender}"
            );
        }
        // Once the old secret is dropped, its signatures no longer pass.
        let after = GitHubScheme::new(["new-secret"])?;
        let old = GitHubScheme::new(["old-secret"])?.sign(b"{}");
        assert_eq!(
            after.verify(&headers(&old), b"{}", 0),
            Err(SignatureError::Mismatch)
        );
        Ok(())
    }

    #[test]
    fn there_is_no_timestamp_so_any_now_verifies() -> TestResult {
        let scheme = GitHubScheme::new([DOCS_SECRET])?;
        for now in [i64::MIN, 0, i64::MAX] {
            assert!(scheme
                .verify(&headers(DOCS_SIGNATURE), DOCS_PAYLOAD, now)
                .is_ok());
        }
        Ok(())
    }

    #[test]
    fn malformed_signatures_are_refused() -> TestResult {
        let scheme = GitHubScheme::new([DOCS_SECRET])?;
        let hex = &DOCS_SIGNATURE[7..];
        let long = format!("sha256={}", "a".repeat(9000));
        let cases: Vec<(String, &'static str)> = vec![
            (String::new(), "empty header"),
            (format!("sha1={hex}"), "no sha256= prefix"),
            (hex.to_owned(), "no sha256= prefix"),
            (format!("SHA256={hex}"), "no sha256= prefix"),
            ("sha256=".to_owned(), "no signature of 64 hex digits"),
            (
                format!("sha256={}", &hex[..62]),
                "no signature of 64 hex digits",
            ),
            (format!("sha256={hex}00"), "no signature of 64 hex digits"),
            (
                format!("sha256={}", "g".repeat(64)),
                "no signature of 64 hex digits",
            ),
            (format!("sha256= {hex}"), "no signature of 64 hex digits"),
            (
                format!("sha256={}\u{e9}", &hex[..62]),
                "header is not visible ASCII",
            ),
            (long, "header too long"),
        ];
        for (signature, reason) in cases {
            assert_eq!(
                scheme.verify(&headers(&signature), DOCS_PAYLOAD, 0),
                malformed(reason),
                "{signature:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn missing_signature_event_name_or_delivery_is_refused() -> TestResult {
        let scheme = GitHubScheme::new([DOCS_SECRET])?;
        let without = |name: &str| {
            let mut h = headers(DOCS_SIGNATURE);
            h.retain(|(n, _)| *n != name);
            h
        };
        assert_eq!(
            scheme.verify(&without("X-Hub-Signature-256"), DOCS_PAYLOAD, 0),
            Err(SignatureError::Missing)
        );
        assert_eq!(
            scheme.verify(&without("X-GitHub-Event"), DOCS_PAYLOAD, 0),
            Err(SignatureError::MissingHeader(GITHUB_EVENT_HEADER))
        );
        assert_eq!(
            scheme.verify(&without("X-GitHub-Delivery"), DOCS_PAYLOAD, 0),
            Err(SignatureError::MissingHeader(GITHUB_DELIVERY_HEADER))
        );
        Ok(())
    }

    #[test]
    fn the_key_comes_from_what_is_signed_not_from_the_delivery_id() -> TestResult {
        let scheme = GitHubScheme::new([DOCS_SECRET])?;
        let with = |event: &str, delivery: &str| {
            vec![
                ("X-Hub-Signature-256", DOCS_SIGNATURE.to_owned()),
                ("X-GitHub-Event", event.to_owned()),
                ("X-GitHub-Delivery", delivery.to_owned()),
            ]
        };
        // The same signed body replayed under fresh delivery ids: the same key every time,
        // each delivery id still reported.
        for delivery in ["d-1", "d-2", "d-3"] {
            let event = scheme.verify(&with("issues", delivery), DOCS_PAYLOAD, 0)?;
            assert_eq!(event.event_id(), Some(DOCS_KEY));
            assert_eq!(event.delivery_id(), Some(delivery));
        }
        // Another (unsigned) event name is another key: one run per distinct name at most.
        let push = scheme.verify(&with("push", "d-1"), DOCS_PAYLOAD, 0)?;
        assert_eq!(
            push.event_id(),
            Some(DOCS_KEY.replacen("issues", "push", 1).as_str())
        );
        // Another body is another key.
        let other = GitHubScheme::new([DOCS_SECRET])?.sign(b"Hello, World?");
        let mut h = with("issues", "d-1");
        h.retain(|(n, _)| *n != "X-Hub-Signature-256");
        h.push(("X-Hub-Signature-256", other));
        assert_ne!(
            scheme.verify(&h, b"Hello, World?", 0)?.event_id(),
            Some(DOCS_KEY)
        );
        Ok(())
    }

    /// Reproduces the replay of a captured delivery through the inbox: one signed body posted
    /// three times under new `X-GitHub-Delivery` values runs its effect once.
    #[tokio::test]
    async fn a_replay_under_new_delivery_ids_is_a_duplicate_with_no_second_effect() -> TestResult {
        use crate::{Ack, Delivery, Inbox, Receipt};
        use idem_core::{Idempotency, MemoryStore};
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;

        let scheme = GitHubScheme::new([DOCS_SECRET])?;
        let inbox = Inbox::new(Idempotency::new(MemoryStore::new()));
        let effects = Arc::new(AtomicUsize::new(0));
        let mut receipts = Vec::new();
        for delivery in [DELIVERY, "0b9a6e1c-1111-4c9b-8e6d-000000000001", "x-3"] {
            let headers = [
                ("X-Hub-Signature-256", DOCS_SIGNATURE),
                ("X-GitHub-Event", "issues"),
                ("X-GitHub-Delivery", delivery),
            ];
            let (delivery, verified) =
                Delivery::verify_with(&scheme, "github", &headers, DOCS_PAYLOAD, 0)?;
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
    fn a_forged_delivery_is_a_mismatch_before_its_id_is_read() -> TestResult {
        // A forged request with a bad id header is told "mismatch", never anything about its id.
        let scheme = GitHubScheme::new([DOCS_SECRET])?;
        let forged = [
            (
                "X-Hub-Signature-256",
                GitHubScheme::new(["x"])?.sign(DOCS_PAYLOAD),
            ),
            ("X-GitHub-Event", "a b".to_owned()),
            ("X-GitHub-Delivery", "a b".to_owned()),
        ];
        assert_eq!(
            scheme.verify(&forged, DOCS_PAYLOAD, 0),
            Err(SignatureError::Mismatch)
        );
        Ok(())
    }

    #[test]
    fn delivery_ids_and_event_names_are_bounded_and_hold_no_blank() -> TestResult {
        let scheme = GitHubScheme::new([DOCS_SECRET])?;
        let long = "d".repeat(MAX_EVENT_ID_LEN + 1);
        let at_limit = "d".repeat(MAX_EVENT_ID_LEN);
        for (id, expected) in [
            (
                long.as_str(),
                Err(SignatureError::Malformed("event id too long")),
            ),
            (
                "a b",
                Err(SignatureError::Malformed("event id holds a blank")),
            ),
            ("a,b", Ok(Some("a,b"))),
            (at_limit.as_str(), Ok(Some(at_limit.as_str()))),
        ] {
            for (delivery, event) in [(id, "issues"), ("d-1", id)] {
                let headers = [
                    ("X-Hub-Signature-256", DOCS_SIGNATURE),
                    ("X-GitHub-Event", event),
                    ("X-GitHub-Delivery", delivery),
                ];
                let got = scheme.verify(&headers, DOCS_PAYLOAD, 0);
                let got = got.as_ref().map(|e| {
                    if event == id {
                        e.event_type()
                    } else {
                        e.delivery_id()
                    }
                });
                // An event's name is held to GitHub's spelling besides.
                let expected = match (event == id, id) {
                    (true, "a,b") => malformed("not an event name of this sender").map(|_| None),
                    _ => expected.clone(),
                };
                assert_eq!(got.map_err(Clone::clone), expected, "{id:?}");
            }
        }
        let twice = [
            ("X-Hub-Signature-256", DOCS_SIGNATURE),
            ("X-GitHub-Event", "issues"),
            ("X-GitHub-Delivery", "a"),
            ("X-GitHub-Delivery", "b"),
        ];
        assert_eq!(
            scheme.verify(&twice, DOCS_PAYLOAD, 0),
            malformed("header sent more than once")
        );
        Ok(())
    }

    #[test]
    fn configuration_without_a_usable_secret_is_refused_and_debug_hides_secrets() -> TestResult {
        for result in [
            GitHubScheme::new(Vec::<Vec<u8>>::new()),
            GitHubScheme::new([""]),
            GitHubScheme::from_comma_separated(" , "),
        ] {
            assert!(matches!(
                result,
                Err(Error::InvalidInput {
                    field: Field::Config,
                    ..
                })
            ));
        }
        let shown = format!("{:?}", GitHubScheme::new(["very-secret"])?);
        assert!(!shown.contains("very-secret"), "{shown}");
        Ok(())
    }
}
