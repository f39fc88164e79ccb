//! Origin verification of webhook deliveries, before anything is recorded: the errors and
//! limits every scheme shares, and the helpers for timestamped schemes.
//!
//! Every scheme (this crate's [`StandardWebhooks`](crate::StandardWebhooks), idem-inbox's
//! Stripe, GitHub and Shopify schemes) reports its failures with the same [`SignatureError`]
//! and keeps the same bounds ([`MAX_HEADER_LEN`], [`MAX_SIGNATURES`]).
//!
//! ```
//! use idem_signature::{SignatureError, StandardWebhooks, WebhookScheme};
//!
//! let scheme = StandardWebhooks::from_comma_separated("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
//! let body = br#"{"id":"evt_1"}"#;
//! let signature = scheme.sign("msg_1", 1_700_000_000, body);
//! let headers = [("webhook-id", "msg_1"), ("webhook-timestamp", "1700000000"), ("webhook-signature", signature.as_str())];
//! assert!(scheme.verify(&headers, body, 1_700_000_010).is_ok());
//! assert_eq!(scheme.verify(&headers, b"{}", 1_700_000_010).err(), Some(SignatureError::Mismatch));
//! assert_eq!(scheme.verify(&headers[..2].to_vec(), body, 1_700_000_010).err(), Some(SignatureError::Missing));
//! # Ok::<(), idem_core::Error>(())
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The tolerance a new timestamped scheme starts with: 300 seconds, Stripe's default and the
/// Standard Webhooks reference libraries'.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// At most this many signature entries of one header are considered; later ones are ignored
/// (so a header stuffed with candidates costs bounded work).
pub const MAX_SIGNATURES: usize = 16;

/// A signature header (or any header a scheme reads) longer than this many bytes is refused
/// as malformed without parsing.
pub const MAX_HEADER_LEN: usize = 8 * 1024;

/// An id or name taken from a header (`webhook-id`, `X-GitHub-Delivery`, `X-GitHub-Event`,
/// `X-Shopify-Topic`, `X-Shopify-Event-Id`) longer than this many bytes is refused as
/// malformed: senders' ids and names are a few dozen bytes.
pub const MAX_EVENT_ID_LEN: usize = 255;

/// Why a delivery's signature was refused. Every variant is the sender's problem (400).
///
/// ```
/// use idem_signature::signature::SignatureError;
/// let err = SignatureError::Stale { age_secs: 301 };
/// assert_eq!(err.http_status(), 400);
/// assert_eq!(err.to_string(), "signature timestamp is 301 s old, over the tolerance");
/// assert_eq!(SignatureError::MissingHeader("webhook-id").to_string(), "missing header webhook-id");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignatureError {
    /// The request carries no signature header.
    #[error("missing signature header")]
    Missing,
    /// A header the scheme needs beside the signature (the event id, the timestamp) is absent
    /// or empty; it carries the header's name.
    #[error("missing header {0}")]
    MissingHeader(&'static str),
    /// A header cannot be read: empty, too long, sent twice, not visible ASCII, a wrong
    /// prefix, a timestamp that is not a unix time in plain decimal, no signature entry, or
    /// none in the encoding the scheme uses (64 hex digits, 44 characters of base64).
    #[error("malformed signature header: {0}")]
    Malformed(&'static str),
    /// No signature matches the body under any configured secret: the body or a signed
    /// header was altered, or the sender signs with a secret we do not have.
    #[error("no signature matches the body under any configured secret")]
    Mismatch,
    /// Authentic, but signed longer ago than the tolerance: possibly a captured request replayed.
    #[error("signature timestamp is {age_secs} s old, over the tolerance")]
    Stale {
        /// How many seconds before `now` the delivery was signed.
        age_secs: i64,
    },
    /// Authentic, but dated further in the future than the tolerance.
    #[error("signature timestamp is {ahead_secs} s in the future, over the tolerance")]
    Future {
        /// How many seconds after `now` the delivery claims to be signed.
        ahead_secs: i64,
    },
    /// The request carries headers of two sets that name the same thing (Standard Webhooks'
    /// `webhook-*` and Svix's `svix-*`): which one was signed cannot be told, so neither is
    /// believed. It carries the two prefixes.
    #[error("headers of both the {0}* and the {1}* sets: send one set only")]
    MixedHeaderSets(&'static str, &'static str),
}

impl SignatureError {
    /// The HTTP status to answer with: 400 for every variant (the sender's problem; Stripe
    /// expects a 400 for a delivery that fails verification, and retries it).
    ///
    /// ```
    /// use idem_signature::signature::SignatureError;
    /// assert_eq!(SignatureError::Mismatch.http_status(), 400);
    /// assert_eq!(SignatureError::Missing.http_status(), 400);
    /// ```
    pub fn http_status(&self) -> u16 {
        match self {
            SignatureError::Missing
            | SignatureError::MissingHeader(_)
            | SignatureError::Malformed(_)
            | SignatureError::Mismatch
            | SignatureError::Stale { .. }
            | SignatureError::Future { .. }
            | SignatureError::MixedHeaderSets(..) => 400,
        }
    }
}

/// The current time in unix seconds (negative before 1970), from the system clock.
///
/// ```
/// let now = idem_signature::signature::now_unix();
/// assert!(now > 1_600_000_000);
/// ```
pub fn now_unix() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(since) => secs_i64(since),
        Err(before) => secs_i64(before.duration()).saturating_neg(),
    }
}

