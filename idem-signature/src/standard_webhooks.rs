//! The Standard Webhooks scheme (the open specification behind Svix): `webhook-id`,
//! `webhook-timestamp` (unix seconds) and `webhook-signature`, a space-separated list of
//! `v1,<base64>` entries, each the standard base64 HMAC-SHA256 of
//! `"<webhook-id>.<webhook-timestamp>.<raw body>"` under a secret given as `whsec_<base64>`
//! (the key is the base64-decoded part). During a rotation the sender signs with each active
//! secret, hence several entries; other versions (`v1a,` asymmetric signatures) are ignored.
//! The event id is `webhook-id`, which the specification keeps the same on every attempt of a
//! message; it is signed. docs/inbox.md, "Standard Webhooks".
//!
//! **Svix's header names.** Svix sends the same three headers named `svix-id`,
//! `svix-timestamp` and `svix-signature` by default, and its libraries read those when the
//! `webhook-*` ones are absent; so does this scheme. A request carrying headers of both sets is
//! refused ([`SignatureError::MixedHeaderSets`]): which set was signed cannot be told.

use std::time::Duration;

use crate::debug_without_secrets;
use crate::headers::{event_id, required, single, Headers};
use crate::mac::{
    decode_base64_mac, decode_base64_secret, split_secrets, to_base64, Keys, MAC_LEN,
};
use crate::scheme::{VerifiedEvent, WebhookScheme};
use crate::signature::{
    check_time, parse_unix_secs, secs_i64, SignatureError, DEFAULT_TOLERANCE, MAX_SIGNATURES,
};
use idem_core::{Error, Field};

/// The message id: the event id, the same on every attempt.
pub const WEBHOOK_ID_HEADER: &str = "webhook-id";
/// The time of signing, unix seconds.
pub const WEBHOOK_TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// The signatures, space separated.
pub const WEBHOOK_SIGNATURE_HEADER: &str = "webhook-signature";
/// Svix's name for [`WEBHOOK_ID_HEADER`], read when no `webhook-*` header is sent.
pub const SVIX_ID_HEADER: &str = "svix-id";
/// Svix's name for [`WEBHOOK_TIMESTAMP_HEADER`].
pub const SVIX_TIMESTAMP_HEADER: &str = "svix-timestamp";
/// Svix's name for [`WEBHOOK_SIGNATURE_HEADER`].
pub const SVIX_SIGNATURE_HEADER: &str = "svix-signature";

/// The shortest decoded key accepted, in bytes. The specification asks for keys of 24 to 64
/// bytes; shorter than 16 is refused outright as too easy to guess.
pub const MIN_SECRET_LEN: usize = 16;

/// The prefix of a secret as the specification serialises it.
const SECRET_PREFIX: &str = "whsec_";

/// The names of the three headers, as one set: the specification's or Svix's.
struct HeaderSet {
    prefix: &'static str,
    id: &'static str,
    timestamp: &'static str,
    signature: &'static str,
}

const WEBHOOK_HEADERS: HeaderSet = HeaderSet {
    prefix: "webhook-",
    id: WEBHOOK_ID_HEADER,
    timestamp: WEBHOOK_TIMESTAMP_HEADER,
    signature: WEBHOOK_SIGNATURE_HEADER,
};

const SVIX_HEADERS: HeaderSet = HeaderSet {
    prefix: "svix-",
    id: SVIX_ID_HEADER,
    timestamp: SVIX_TIMESTAMP_HEADER,
    signature: SVIX_SIGNATURE_HEADER,
};

impl HeaderSet {
    /// Whether the request carries any header of this set.
    fn any_in(&self, headers: &dyn Headers) -> bool {
        [self.id, self.timestamp, self.signature]
            .iter()
            .any(|name| !headers.values(name).is_empty())
    }

    /// The set the request uses: `webhook-*` when any of it is sent, otherwise `svix-*`;
    /// [`SignatureError::MixedHeaderSets`] when headers of both are sent.
    fn of(headers: &dyn Headers) -> Result<&'static HeaderSet, SignatureError> {
        match (
            WEBHOOK_HEADERS.any_in(headers),
            SVIX_HEADERS.any_in(headers),
        ) {
            (true, true) => Err(SignatureError::MixedHeaderSets(
                WEBHOOK_HEADERS.prefix,
                SVIX_HEADERS.prefix,
            )),
            (false, true) => Ok(&SVIX_HEADERS),
            _ => Ok(&WEBHOOK_HEADERS),
        }
    }
}

