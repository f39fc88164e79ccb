//! Stripe's scheme: `Stripe-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>...]`, each `v1`
//! the lowercase hex HMAC-SHA256 of `"<t>.<raw body>"` under one of the endpoint's secrets
//! (the whole `whsec_...` string is the key), with a timestamp tolerance. The event id is the
//! body's `id` (`evt_...`), which the caller reads once the body is verified: the scheme's
//! [`VerifiedEvent::event_id`] is `None`. docs/inbox.md, "Stripe".

use std::time::Duration;

use crate::headers::{single, Headers};
use crate::mac::{decode_hex_mac, split_secrets, to_hex, Keys, MAC_LEN};
use crate::scheme::{VerifiedEvent, WebhookScheme};
use crate::signature::{
    check_time, parse_unix_secs, secs_i64, SignatureError, DEFAULT_TOLERANCE, MAX_HEADER_LEN,
    MAX_SIGNATURES,
};
use idem_core::Error;
#[cfg(any(doc, test))]
use idem_core::Field;
use idem_signature::debug_without_secrets;

/// The header Stripe signs its deliveries in.
pub const STRIPE_SIGNATURE_HEADER: &str = "stripe-signature";

/// The secrets and timestamp tolerance of one sender's endpoint.
///
/// The whole secret string is the HMAC key, bytes as given (a `whsec_` prefix included), as
/// Stripe's libraries use it. `Debug` never shows the secrets.
///
/// ```
/// use idem_inbox::StripeScheme;
/// use std::time::Duration;
///
/// // During a rotation, configure both the new and the old secret.
/// let scheme = StripeScheme::new(["whsec_new", "whsec_old"])?.tolerance(Duration::from_secs(60));
/// let header = StripeScheme::new(["whsec_old"])?.sign(b"{}", 1_000);
/// assert!(scheme.verify(Some(&header), b"{}", 1_060).is_ok());
/// assert!(scheme.verify(Some(&header), b"{}", 1_061).is_err()); // 61 s old
/// # Ok::<(), idem_core::Error>(())
/// ```
#[derive(Clone)]
pub struct StripeScheme {
    /// One HMAC state per secret, already keyed (never empty).
    keys: Keys,
    /// Whole seconds.
    tolerance_secs: i64,
}

debug_without_secrets!(StripeScheme, tolerance_secs);

impl StripeScheme {
    /// A scheme with `secrets` (the first one signs in [`sign`](Self::sign)) and the
    /// [`DEFAULT_TOLERANCE`].
    ///
    /// Fails with [`Error::InvalidInput`] on [`Field::Config`] when there is no secret or a
    /// secret is empty.
    ///
    /// ```
    /// use idem_inbox::StripeScheme;
    /// assert!(StripeScheme::new(["whsec_a", "whsec_b"]).is_ok());
    /// assert!(StripeScheme::new(Vec::<&str>::new()).is_err());
    /// assert!(StripeScheme::new(["whsec_a", ""]).is_err());
    /// ```
    pub fn new(secrets: impl IntoIterator<Item = impl AsRef<[u8]>>) -> Result<Self, Error> {
        Ok(Self {
            keys: Keys::new(secrets, "webhook signature secret")?,
            tolerance_secs: secs_i64(DEFAULT_TOLERANCE),
        })
    }

    /// A scheme from a comma-separated list such as `"whsec_new, whsec_old"`, as kept in one
    /// environment variable. Spaces around each secret are trimmed and empty items skipped; at
    /// least one secret must remain (see [`new`](Self::new)).
    ///
    /// ```
    /// use idem_inbox::StripeScheme;
    /// let a = StripeScheme::from_comma_separated(" whsec_a ,whsec_b,")?;
    /// let b = StripeScheme::new(["whsec_a", "whsec_b"])?;
    /// assert_eq!(a.sign(b"x", 1), b.sign(b"x", 1));
    /// assert!(StripeScheme::from_comma_separated(" , ").is_err());
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn from_comma_separated(secrets: &str) -> Result<Self, Error> {
        Self::new(split_secrets(secrets))
    }