/// Whole seconds of `d`, saturating at `i64::MAX`.
pub fn secs_i64(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// A unix time in canonical decimal: ASCII digits only, no sign, no leading zero (unless it is
/// `0`), fitting an `i64`. Canonical, so the signed bytes (the time as sent) are the same as
/// those of senders that re-format the parsed number (Stripe's libraries and the Standard
/// Webhooks reference libraries do).
pub fn parse_unix_secs(value: &str) -> Option<i64> {
    let bytes = value.as_bytes();
    let canonical = !bytes.is_empty()
        && bytes.iter().all(u8::is_ascii_digit)
        && (bytes.len() == 1 || !bytes.starts_with(b"0"));
    if !canonical {
        return None;
    }
    value.parse().ok()
}

/// Judges a signing time `t` against `now_unix` with a tolerance of `tolerance_secs`: exactly
/// at the tolerance (either way) passes, one second more is [`SignatureError::Stale`] or
/// [`SignatureError::Future`]. Saturating, so extreme values never overflow.
pub fn check_time(t: i64, now_unix: i64, tolerance_secs: i64) -> Result<(), SignatureError> {
    let age = now_unix.saturating_sub(t);
    if age > tolerance_secs {
        return Err(SignatureError::Stale { age_secs: age });
    }
    let ahead = t.saturating_sub(now_unix);
    if ahead > tolerance_secs {
        return Err(SignatureError::Future { ahead_secs: ahead });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_is_a_400() {
        for err in [
            SignatureError::Missing,
            SignatureError::MissingHeader("webhook-id"),
            SignatureError::Malformed("x"),
            SignatureError::Mismatch,
            SignatureError::Stale { age_secs: 1 },
            SignatureError::Future { ahead_secs: 1 },
            SignatureError::MixedHeaderSets("webhook-", "svix-"),
        ] {
            assert_eq!(err.http_status(), 400);
        }
    }

    #[test]
    fn now_unix_follows_the_system_clock() {
        let now = now_unix();
        let system = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(secs_i64)
            .unwrap_or(0);
        assert!((now - system).abs() <= 1);
    }

    #[test]
    fn time_check_accepts_exactly_the_tolerance_and_refuses_one_second_more() {
        assert_eq!(check_time(1_000, 1_300, 300), Ok(()));
        assert_eq!(check_time(1_000, 700, 300), Ok(()));
        assert_eq!(
            check_time(1_000, 1_301, 300),
            Err(SignatureError::Stale { age_secs: 301 })
        );
        assert_eq!(
            check_time(1_000, 699, 300),
            Err(SignatureError::Future { ahead_secs: 301 })
        );
        assert_eq!(
            check_time(i64::MAX, i64::MIN, 0),
            Err(SignatureError::Future {
                ahead_secs: i64::MAX
            })
        );
    }

    #[test]
    fn unix_seconds_must_be_canonical_decimal() {
        assert_eq!(parse_unix_secs("0"), Some(0));
        assert_eq!(parse_unix_secs("1700000000"), Some(1_700_000_000));
        for bad in [
            "",
            "01",
            "+1",
            "-1",
            "1.5",
            "1e3",
            " 1",
            "99999999999999999999",
            "\u{661}",
        ] {
            assert_eq!(parse_unix_secs(bad), None, "{bad:?}");
        }
    }
}
