//! Time (C11): a millisecond timestamp and an injectable clock for local-clock stores.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, as stores persist lease deadlines and expiries.
///
/// ```
/// use idem_core::Timestamp;
/// use std::time::Duration;
/// let t = Timestamp::from_millis(1_000);
/// assert_eq!(t + Duration::from_millis(500), Timestamp::from_millis(1_500));
/// assert_eq!(Timestamp::from_millis(1_500).saturating_since(t), Duration::from_millis(500));
/// assert_eq!(t.saturating_since(Timestamp::from_millis(1_500)), Duration::ZERO);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Timestamp {
    /// A timestamp `millis` milliseconds after the epoch.
    pub const fn from_millis(millis: u64) -> Self {
        Self(millis)
    }

    /// Milliseconds since the epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// The time from `earlier` to `self`, or zero when `earlier` is later.
    pub fn saturating_since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

impl std::ops::Add<Duration> for Timestamp {
    type Output = Timestamp;
    fn add(self, rhs: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(millis_u64(rhs)))
    }
}

fn millis_u64(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// For stores: `duration` in whole milliseconds, saturating (SQL `bigint`, Redis `PX`).
///
/// ```
/// use idem_core::store::duration_millis;
/// use std::time::Duration;
/// assert_eq!(duration_millis(Duration::from_millis(1_500)), 1_500);
/// assert_eq!(duration_millis(Duration::MAX), i64::MAX);
/// ```
pub fn duration_millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// For stores: `at` in milliseconds since the epoch as a signed integer, saturating.
///
/// ```
/// use idem_core::store::timestamp_millis;
/// use idem_core::Timestamp;
/// assert_eq!(timestamp_millis(Timestamp::from_millis(42)), 42);
/// assert_eq!(timestamp_millis(Timestamp::from_millis(u64::MAX)), i64::MAX);
/// ```
pub fn timestamp_millis(at: Timestamp) -> i64 {
    i64::try_from(at.as_millis()).unwrap_or(i64::MAX)
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({}ms)", self.0)
    }
}

/// Where a local-clock store (memory, SQLite) reads `now` from (C11).
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time.
    fn now(&self) -> Timestamp;

    /// Whether this is the process's wall clock, which runs with its monotonic clock (a
    /// [`ReplayCache`](crate::ReplayCache) counts a record's retention on the latter). Default
    /// false: a store on another clock caches nothing.
    fn is_system(&self) -> bool {
        false
    }
}

/// The process's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn is_system(&self) -> bool {
        true
    }

    fn now(&self) -> Timestamp {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Timestamp(millis_u64(since))
    }
}

/// A clock that moves only when told to; clones share the same time. For tests.
///
/// ```
/// use idem_core::{Clock, ManualClock, Timestamp};
/// use std::time::Duration;
/// let clock = ManualClock::new(Timestamp::from_millis(10));
/// let same = clock.clone();
/// clock.advance(Duration::from_secs(1));
/// assert_eq!(same.now(), Timestamp::from_millis(1_010));
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self(Arc::new(AtomicU64::new(start.0)))
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(millis_u64(by), Ordering::SeqCst);
    }

    /// Sets the clock.
    pub fn set(&self, to: Timestamp) {
        self.0.store(to.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}
