//! What the examples' end-to-end tests share: a server run as a real child process that is
//! always killed ([`ServerProcess`]), one complete HTTP answer ([`Reply`]), a raw TCP client
//! for slow and stalled clients ([`RawClient`]) and what the tests assert with them
//! ([`slow`]), waiting for what a server does after it answered ([`poll`]), random numbers and
//! error chains. Each example's `tests/support` builds its own server command and client on it.

mod poll;
mod process;
mod raw;
mod reply;
pub mod slow;

pub use poll::poll;
pub use process::ServerProcess;
pub use raw::{Closed, RawClient};
pub use reply::Reply;

use std::collections::hash_map::RandomState;
use std::fmt::Write as _;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A random 64-bit number (std only: a freshly keyed SipHash over a counter, the clock, the pid).
pub fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// An error and its sources, `: `-separated (a transport failure's whole story).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let _ = write!(out, ": {s}");
        source = s.source();
    }
    out
}