    /// The same scheme with a different timestamp tolerance, counted in whole seconds
    /// (fractions are dropped). A delivery signed exactly `tolerance` ago (or ahead) passes;
    /// one second more does not. `Duration::ZERO` accepts only `t == now`.
    ///
    /// ```
    /// use idem_inbox::StripeScheme;
    /// use std::time::Duration;
    /// let scheme = StripeScheme::new(["whsec_a"])?.tolerance(Duration::from_secs(10));
    /// assert_eq!(scheme.tolerance_secs(), 10);
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    #[must_use]
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance_secs = secs_i64(tolerance);
        self
    }

    /// The tolerance in whole seconds.
    ///
    /// ```
    /// use idem_inbox::StripeScheme;
    /// assert_eq!(StripeScheme::new(["whsec_a"])?.tolerance_secs(), 300);
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn tolerance_secs(&self) -> i64 {
        self.tolerance_secs
    }

    /// Checks `header` (the value of e.g. `Stripe-Signature`, `None` when the request has
    /// none) against the raw `body` at `now_unix` (unix seconds; pass
    /// [`now_unix()`](crate::now_unix) in production, a fixed value in tests).
    ///
    /// The signature is checked before the time, so [`SignatureError::Stale`] and
    /// [`SignatureError::Future`] are only ever reported for authentic deliveries; a forged
    /// header gets [`SignatureError::Mismatch`] whatever its `t`.
    ///
    /// ```
    /// use idem_inbox::{SignatureError, StripeScheme};
    /// let scheme = StripeScheme::new(["whsec_a"])?;
    /// let header = scheme.sign(b"{}", 1_000);
    /// assert_eq!(scheme.verify(Some(&header), b"{}", 1_300), Ok(()));
    /// assert_eq!(scheme.verify(Some(&header), b"{}", 1_301), Err(SignatureError::Stale { age_secs: 301 }));
    /// assert_eq!(scheme.verify(Some("t=1000"), b"{}", 1_000), Err(SignatureError::Malformed("no v1 signature")));
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn verify(
        &self,
        header: Option<&str>,
        body: &[u8],
        now_unix: i64,
    ) -> Result<(), SignatureError> {
        let header = header.ok_or(SignatureError::Missing)?;
        let parsed = parse_header(header)?;
        let candidates = parsed.candidates();

        // Every candidate against every secret, no early exit (see `Keys::any_matches`).
        if !self
            .keys
            .any_matches(&[parsed.t_raw.as_bytes(), b".", body], candidates)
        {
            return Err(SignatureError::Mismatch);
        }
        check_time(parsed.t, now_unix, self.tolerance_secs)
    }

    /// The header value a sender would put on `body` signed at `t` (unix seconds) with the
    /// first secret: `t=<t>,v1=<hex>`. Byte for byte what Stripe's libraries produce; for tests
    /// and for senders written with idem. A negative `t` gives a header that
    /// [`verify`](Self::verify) refuses as malformed.
    ///
    /// ```
    /// use idem_inbox::StripeScheme;
    /// let header = StripeScheme::new(["whsec_test_secret"])?.sign(b"", 1);
    /// assert_eq!(header, "t=1,v1=72a0d5db585ba2c43502db342967281f0d98f88ad9a739d64b64b0e90ec5b49c");
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn sign(&self, body: &[u8], t: i64) -> String {
        let t_raw = t.to_string();
        header(
            &t_raw,
            &[self.keys.first_mac(&[t_raw.as_bytes(), b".", body])],
        )
    }

    /// Like [`sign`](Self::sign), with one `v1` entry per secret in order: what a sender sends
    /// during a rotation, `t=<t>,v1=<hex>,v1=<hex>`.
    ///
    /// ```
    /// use idem_inbox::StripeScheme;
    /// let sender = StripeScheme::new(["whsec_new", "whsec_old"])?;
    /// let header = sender.sign_with_all_secrets(b"{}", 1_000);
    /// assert_eq!(header.matches(",v1=").count(), 2);
    /// // A receiver still on the old secret accepts it.
    /// assert!(StripeScheme::new(["whsec_old"])?.verify(Some(&header), b"{}", 1_000).is_ok());
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn sign_with_all_secrets(&self, body: &[u8], t: i64) -> String {
        let t_raw = t.to_string();
        header(&t_raw, &self.keys.macs(&[t_raw.as_bytes(), b".", body]))
    }
}

