//! `Retry-After` (RFC 9110 §10.2.3): delta-seconds or an HTTP-date, as a duration from now.

use std::time::{Duration, SystemTime};

/// The wait a `Retry-After` value asks for, measured from `now`: delta-seconds (`120`) or an
/// HTTP-date (`Fri, 31 Dec 1999 23:59:59 GMT`, or its obsolete RFC 850 and asctime forms). A
/// date already passed is a zero wait; a number too large for a `u64` is [`Duration::MAX`].
/// `None` for anything else (a negative or fractional number, an empty value, text): an
/// unreadable `Retry-After` is ignored, as if absent.
///
/// ```
/// use idem_client::parse_retry_after;
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
///
/// let now = UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
/// assert_eq!(parse_retry_after("2", now), Some(Duration::from_secs(2)));
/// assert_eq!(
///     parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now),
///     Some(Duration::from_secs(30))
/// );
/// assert_eq!(parse_retry_after("soon", now), None);
/// # let _ = SystemTime::now();
/// ```
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    if value.bytes().all(|b| b.is_ascii_digit()) {
        return Some(match value.parse::<u64>() {
            Ok(seconds) => Duration::from_secs(seconds),
            // All digits but beyond u64: a wait longer than any deadline.
            Err(_) => Duration::MAX,
        });
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    /// Sun, 06 Nov 1994 08:49:37 GMT: the date of RFC 9110's own examples (§5.6.7).
    fn rfc_example_now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(784_111_777)
    }

    #[test]
    fn delta_seconds_are_whole_non_negative_numbers() {
        let now = rfc_example_now();
        let table: &[(&str, Option<Duration>)] = &[
            ("0", Some(Duration::ZERO)),
            ("1", Some(Duration::from_secs(1))),
            (" 120 ", Some(Duration::from_secs(120))),
            ("007", Some(Duration::from_secs(7))),
            ("99999999999999999999999", Some(Duration::MAX)),
            ("-1", None),
            ("1.5", None),
            ("+3", None),
            ("", None),
            ("   ", None),
            ("1 2", None),
            ("soon", None),
        ];
        for (value, expected) in table {
            assert_eq!(parse_retry_after(value, now), *expected, "{value:?}");
        }
    }

    #[test]
    fn http_dates_in_all_three_forms_are_waits_from_now() {
        let now = rfc_example_now();
        // The three forms RFC 9110 §5.6.7 gives for one instant, here 60 s after `now`.
        for value in [
            "Sun, 06 Nov 1994 08:50:37 GMT",
            "Sunday, 06-Nov-94 08:50:37 GMT",
            "Sun Nov  6 08:50:37 1994",
        ] {
            assert_eq!(
                parse_retry_after(value, now),
                Some(Duration::from_secs(60)),
                "{value:?}"
            );
        }
    }

    #[test]
    fn a_date_in_the_past_is_no_wait_and_a_bad_date_is_ignored() {
        let now = rfc_example_now();
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(
            parse_retry_after("Sun, 32 Nov 1994 08:49:00 GMT", now),
            None
        );
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994", now), None);
    }
}