/// The secrets and timestamp tolerance of one Standard Webhooks endpoint. `Debug` never shows
/// a secret.
///
/// The tolerance is judged like the reference libraries: a delivery signed exactly
/// `tolerance` ago (or ahead) passes, one second more is [`SignatureError::Stale`] (or
/// [`SignatureError::Future`]); the default is [`DEFAULT_TOLERANCE`] (5 minutes), theirs.
///
/// ```
/// use idem_signature::{SignatureError, StandardWebhooks, WebhookScheme};
/// let scheme = StandardWebhooks::new(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])?;
/// let signature = scheme.sign("msg_1", 1_700_000_000, b"{}");
/// let headers = [
///     ("webhook-id", "msg_1"),
///     ("webhook-timestamp", "1700000000"),
///     ("webhook-signature", signature.as_str()),
/// ];
/// assert_eq!(scheme.verify(&headers, b"{}", 1_700_000_300)?.event_id(), Some("msg_1"));
/// assert_eq!(
///     scheme.verify(&headers, b"{}", 1_700_000_301),
///     Err(SignatureError::Stale { age_secs: 301 })
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct StandardWebhooks {
    keys: Keys,
    tolerance_secs: i64,
}

debug_without_secrets!(StandardWebhooks, tolerance_secs);

impl StandardWebhooks {
    /// A scheme with `secrets`, each `whsec_<base64>` or the bare base64 (padded or not, as
    /// the reference libraries accept); the first one signs in [`sign`](Self::sign).
    /// [`Error::InvalidInput`] on [`Field::Config`] when there is none, one is not base64, or
    /// one decodes to fewer than [`MIN_SECRET_LEN`] (16) bytes. The specification asks for keys
    /// of 24 to 64 bytes; 16 to 23 are accepted for senders that chose shorter
    /// ones, anything shorter is refused as guessable.
    ///
    /// ```
    /// use idem_signature::StandardWebhooks;
    /// assert!(StandardWebhooks::new(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]).is_ok());
    /// assert!(StandardWebhooks::new(["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]).is_ok());
    /// assert!(StandardWebhooks::new(["whsec_"]).is_err());
    /// assert!(StandardWebhooks::new(["whsec_not base64!"]).is_err());
    /// assert!(StandardWebhooks::new(["whsec_c2VjcmV0"]).is_err()); // 6 bytes: too short
    /// ```
    pub fn new<S: AsRef<str>>(secrets: impl IntoIterator<Item = S>) -> Result<Self, Error> {
        let mut keys = Vec::new();
        for secret in secrets {
            let secret = secret.as_ref();
            let encoded = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
            let key = decode_base64_secret(encoded).ok_or_else(|| {
                Error::invalid(
                    Field::Config,
                    "a Standard Webhooks secret is not base64 after its whsec_ prefix",
                )
            })?;
            if key.len() < MIN_SECRET_LEN {
                return Err(Error::invalid(
                    Field::Config,
                    format!(
                        "a Standard Webhooks secret decodes to {} bytes, fewer than {MIN_SECRET_LEN} \
                         (the specification asks for 24 to 64)",
                        key.len()
                    ),
                ));
            }
            keys.push(key);
        }
        Ok(Self {
            keys: Keys::new(keys, "Standard Webhooks secret")?,
            tolerance_secs: secs_i64(DEFAULT_TOLERANCE),
        })
    }

    /// A scheme from a comma-separated list (`"whsec_new, whsec_old"`; base64 holds no comma),
    /// spaces around each trimmed, empty items skipped.
    ///
    /// ```
    /// use idem_signature::StandardWebhooks;
    /// let both = StandardWebhooks::from_comma_separated(
    ///     "whsec_bmV3LXNlY3JldC1mb3Itcm90YXRpb24h, whsec_b2xkLXNlY3JldC1mb3Itcm90YXRpb24h",
    /// )?;
    /// let new = StandardWebhooks::new(["whsec_bmV3LXNlY3JldC1mb3Itcm90YXRpb24h"])?;
    /// assert_eq!(both.sign("m", 1, b""), new.sign("m", 1, b""));
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn from_comma_separated(secrets: &str) -> Result<Self, Error> {
        Self::new(split_secrets(secrets))
    }