impl WebhookScheme for StripeScheme {
    fn name(&self) -> &'static str {
        "stripe"
    }

    /// Reads `Stripe-Signature` (once, visible ASCII, at most [`MAX_HEADER_LEN`] bytes) and
    /// checks it as [`StripeScheme::verify`] does. The event id is in the body, so the
    /// [`VerifiedEvent`] has none; `signed_at` is the header's `t`.
    fn verify(
        &self,
        headers: &dyn Headers,
        body: &[u8],
        now_unix: i64,
    ) -> Result<VerifiedEvent, SignatureError> {
        let header = single(headers, STRIPE_SIGNATURE_HEADER)?;
        StripeScheme::verify(self, header, body, now_unix)?;
        let signed_at = header.and_then(|h| parse_header(h).ok()).map(|p| p.t);
        Ok(VerifiedEvent::new(None, None, signed_at))
    }
}

/// `t=<t_raw>,v1=<hex>...`, one `v1` per MAC in order.
fn header(t_raw: &str, macs: &[[u8; MAC_LEN]]) -> String {
    let mut header = format!("t={t_raw}");
    for mac in macs {
        header.push_str(",v1=");
        header.push_str(&to_hex(mac));
    }
    header
}

/// What a signature header says.
struct Parsed<'a> {
    /// `t` exactly as sent (plain decimal digits), the signed prefix.
    t_raw: &'a str,
    /// `t` as a number.
    t: i64,
    /// The decodable `v1` candidates, `len` of them.
    sigs: [[u8; MAC_LEN]; MAX_SIGNATURES],
    len: usize,
}

impl Parsed<'_> {
    fn candidates(&self) -> &[[u8; MAC_LEN]] {
        self.sigs.get(..self.len).unwrap_or(&[])
    }
}

