//! The caller's deadline, `grpc-timeout`: it lowers the store budget of its request (C13).

use http::HeaderMap;
use std::time::Duration;

/// The `grpc-timeout` of a call (gRPC over HTTP/2: at most eight digits and a unit, `H`, `M`,
/// `S`, `m`, `u` or `n`); `None` when absent or malformed.
pub(crate) fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let split = value.len().checked_sub(1)?;
    let (digits, unit) = value.split_at(split);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout(value: &str) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-timeout", value.parse().expect("a header value"));
        grpc_timeout(&headers)
    }

    /// C13: every unit of the gRPC spec reads; anything else is no deadline, never a panic.
    #[test]
    fn c13_grpc_timeout_reads_every_unit_and_refuses_the_rest() {
        assert_eq!(timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(timeout("3S"), Some(Duration::from_secs(3)));
        assert_eq!(timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(
            timeout("99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(timeout("10n"), Some(Duration::from_nanos(10)));
        for bad in ["", "S", "123456789S", "-1S", "1s", "1.5S", "1 S", "１S"] {
            let mut headers = HeaderMap::new();
            if let Ok(value) = bad.parse() {
                headers.insert("grpc-timeout", value);
            }
            assert_eq!(grpc_timeout(&headers), None, "{bad:?}");
        }
        assert_eq!(grpc_timeout(&HeaderMap::new()), None);
    }
}