    /// The same scheme with a different timestamp tolerance, in whole seconds (fractions are
    /// dropped). `Duration::ZERO` accepts only a timestamp equal to now.
    ///
    /// ```
    /// use idem_signature::StandardWebhooks;
    /// use std::time::Duration;
    /// let scheme = StandardWebhooks::new(["whsec_bmV3LXNlY3JldC1mb3Itcm90YXRpb24h"])?
    ///     .tolerance(Duration::from_secs(60));
    /// assert_eq!(scheme.tolerance_secs(), 60);
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    #[must_use]
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance_secs = secs_i64(tolerance);
        self
    }

    /// The tolerance in whole seconds.
    pub fn tolerance_secs(&self) -> i64 {
        self.tolerance_secs
    }

    /// The `webhook-signature` value a sender would put on message `id` signed at `timestamp`
    /// (unix seconds) under the first secret: `v1,<base64>`. Byte for byte what the
    /// reference libraries' `sign` produces. For tests and fixtures.
    ///
    /// ```
    /// use idem_signature::StandardWebhooks;
    /// // The reference Python library's test_sign_function.
    /// let scheme = StandardWebhooks::new(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])?;
    /// assert_eq!(
    ///     scheme.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, br#"{"test": 2432232314}"#),
    ///     "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    /// );
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let timestamp = timestamp.to_string();
        let mac = self.keys.first_mac(&signed(id, &timestamp, body));
        format!("v1,{}", to_base64(&mac))
    }

    /// Like [`sign`](Self::sign), one `v1,` entry per secret in order, space separated: what a
    /// sender sends during a rotation.
    ///
    /// ```
    /// use idem_signature::StandardWebhooks;
    /// let sender = StandardWebhooks::new(["whsec_bmV3LXNlY3JldC1mb3Itcm90YXRpb24h", "whsec_b2xkLXNlY3JldC1mb3Itcm90YXRpb24h"])?;
    /// assert_eq!(sender.sign_with_all_secrets("m", 1, b"").matches("v1,").count(), 2);
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn sign_with_all_secrets(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let timestamp = timestamp.to_string();
        self.keys
            .macs(&signed(id, &timestamp, body))
            .iter()
            .map(|mac| format!("v1,{}", to_base64(mac)))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl WebhookScheme for StandardWebhooks {
    fn name(&self) -> &'static str {
        "standard-webhooks"
    }

    /// Reads the three headers (each at most once; `svix-*` when no `webhook-*` header is
    /// sent, [`SignatureError::MixedHeaderSets`] when both sets are), checks the signatures
    /// against `"<id>.<timestamp>.<body>"` under every secret, and only then the timestamp
    /// against the tolerance. The first [`MAX_SIGNATURES`] `v1` entries are considered;
    /// entries that are not 44 characters of standard base64 cannot match and are skipped.
    fn verify(
        &self,
        headers: &dyn Headers,
        body: &[u8],
        now_unix: i64,
    ) -> Result<VerifiedEvent, SignatureError> {
        let set = HeaderSet::of(headers)?;
        let signatures = match single(headers, set.signature)? {
            None => return Err(SignatureError::Missing),
            Some(signatures) => signatures,
        };
        let candidates = parse_signatures(signatures)?;
        let id = event_id(required(headers, set.id)?)?;
        let timestamp_raw = required(headers, set.timestamp)?;
        let timestamp = parse_unix_secs(timestamp_raw).ok_or(SignatureError::Malformed(
            "webhook-timestamp is not a unix time in plain decimal",
        ))?;
        if !self
            .keys
            .any_matches(&signed(&id, timestamp_raw, body), &candidates)
        {
            return Err(SignatureError::Mismatch);
        }
        check_time(timestamp, now_unix, self.tolerance_secs)?;
        Ok(VerifiedEvent::new(Some(id.clone()), None, Some(timestamp)).with_delivery_id(Some(id)))
    }
}

/// The signed content, `"<id>.<timestamp>.<body>"`, in parts.
fn signed<'a>(id: &'a str, timestamp: &'a str, body: &'a [u8]) -> [&'a [u8]; 5] {
    [id.as_bytes(), b".", timestamp.as_bytes(), b".", body]
}