/// Reads `t=<digits>,v1=<hex>,...`: entries separated by commas, whitespace around entries,
/// keys and values ignored, unknown keys ignored, the first [`MAX_SIGNATURES`] `v1` entries
/// considered (those that are not 64 hex digits cannot match and are skipped).
fn parse_header(header: &str) -> Result<Parsed<'_>, SignatureError> {
    if header.len() > MAX_HEADER_LEN {
        return Err(SignatureError::Malformed("header too long"));
    }
    if header.trim().is_empty() {
        return Err(SignatureError::Malformed("empty header"));
    }
    let mut t: Option<(&str, i64)> = None;
    let mut v1_seen = 0usize;
    let mut sigs = [[0u8; MAC_LEN]; MAX_SIGNATURES];
    let mut len = 0usize;
    for entry in header.split(',') {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        let (key, value) = entry.split_once('=').unwrap_or((entry, ""));
        let (key, value) = (key.trim(), value.trim());
        match key {
            "t" => {
                if t.is_some() {
                    return Err(SignatureError::Malformed("more than one t"));
                }
                let n = parse_unix_secs(value).ok_or(SignatureError::Malformed(
                    "t is not a unix time in plain decimal",
                ))?;
                t = Some((value, n));
            }
            "v1" => {
                if v1_seen < MAX_SIGNATURES {
                    if let (Some(decoded), Some(slot)) = (decode_hex_mac(value), sigs.get_mut(len))
                    {
                        *slot = decoded;
                        len += 1;
                    }
                }
                v1_seen = v1_seen.saturating_add(1);
            }
            _ => {}
        }
    }
    let (t_raw, t) = t.ok_or(SignatureError::Malformed("no t timestamp"))?;
    if v1_seen == 0 {
        return Err(SignatureError::Malformed("no v1 signature"));
    }
    if len == 0 {
        return Err(SignatureError::Malformed(
            "no v1 signature of 64 hex digits",
        ));
    }
    Ok(Parsed {
        t_raw,
        t,
        sigs,
        len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    // Vectors that follow Stripe's documented scheme ("Verify webhook signatures manually":
    // the signed payload is `"<t>.<raw body>"`, each `v1` its lowercase hex HMAC-SHA256 under
    // the endpoint's secret, the whole `whsec_...` string as the key), recomputed
    // independently of this crate with Python's `hmac`, for each (secret, t, payload) below:
    //   python3 -c 'import hmac, hashlib; print(hmac.new(SECRET.encode(),
    //       f"{T}.{PAYLOAD}".encode(), hashlib.sha256).hexdigest())'
    const STRIPE_P1: &str = r#"{"id":"evt_1","object":"event","type":"payment_intent.succeeded"}"#;
    const STRIPE_P2: &str =
        "{\"id\":\"evt_2\",\"data\":{\"amount\":4200,\"currency\":\"eur\",\"note\":\"caf\u{e9} \u{2713}\"}}";
    const STRIPE_VECTORS: [(&str, i64, &str, &str); 3] = [
        (
            "whsec_test_secret",
            1_700_000_000,
            STRIPE_P1,
            "t=1700000000,v1=67da5088c63e080c71bd2bb0cb5c03d85a8fc6a21ce3aaf484df809654745b92",
        ),
        (
            // Non-ASCII body: signed over its UTF-8 bytes.
            "whsec_rotated_secret_2",
            1_712_345_678,
            STRIPE_P2,
            "t=1712345678,v1=b9c8af4d7d76ec51e8cda2d4b824832fde2a0f73d85f1ca282069ccd171997a1",
        ),
        (
            "whsec_test_secret",
            1,
            "",
            "t=1,v1=72a0d5db585ba2c43502db342967281f0d98f88ad9a739d64b64b0e90ec5b49c",
        ),
    ];

    // A rotation header under two secrets, plus a `v0` entry that must be ignored; each `v1`
    // recomputed with Python's `hmac` as above:
    //   a = hmac.new(b"whsec_old_secret", f"1700000000.{STRIPE_P1}".encode(), "sha256")
    //   b = hmac.new(b"whsec_new_secret", f"1700000000.{STRIPE_P1}".encode(), "sha256")
    //   f"t=1700000000,v1={a.hexdigest()},v1={b.hexdigest()},v0=deadbeef"
    const STRIPE_ROTATION_HEADER: &str = "t=1700000000,\
        v1=d68538c3431c25a11001054141750cd00f5ee519ed890f2d2816b9aa0f9c0586,\
        v1=65195e8242059ca0ff854d931b35febcef03e6ea5d55cea8050ea0e14abb96f7,v0=deadbeef";

    const BODY: &[u8] = br#"{"id":"evt_9","type":"charge.refunded"}"#;
    const T: i64 = 1_700_000_000;

    fn scheme(secrets: &[&str]) -> Result<StripeScheme, Error> {
        StripeScheme::new(secrets.iter().copied())
    }

    fn malformed(reason: &'static str) -> Result<(), SignatureError> {
        Err(SignatureError::Malformed(reason))
    }

    #[test]
    fn signatures_following_stripes_documented_scheme_verify() -> TestResult {
        for (secret, t, payload, header) in STRIPE_VECTORS {
            let s = scheme(&[secret])?;
            assert_eq!(
                s.verify(Some(header), payload.as_bytes(), t),
                Ok(()),
                "{header}"
            );
            assert_eq!(s.verify(Some(header), payload.as_bytes(), t + 300), Ok(()));
        }
        Ok(())
    }

    #[test]
    fn sign_produces_stripes_header_byte_for_byte() -> TestResult {
        for (secret, t, payload, header) in STRIPE_VECTORS {
            assert_eq!(scheme(&[secret])?.sign(payload.as_bytes(), t), header);
        }
        Ok(())
    }

    #[test]
    fn stripe_rotation_header_verifies_with_either_secret_or_both() -> TestResult {
        for secrets in [
            &["whsec_new_secret"][..],
            &["whsec_old_secret"],
            &["whsec_new_secret", "whsec_old_secret"],
            &["whsec_unrelated", "whsec_old_secret"],
        ] {
            let s = scheme(secrets)?;
            assert_eq!(
                s.verify(Some(STRIPE_ROTATION_HEADER), STRIPE_P1.as_bytes(), T),
                Ok(()),
                "{secrets:?}"
            );
        }
        let s = scheme(&["whsec_unrelated"])?;
        assert_eq!(
            s.verify(Some(STRIPE_ROTATION_HEADER), STRIPE_P1.as_bytes(), T),
            Err(SignatureError::Mismatch)
        );
        Ok(())
    }

    #[test]
    fn sender_rotating_is_accepted_by_receiver_with_new_secret_only_or_both() -> TestResult {
        let sender = scheme(&["whsec_new", "whsec_old"])?;
        let header = sender.sign_with_all_secrets(BODY, T);
        assert_eq!(header.matches("v1=").count(), 2);
        for receiver in [
            &["whsec_new"][..],
            &["whsec_old"],
            &["whsec_old", "whsec_new"],
        ] {
            assert_eq!(scheme(receiver)?.verify(Some(&header), BODY, T), Ok(()));
        }
        Ok(())
    }

    #[test]
    fn receiver_rotating_accepts_sender_on_old_or_new_secret() -> TestResult {
        let receiver = scheme(&["whsec_new", "whsec_old"])?;
        for sender in ["whsec_new", "whsec_old"] {
            let header = scheme(&[sender])?.sign(BODY, T);
            assert_eq!(receiver.verify(Some(&header), BODY, T), Ok(()));
        }
        Ok(())
    }

    #[test]
    fn a_secret_we_do_not_have_is_a_mismatch() -> TestResult {
        let header = scheme(&["whsec_theirs"])?.sign(BODY, T);
        let ours = scheme(&["whsec_ours", "whsec_ours_old"])?;
        assert_eq!(
            ours.verify(Some(&header), BODY, T),
            Err(SignatureError::Mismatch)
        );
        Ok(())
    }

    #[test]
    fn body_changed_by_one_byte_is_a_mismatch() -> TestResult {
        let s = scheme(&["whsec_a"])?;
        let header = s.sign(BODY, T);
        for i in 0..BODY.len() {
            let mut body = BODY.to_vec();
            if let Some(byte) = body.get_mut(i) {
                *byte ^= 0x01;
            }
            assert_eq!(
                s.verify(Some(&header), &body, T),
                Err(SignatureError::Mismatch)
            );
        }
        let mut longer = BODY.to_vec();
        longer.push(b' ');
        assert_eq!(
            s.verify(Some(&header), &longer, T),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            s.verify(Some(&header), BODY.get(..BODY.len() - 1).unwrap_or(&[]), T),
            Err(SignatureError::Mismatch)
        );
        Ok(())
    }

    #[test]
    fn t_changed_is_a_mismatch() -> TestResult {
        let s = scheme(&["whsec_a"])?;
        let header = s.sign(BODY, T);
        let moved = header.replace("t=1700000000", "t=1700000001");
        assert_ne!(moved, header);
        assert_eq!(
            s.verify(Some(&moved), BODY, T),
            Err(SignatureError::Mismatch)
        );
        Ok(())
    }

    #[test]
    fn t_with_leading_zero_is_malformed_not_reinterpreted() -> TestResult {
        // Stripe's libraries sign the re-formatted number; refusing non-canonical `t` keeps
        // "t as sent" and "t as a number" the same bytes.
        let s = scheme(&["whsec_a"])?;
        let header = s.sign(BODY, T).replace("t=", "t=0");
        assert_eq!(
            s.verify(Some(&header), BODY, T),
            malformed("t is not a unix time in plain decimal")
        );
        Ok(())
    }

    #[test]
    fn stale_by_tolerance_plus_one_second_is_refused() -> TestResult {
        let s = scheme(&["whsec_a"])?;
        let header = s.sign(BODY, T);
        assert_eq!(
            s.verify(Some(&header), BODY, T + 301),
            Err(SignatureError::Stale { age_secs: 301 })
        );
        let tight = s.clone().tolerance(Duration::from_secs(5));
        assert_eq!(
            tight.verify(Some(&header), BODY, T + 6),
            Err(SignatureError::Stale { age_secs: 6 })
        );
        Ok(())
    }

    #[test]
    fn exactly_at_tolerance_is_accepted_both_ways() -> TestResult {
        let s = scheme(&["whsec_a"])?;
        let header = s.sign(BODY, T);
        assert_eq!(s.verify(Some(&header), BODY, T + 300), Ok(()));
        assert_eq!(s.verify(Some(&header), BODY, T - 300), Ok(()));
        let tight = s.clone().tolerance(Duration::from_millis(5_999));
        assert_eq!(tight.tolerance_secs(), 5);
        assert_eq!(tight.verify(Some(&header), BODY, T + 5), Ok(()));
        let zero = s.tolerance(Duration::ZERO);
        assert_eq!(zero.verify(Some(&header), BODY, T), Ok(()));
        assert_eq!(
            zero.verify(Some(&header), BODY, T + 1),
            Err(SignatureError::Stale { age_secs: 1 })
        );
        Ok(())
    }

    #[test]
    fn future_beyond_tolerance_is_refused() -> TestResult {
        let s = scheme(&["whsec_a"])?;
        let header = s.sign(BODY, T);
        assert_eq!(
            s.verify(Some(&header), BODY, T - 301),
            Err(SignatureError::Future { ahead_secs: 301 })
        );
        Ok(())
    }

    #[test]
    fn forged_header_is_a_mismatch_whatever_its_time() -> TestResult {
        let s = scheme(&["whsec_a"])?;
        let forged = scheme(&["whsec_b"])?.sign(BODY, 5);
        assert_eq!(
            s.verify(Some(&forged), BODY, T),
            Err(SignatureError::Mismatch)
        );
        Ok(())
    }

    #[test]
    fn missing_header_is_refused() -> TestResult {
        let s = scheme(&["whsec_a"])?;
        assert_eq!(s.verify(None, BODY, T), Err(SignatureError::Missing));
        assert_eq!(SignatureError::Missing.http_status(), 400);
        Ok(())
    }

    #[test]
    fn malformed_headers_are_refused() -> TestResult {
        let s = scheme(&["whsec_a"])?;
        let good_v1 = s
            .sign(BODY, T)
            .split_once(",v1=")
            .map(|(_, v1)| v1.to_owned())
            .unwrap_or_default();
        assert_eq!(good_v1.len(), 64);
        let cases: Vec<(String, &'static str)> = vec![
            (String::new(), "empty header"),
            ("  ".into(), "empty header"),
            (
                format!("t=abc,v1={good_v1}"),
                "t is not a unix time in plain decimal",
            ),
            (
                format!("t=,v1={good_v1}"),
                "t is not a unix time in plain decimal",
            ),
            (
                format!("t,v1={good_v1}"),
                "t is not a unix time in plain decimal",
            ),
            (
                format!("t=-1,v1={good_v1}"),
                "t is not a unix time in plain decimal",
            ),
            (
                format!("t=+1,v1={good_v1}"),
                "t is not a unix time in plain decimal",
            ),
            (
                format!("t=1.5,v1={good_v1}"),
                "t is not a unix time in plain decimal",
            ),
            (
                format!("t=99999999999999999999,v1={good_v1}"),
                "t is not a unix time in plain decimal",
            ),
            (format!("v1={good_v1}"), "no t timestamp"),
            (format!("v0=abc,v1={good_v1}"), "no t timestamp"),
            ("t=1700000000".into(), "no v1 signature"),
            ("t=1700000000,v0=abcd".into(), "no v1 signature"),
            ("t=1,v1=zz".into(), "no v1 signature of 64 hex digits"),
            ("t=1,v1=".into(), "no v1 signature of 64 hex digits"),
            (
                format!("t=1,v1={}", "g".repeat(64)),
                "no v1 signature of 64 hex digits",
            ),
            (
                format!("t=1,v1={good_v1}00"),
                "no v1 signature of 64 hex digits",
            ),
            (format!("t={T},t={T},v1={good_v1}"), "more than one t"),
            ("garbage".into(), "no t timestamp"),
            (",,,".into(), "no t timestamp"),
            (
                "t=1,v1=\u{e9}\u{e9}".into(),
                "no v1 signature of 64 hex digits",
            ),
        ];
        for (header, reason) in cases {
            assert_eq!(
                s.verify(Some(&header), BODY, T),
                malformed(reason),
                "{header:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn a_non_hex_v1_beside_a_good_one_is_skipped() -> TestResult {
        let s = scheme(&["whsec_a"])?;
        let header = s
            .sign(BODY, T)
            .replace("t=1700000000,", "t=1700000000,v1=zz,");
        assert_eq!(s.verify(Some(&header), BODY, T), Ok(()));
        Ok(())
    }

    #[test]
    fn uppercase_hex_verifies() -> TestResult {
        let s = scheme(&["whsec_a"])?;
        let header = s
            .sign(BODY, T)
            .to_ascii_uppercase()
            .replace("T=", "t=")
            .replace("V1=", "v1=");
        assert_eq!(s.verify(Some(&header), BODY, T), Ok(()));
        Ok(())
    }

    #[test]
    fn very_long_header_is_refused_without_panic() -> TestResult {
        let s = scheme(&["whsec_a"])?;
        let good = s.sign(BODY, T);
        let huge = format!("{good},{}", "x".repeat(100 * 1024));
        assert_eq!(s.verify(Some(&huge), BODY, T), malformed("header too long"));
        let huge_v1s = format!("{good}{}", ",v1=00".repeat(100 * 1024 / 6));
        assert!(huge_v1s.len() > 100 * 1024);
        assert_eq!(
            s.verify(Some(&huge_v1s), BODY, T),
            malformed("header too long")
        );
        let no_commas = "t".repeat(100 * 1024);
        assert_eq!(
            s.verify(Some(&no_commas), BODY, T),
            malformed("header too long")
        );
        Ok(())
    }

    #[test]
    fn only_the_first_sixteen_v1_entries_are_considered() -> TestResult {
        let s = scheme(&["whsec_a"])?;
        let good = s.sign(BODY, T);
        let good_v1 = good.split_once(",v1=").map(|(_, v)| v).unwrap_or_default();
        let decoy = format!(",v1={}", "0".repeat(64));
        let fifteen = decoy.repeat(MAX_SIGNATURES - 1);
        let last_considered = format!("t={T}{fifteen},v1={good_v1}");
        assert!(last_considered.len() <= MAX_HEADER_LEN);
        assert_eq!(s.verify(Some(&last_considered), BODY, T), Ok(()));
        let sixteen = decoy.repeat(MAX_SIGNATURES);
        let beyond = format!("t={T}{sixteen},v1={good_v1}");
        assert_eq!(
            s.verify(Some(&beyond), BODY, T),
            Err(SignatureError::Mismatch)
        );
        Ok(())
    }

    #[test]
    fn whitespace_around_entries_is_ignored() -> TestResult {
        let s = scheme(&["whsec_a"])?;
        let good = s.sign(BODY, T);
        let good_v1 = good.split_once(",v1=").map(|(_, v)| v).unwrap_or_default();
        for header in [
            format!(" t={T} , v1={good_v1} "),
            format!("t = {T},\tv1 = {good_v1}"),
            format!("t={T}, v0=ignored ,v1={good_v1},"),
        ] {
            assert_eq!(s.verify(Some(&header), BODY, T), Ok(()), "{header:?}");
        }
        Ok(())
    }

    #[test]
    fn entries_in_any_order_and_other_schemes_are_ignored() -> TestResult {
        let s = scheme(&["whsec_a"])?;
        let good = s.sign(BODY, T);
        let good_v1 = good.split_once(",v1=").map(|(_, v)| v).unwrap_or_default();
        let header = format!("v0={good_v1},v1={good_v1},t={T},v2=zz");
        assert_eq!(s.verify(Some(&header), BODY, T), Ok(()));
        // A right MAC under the wrong scheme name does not count.
        let only_v0 = format!("t={T},v0={good_v1}");
        assert_eq!(
            s.verify(Some(&only_v0), BODY, T),
            malformed("no v1 signature")
        );
        Ok(())
    }

    #[test]
    fn secrets_are_whole_strings_including_prefix() -> TestResult {
        let header = scheme(&["whsec_abc"])?.sign(BODY, T);
        assert_eq!(
            scheme(&["abc"])?.verify(Some(&header), BODY, T),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            StripeScheme::from_comma_separated("whsec_zzz, whsec_abc ")?.verify(
                Some(&header),
                BODY,
                T
            ),
            Ok(())
        );
        Ok(())
    }

    #[test]
    fn configuration_without_a_usable_secret_is_refused() {
        for result in [
            StripeScheme::new(Vec::<Vec<u8>>::new()),
            StripeScheme::new([""]),
            StripeScheme::new(["whsec_a", ""]),
            StripeScheme::from_comma_separated(""),
            StripeScheme::from_comma_separated(" , ,"),
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

    #[test]
    fn debug_does_not_show_secrets() -> TestResult {
        let s = scheme(&["whsec_very_secret"])?;
        let shown = format!("{s:?}");
        assert!(!shown.contains("very_secret"), "{shown}");
        assert!(shown.contains("secrets: 1"), "{shown}");
        Ok(())
    }

    #[test]
    fn extreme_times_do_not_overflow() -> TestResult {
        let s = scheme(&["whsec_a"])?;
        let max = s.sign(BODY, i64::MAX);
        assert_eq!(
            s.verify(Some(&max), BODY, i64::MIN),
            Err(SignatureError::Future {
                ahead_secs: i64::MAX
            })
        );
        let zero = s.sign(BODY, 0);
        assert_eq!(
            s.verify(Some(&zero), BODY, i64::MAX),
            Err(SignatureError::Stale { age_secs: i64::MAX })
        );
        let wide = s.clone().tolerance(Duration::MAX);
        assert_eq!(wide.tolerance_secs(), i64::MAX);
        assert_eq!(wide.verify(Some(&zero), BODY, i64::MAX), Ok(()));
        Ok(())
    }

    #[test]
    fn negative_t_from_sign_is_refused_as_malformed() -> TestResult {
        let s = scheme(&["whsec_a"])?;
        let header = s.sign(BODY, -5);
        assert_eq!(
            s.verify(Some(&header), BODY, 0),
            malformed("t is not a unix time in plain decimal")
        );
        Ok(())
    }

    #[test]
    fn as_a_webhook_scheme_it_reads_stripe_signature_and_leaves_the_id_to_the_body() -> TestResult {
        let s = scheme(&["whsec_a"])?;
        let header = s.sign(BODY, T);
        let headers = [("Stripe-Signature", header.as_str())];
        let event = WebhookScheme::verify(&s, &headers, BODY, T)?;
        assert_eq!(event, VerifiedEvent::new(None, None, Some(T)));
        assert_eq!(s.name(), "stripe");
        let none: [(&str, &str); 0] = [];
        assert_eq!(
            WebhookScheme::verify(&s, &none, BODY, T),
            Err(SignatureError::Missing)
        );
        let twice = [
            ("stripe-signature", header.as_str()),
            ("Stripe-Signature", header.as_str()),
        ];
        assert_eq!(
            WebhookScheme::verify(&s, &twice, BODY, T),
            Err(SignatureError::Malformed("header sent more than once"))
        );
        assert_eq!(
            WebhookScheme::verify(&s, &headers, b"{}", T),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            WebhookScheme::verify(&s, &headers, BODY, T + 301),
            Err(SignatureError::Stale { age_secs: 301 })
        );
        Ok(())
    }
}
