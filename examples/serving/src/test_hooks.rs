//! What the servers' test hooks read from a request (only when `IDEM_TEST_HOOKS=1`).

use axum::http::HeaderMap;
use std::time::Duration;

/// The longest delay `X-Test-Delay-Ms` asks for that is honoured.
pub const MAX_TEST_DELAY: Duration = Duration::from_secs(120);

/// `X-Test-Delay-Ms`: how long a test asks the request to pause, at most [`MAX_TEST_DELAY`];
/// `None` without the header or with a value that is not a whole number.
pub fn test_delay(headers: &HeaderMap) -> Option<Duration> {
    let ms: u64 = headers
        .get("x-test-delay-ms")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_millis(ms).min(MAX_TEST_DELAY))
}