/// The decodable `v1` candidates of a `webhook-signature` value: entries separated by spaces
/// (or tabs), each `<version>,<signature>`; versions other than `v1` ignored; the first
/// [`MAX_SIGNATURES`] `v1` entries considered.
fn parse_signatures(value: &str) -> Result<Vec<[u8; MAC_LEN]>, SignatureError> {
    if value.is_empty() {
        return Err(SignatureError::Malformed("empty header"));
    }
    let mut v1_seen = 0usize;
    let mut candidates = Vec::new();
    for entry in value.split([' ', '\t']).filter(|e| !e.is_empty()) {
        let Some(("v1", signature)) = entry.split_once(',') else {
            continue;
        };
        if v1_seen < MAX_SIGNATURES {
            if let Some(decoded) = decode_base64_mac(signature) {
                candidates.push(decoded);
            }
        }
        v1_seen = v1_seen.saturating_add(1);
    }
    if v1_seen == 0 {
        return Err(SignatureError::Malformed("no v1 signature"));
    }
    if candidates.is_empty() {
        return Err(SignatureError::Malformed(
            "no v1 signature of 44 characters of base64",
        ));
    }
    Ok(candidates)
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    // Vectors from the specification's reference libraries, in
    // github.com/standard-webhooks/standard-webhooks (commit b2fa7b8):
    // - libraries/rust/src/lib.rs, `test_sign`;
    // - libraries/python/tests/test_webhooks.py, `test_sign_function`.
    // (secret, msg id, timestamp, payload, expected signature)
    const REFERENCE_VECTORS: [(&str, &str, i64, &str, &str); 2] = [
        (
            "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
            "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
            1_649_367_553,
            r#"{"email":"test@example.com","username":"test_user"}"#,
            "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=",
        ),
        (
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            r#"{"test": 2432232314}"#,
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        ),
    ];

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const T: i64 = 1_614_265_330;
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn scheme(secrets: &[&str]) -> Result<StandardWebhooks, Error> {
        StandardWebhooks::new(secrets.iter().copied())
    }

    fn headers(id: &str, timestamp: &str, signature: &str) -> Vec<(&'static str, String)> {
        vec![
            ("webhook-id", id.to_owned()),
            ("webhook-timestamp", timestamp.to_owned()),
            ("webhook-signature", signature.to_owned()),
        ]
    }

    fn good() -> Vec<(&'static str, String)> {
        headers(ID, &T.to_string(), SIGNATURE)
    }

    fn malformed(reason: &'static str) -> Result<VerifiedEvent, SignatureError> {
        Err(SignatureError::Malformed(reason))
    }

    #[test]
    fn reference_library_vectors_verify_and_sign_reproduces_them() -> TestResult {
        for (secret, id, t, payload, expected) in REFERENCE_VECTORS {
            let s = scheme(&[secret])?;
            assert_eq!(s.sign(id, t, payload.as_bytes()), expected);
            let event = s.verify(
                &headers(id, &t.to_string(), expected),
                payload.as_bytes(),
                t,
            )?;
            assert_eq!(
                event,
                VerifiedEvent::new(Some(id.to_owned()), None, Some(t))
                    .with_delivery_id(Some(id.to_owned()))
            );
        }
        Ok(())
    }

    #[test]
    fn the_reference_pythons_wrong_signature_is_a_mismatch() -> TestResult {
        // libraries/python/tests/test_webhooks.py, `test_invalid_signature_raises_error`: the
        // vector with its last base64 character changed.
        let forged = headers(
            ID,
            &T.to_string(),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA=",
        );
        assert_eq!(
            scheme(&[SECRET])?.verify(&forged, BODY, T),
            Err(SignatureError::Mismatch)
        );
        Ok(())
    }

    #[test]
    fn secrets_with_or_without_prefix_or_padding_are_the_same_key() -> TestResult {
        // As the reference Python library's `test_signature_verification_with_unpadded_secret`.
        for secret in [SECRET, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"] {
            assert!(
                scheme(&[secret])?.verify(&good(), BODY, T).is_ok(),
                "{secret}"
            );
        }
        let padded = scheme(&["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS="])?.sign(ID, T, BODY);
        let unpadded = scheme(&["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS"])?.sign(ID, T, BODY);
        assert_eq!(padded, unpadded);
        // The whole `whsec_...` string as the key (Stripe's way) is another key: a scheme whose
        // key is the string's bytes (given as their base64) signs otherwise than SECRET's.
        let whole = scheme(&[&to_base64(SECRET.as_bytes())])?;
        let whole_mac = Keys::new([SECRET], "secret")?.first_mac(&signed(ID, &T.to_string(), BODY));
        assert_eq!(
            whole.sign(ID, T, BODY),
            format!("v1,{}", to_base64(&whole_mac))
        );
        assert_ne!(
            whole.sign(ID, T, BODY),
            scheme(&[SECRET])?.sign(ID, T, BODY)
        );
        assert_eq!(
            whole.verify(&good(), BODY, T),
            Err(SignatureError::Mismatch)
        );
        Ok(())
    }

    #[test]
    fn a_mac_in_a_non_canonical_base64_encoding_is_refused() -> TestResult {
        // SIGNATURE ends in `OE=`: the last character before the padding carries 2 unused low
        // bits, zero in `E`; `F` differs only there, so a lenient decoder reads the same 32
        // bytes. Not the sender's encoding: refused.
        let non_canonical = SIGNATURE.replace("OE=", "OF=");
        assert_ne!(non_canonical, SIGNATURE);
        assert_eq!(
            scheme(&[SECRET])?.verify(&headers(ID, &T.to_string(), &non_canonical), BODY, T),
            malformed("no v1 signature of 44 characters of base64")
        );
        Ok(())
    }

    fn svix(id: &str, timestamp: &str, signature: &str) -> Vec<(&'static str, String)> {
        vec![
            ("svix-id", id.to_owned()),
            ("svix-timestamp", timestamp.to_owned()),
            ("svix-signature", signature.to_owned()),
        ]
    }

    #[test]
    fn svix_header_names_are_read_when_no_webhook_header_is_sent() -> TestResult {
        let s = scheme(&[SECRET])?;
        let event = s.verify(&svix(ID, &T.to_string(), SIGNATURE), BODY, T)?;
        assert_eq!(event.event_id(), Some(ID));
        assert_eq!(event.signed_at(), Some(T));
        // The same checks as under the specification's names.
        assert_eq!(
            s.verify(&svix(ID, &T.to_string(), SIGNATURE), b"{}", T),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            s.verify(&svix(ID, &T.to_string(), SIGNATURE), BODY, T + 301),
            Err(SignatureError::Stale { age_secs: 301 })
        );
        let mut no_id = svix(ID, &T.to_string(), SIGNATURE);
        no_id.retain(|(n, _)| *n != "svix-id");
        assert_eq!(
            s.verify(&no_id, BODY, T),
            Err(SignatureError::MissingHeader(SVIX_ID_HEADER))
        );
        Ok(())
    }

    #[test]
    fn a_request_mixing_webhook_and_svix_headers_is_refused() -> TestResult {
        let s = scheme(&[SECRET])?;
        let t = T.to_string();
        // The full set of each, or any one header of the other set beside a full set.
        let mut both = good();
        both.extend(svix(ID, &t, SIGNATURE));
        let mut one_svix = good();
        one_svix.push(("svix-id", "msg_other".to_owned()));
        let mut one_webhook = svix(ID, &t, SIGNATURE);
        one_webhook.push(("webhook-signature", SIGNATURE.to_owned()));
        for request in [both, one_svix, one_webhook] {
            assert_eq!(
                s.verify(&request, BODY, T),
                Err(SignatureError::MixedHeaderSets("webhook-", "svix-")),
                "{request:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn id_timestamp_and_body_are_all_signed() -> TestResult {
        let s = scheme(&[SECRET])?;
        assert_eq!(
            s.verify(&headers("msg_other", &T.to_string(), SIGNATURE), BODY, T),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            s.verify(&headers(ID, &(T + 1).to_string(), SIGNATURE), BODY, T),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            s.verify(&good(), br#"{"test": 2432232315}"#, T),
            Err(SignatureError::Mismatch)
        );
        Ok(())
    }

    #[test]
    fn tolerance_edges_exactly_at_passes_one_second_more_does_not() -> TestResult {
        let s = scheme(&[SECRET])?;
        assert!(s.verify(&good(), BODY, T + 300).is_ok());
        assert!(s.verify(&good(), BODY, T - 300).is_ok());
        assert_eq!(
            s.verify(&good(), BODY, T + 301),
            Err(SignatureError::Stale { age_secs: 301 })
        );
        assert_eq!(
            s.verify(&good(), BODY, T - 301),
            Err(SignatureError::Future { ahead_secs: 301 })
        );
        let tight = s.clone().tolerance(Duration::from_millis(10_999));
        assert_eq!(tight.tolerance_secs(), 10);
        assert!(tight.verify(&good(), BODY, T + 10).is_ok());
        assert_eq!(
            tight.verify(&good(), BODY, T + 11),
            Err(SignatureError::Stale { age_secs: 11 })
        );
        let zero = s.tolerance(Duration::ZERO);
        assert!(zero.verify(&good(), BODY, T).is_ok());
        assert_eq!(
            zero.verify(&good(), BODY, T - 1),
            Err(SignatureError::Future { ahead_secs: 1 })
        );
        Ok(())
    }

    #[test]
    fn a_forged_stale_delivery_is_a_mismatch_not_stale() -> TestResult {
        let forged = scheme(&["whsec_b3RoZXItc2VjcmV0LW5vdC1vdXJzISEh"])?.sign(ID, 5, BODY);
        assert_eq!(
            scheme(&[SECRET])?.verify(&headers(ID, "5", &forged), BODY, T),
            Err(SignatureError::Mismatch)
        );
        Ok(())
    }

    #[test]
    fn rotation_both_ways_and_a_rotated_out_secret_is_refused() -> TestResult {
        let (new, old) = (
            "whsec_bmV3LXNlY3JldC1mb3Itcm90YXRpb24h",
            "whsec_b2xkLXNlY3JldC1mb3Itcm90YXRpb24h",
        );
        // The sender signs with both during its rotation: either receiver accepts.
        let both = scheme(&[new, old])?.sign_with_all_secrets(ID, T, BODY);
        assert_eq!(both.split(' ').count(), 2);
        for receiver in [new, old] {
            assert!(scheme(&[receiver])?
                .verify(&headers(ID, &T.to_string(), &both), BODY, T)
                .is_ok());
        }
        // The receiver holds both while the sender switches.
        let receiver = scheme(&[new, old])?;
        for sender in [new, old] {
            let signature = scheme(&[sender])?.sign(ID, T, BODY);
            assert!(receiver
                .verify(&headers(ID, &T.to_string(), &signature), BODY, T)
                .is_ok());
        }
        // Once the old secret is rotated out, a signature under it alone is refused.
        let only_old = scheme(&[old])?.sign(ID, T, BODY);
        assert_eq!(
            scheme(&[new])?.verify(&headers(ID, &T.to_string(), &only_old), BODY, T),
            Err(SignatureError::Mismatch)
        );
        Ok(())
    }

    #[test]
    fn other_versions_and_junk_entries_beside_a_good_one_are_skipped() -> TestResult {
        // As the reference Python library's `test_multi_sig_payload_is_valid`.
        let s = scheme(&[SECRET])?;
        let list = format!(
            "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= v2,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= v1a,xyz junk v1,zz {SIGNATURE}  v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="
        );
        assert!(s
            .verify(&headers(ID, &T.to_string(), &list), BODY, T)
            .is_ok());
        // The right MAC under another version does not count.
        let v2 = SIGNATURE.replace("v1,", "v2,");
        assert_eq!(
            s.verify(&headers(ID, &T.to_string(), &v2), BODY, T),
            malformed("no v1 signature")
        );
        Ok(())
    }

    #[test]
    fn only_the_first_sixteen_v1_entries_are_considered() -> TestResult {
        let s = scheme(&[SECRET])?;
        let decoy = "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= ";
        let last_considered = format!("{}{SIGNATURE}", decoy.repeat(MAX_SIGNATURES - 1));
        assert!(s
            .verify(&headers(ID, &T.to_string(), &last_considered), BODY, T)
            .is_ok());
        let beyond = format!("{}{SIGNATURE}", decoy.repeat(MAX_SIGNATURES));
        assert_eq!(
            s.verify(&headers(ID, &T.to_string(), &beyond), BODY, T),
            Err(SignatureError::Mismatch)
        );
        Ok(())
    }

    #[test]
    fn malformed_headers_are_refused() -> TestResult {
        let s = scheme(&[SECRET])?;
        let t = T.to_string();
        let sig_cases: Vec<(String, &'static str)> = vec![
            (String::new(), "empty header"),
            ("   ".to_owned(), "empty header"),
            (
                "g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=".to_owned(),
                "no v1 signature",
            ),
            (
                "v1=g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=".to_owned(),
                "no v1 signature",
            ),
            (
                "v1,".to_owned(),
                "no v1 signature of 44 characters of base64",
            ),
            (
                "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE".to_owned(),
                "no v1 signature of 44 characters of base64",
            ),
            (
                "v1,g0hM9SsE-OTPJTGt_tmIKtSyZlE3uFJELVlNIOLJ1OE=".to_owned(),
                "no v1 signature of 44 characters of base64",
            ),
            (
                format!("v1,{}", "a".repeat(64)),
                "no v1 signature of 44 characters of base64",
            ),
            ("v1,caf\u{e9}".to_owned(), "header is not visible ASCII"),
            (
                format!("{SIGNATURE} {}", "x".repeat(9000)),
                "header too long",
            ),
        ];
        for (signature, reason) in sig_cases {
            assert_eq!(
                s.verify(&headers(ID, &t, &signature), BODY, T),
                malformed(reason),
                "{signature:?}"
            );
        }
        for timestamp in [
            "abc",
            "01614265330",
            "+1614265330",
            "-1",
            "1614265330.0",
            "1e9",
        ] {
            assert_eq!(
                s.verify(&headers(ID, timestamp, SIGNATURE), BODY, T),
                malformed("webhook-timestamp is not a unix time in plain decimal"),
                "{timestamp:?}"
            );
        }
        assert_eq!(
            s.verify(&headers("a b", &t, SIGNATURE), BODY, T),
            malformed("event id holds a blank")
        );
        assert_eq!(
            s.verify(&headers(&"m".repeat(256), &t, SIGNATURE), BODY, T),
            malformed("event id too long")
        );
        Ok(())
    }

    #[test]
    fn missing_headers_are_named() -> TestResult {
        let s = scheme(&[SECRET])?;
        let without = |name: &str| {
            let mut h = good();
            h.retain(|(n, _)| *n != name);
            h
        };
        assert_eq!(
            s.verify(&without("webhook-signature"), BODY, T),
            Err(SignatureError::Missing)
        );
        assert_eq!(
            s.verify(&without("webhook-id"), BODY, T),
            Err(SignatureError::MissingHeader(WEBHOOK_ID_HEADER))
        );
        assert_eq!(
            s.verify(&without("webhook-timestamp"), BODY, T),
            Err(SignatureError::MissingHeader(WEBHOOK_TIMESTAMP_HEADER))
        );
        Ok(())
    }

    #[test]
    fn configuration_errors_and_debug_hides_secrets() -> TestResult {
        for result in [
            StandardWebhooks::new(Vec::<&str>::new()),
            StandardWebhooks::new(["whsec_"]),
            StandardWebhooks::new([""]),
            StandardWebhooks::new(["whsec_%%%"]),
            // 15 bytes (`fifteen-bytes!!`): one short of the minimum.
            StandardWebhooks::new(["whsec_ZmlmdGVlbi1ieXRlcyEh"]),
            StandardWebhooks::new([SECRET, "whsec_c2VjcmV0"]),
            StandardWebhooks::from_comma_separated(" , "),
        ] {
            assert!(matches!(
                result,
                Err(Error::InvalidInput {
                    field: Field::Config,
                    ..
                })
            ));
        }
        // 16 bytes (`sixteen-bytes!!!`): the minimum, accepted.
        assert!(StandardWebhooks::new(["whsec_c2l4dGVlbi1ieXRlcyEhIQ=="]).is_ok());
        let shown = format!("{:?}", scheme(&[SECRET])?);
        assert!(!shown.contains("MfKQ"), "{shown}");
        assert!(shown.contains("secrets: 1"), "{shown}");
        Ok(())
    }

    #[test]
    fn extreme_times_do_not_overflow() -> TestResult {
        let s = scheme(&[SECRET])?;
        let max = s.sign(ID, i64::MAX, BODY);
        assert_eq!(
            s.verify(&headers(ID, &i64::MAX.to_string(), &max), BODY, i64::MIN),
            Err(SignatureError::Future {
                ahead_secs: i64::MAX
            })
        );
        let wide = s.tolerance(Duration::MAX);
        let zero = wide.sign(ID, 0, BODY);
        assert!(wide
            .verify(&headers(ID, "0", &zero), BODY, i64::MAX)
            .is_ok());
        Ok(())
    }
}
