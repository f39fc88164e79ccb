//! A decision about a record in doubt (store rule 7), as `lua/resolve.lua` takes it: the fence
//! (token, mark as read), the change, and the audit entry with how long it is kept.

use idem_core::store::{duration_millis, Decided, Resolution};
use idem_ops::ListQuery;
use redis::ScriptInvocation;
use std::time::Duration;

/// The longest delay the script is given, in milliseconds: about a hundred years, so that
/// Redis's `now` plus it stays exact in Lua's numbers (doubles) and is a time `PEXPIREAT`
/// takes. A longer retention, delay or audit retention is cut to it.
const MAX_DELAY_MS: i64 = 100 * 366 * 24 * 3600 * 1000;

fn millis(duration: Duration) -> i64 {
    duration_millis(duration).min(MAX_DELAY_MS)
}

/// Fills `invocation` (of `lua/resolve.lua`) for `resolution` on the record at `record_key`,
/// whose audit trail is at `trail_key`.
pub(crate) fn prepare(
    invocation: &mut ScriptInvocation<'_>,
    resolution: &Resolution,
    record_key: &str,
    trail_key: &str,
) {
    let (change, payload, delay): (&str, &[u8], i64) = match resolution.decided() {
        Decided::Settled { .. } => ("s", resolution.response(), millis(resolution.retain_for())),
        Decided::Released => ("r", b"", 0),
        Decided::StillUnknown { retry_after, .. } => ("d", resolution.doubt(), millis(retry_after)),
        // A decision this release does not know: the script refuses it, nothing written.
        _ => ("?", b"", 0),
    };
    invocation
        .key(record_key)
        .key(trail_key)
        .arg(resolution.token().as_bytes().as_slice())
        .arg(resolution.read_doubt())
        .arg(change)
        .arg(payload)
        .arg(delay)
        .arg(resolution.entry())
        .arg(millis(resolution.keep_entry_for()))
        .arg(ListQuery::MAX_LIMIT);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_stay_exact_in_lua_numbers() {
        // Redis's now until the year 9999, plus the longest delay, below 2^53.
        let latest_now: i64 = 253_402_300_799_999;
        assert!(latest_now + MAX_DELAY_MS < 1 << 53);
        assert_eq!(millis(Duration::MAX), MAX_DELAY_MS);
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
    }
}
