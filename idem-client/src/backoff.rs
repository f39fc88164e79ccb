//! Exponential backoff with full jitter: the pause before a retry is uniform in
//! `[0, min(max, initial × 2^(retry − 1))]`.

use std::time::Duration;

/// Exponential backoff with full jitter.
///
/// Full jitter (a uniform pause between zero and the exponential ceiling) spreads the retries of
/// many clients that failed at the same moment, so they do not come back in step; a server that
/// knows better says so with `Retry-After`, which the client honours on top of this (see
/// [`RetryPolicy`](crate::RetryPolicy)).
///
/// ```
/// use idem_client::Backoff;
/// use std::time::Duration;
///
/// let backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(5));
/// assert_eq!(backoff.ceiling(1), Duration::from_millis(500));
/// assert_eq!(backoff.ceiling(3), Duration::from_secs(2));
/// assert_eq!(backoff.ceiling(10), Duration::from_secs(5));
/// assert!(backoff.pause(3) <= Duration::from_secs(2));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
}

impl Backoff {
    /// Backoff starting at `initial` for the first retry, doubling for each further one, never
    /// above `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self { initial, max }
    }

    /// The first retry's ceiling.
    pub fn initial(&self) -> Duration {
        self.initial
    }

    /// The largest ceiling.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The ceiling of the pause before retry number `retry` (1 for the first retry, that is
    /// the second attempt): `min(max, initial × 2^(retry − 1))`.
    pub fn ceiling(&self, retry: u32) -> Duration {
        let doublings = retry.saturating_sub(1).min(31);
        self.initial
            .checked_mul(1u32 << doublings)
            .unwrap_or(Duration::MAX)
            .min(self.max)
    }

    /// A random pause before retry number `retry`, uniform in `[0, ceiling(retry)]`; without
    /// a system random source, the ceiling itself (the slowest, never a faster, retry).
    pub fn pause(&self, retry: u32) -> Duration {
        let ceiling = self.ceiling(retry);
        match getrandom::u64() {
            Ok(random) => full_jitter(ceiling, random),
            Err(_) => ceiling,
        }
    }
}

/// `ceiling × random / 2^64`: a pause uniform in `[0, ceiling)` for a uniform `random`.
pub(crate) fn full_jitter(ceiling: Duration, random: u64) -> Duration {
    let nanos = ceiling.as_nanos();
    let scaled = nanos.saturating_mul(u128::from(random)) >> 64;
    Duration::from_nanos(u64::try_from(scaled).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_double_from_the_initial_and_stop_at_the_max() {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(1000));
        let ceilings: Vec<u128> = (0..=8).map(|r| backoff.ceiling(r).as_millis()).collect();
        assert_eq!(ceilings, [100, 100, 200, 400, 800, 1000, 1000, 1000, 1000]);
        assert_eq!(
            backoff.ceiling(u32::MAX),
            Duration::from_millis(1000),
            "no overflow"
        );
        let huge = Backoff::new(Duration::from_secs(u64::MAX / 2), Duration::MAX);
        assert_eq!(huge.ceiling(40), Duration::MAX, "saturates, never panics");
    }

    #[test]
    fn full_jitter_spans_zero_to_the_ceiling() {
        let ceiling = Duration::from_secs(2);
        assert_eq!(full_jitter(ceiling, 0), Duration::ZERO);
        assert_eq!(full_jitter(ceiling, 1 << 63), Duration::from_secs(1));
        let top = full_jitter(ceiling, u64::MAX);
        assert!(
            top < ceiling && top > Duration::from_millis(1999),
            "{top:?}"
        );
        assert_eq!(full_jitter(Duration::ZERO, u64::MAX), Duration::ZERO);
    }

    #[test]
    fn random_pauses_stay_within_bounds_and_spread() {
        let backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(5));
        for retry in 1..=6 {
            let ceiling = backoff.ceiling(retry);
            let pauses: Vec<Duration> = (0..200).map(|_| backoff.pause(retry)).collect();
            assert!(pauses.iter().all(|p| *p <= ceiling), "retry {retry}");
            // Full jitter: some pauses fall in the lower half and some in the upper half.
            assert!(pauses.iter().any(|p| *p < ceiling / 2), "retry {retry}");
            assert!(pauses.iter().any(|p| *p > ceiling / 2), "retry {retry}");
        }
    }
}
