//! How often, how fast and for how long one operation is tried.

use crate::Backoff;
use std::time::Duration;

/// How often, how fast and for how long one operation is tried.
///
/// The defaults follow Stripe's client libraries where they say something (first retry after
/// up to 0.5 s, pauses capped at 5 s) and add what they leave to the caller: a per-attempt
/// timeout, a total deadline and a cap on `Retry-After`.
///
/// | setting | default | meaning |
/// |---|---|---|
/// | `max_attempts` | 4 | attempts in all, the first included (at least 1) |
/// | `attempt_timeout` | 10 s | one attempt, from sending to the last byte of the answer |
/// | `deadline` | 60 s | the whole operation, pauses included: never exceeded |
/// | `backoff` | 0.5 s doubling to 5 s | full jitter, see [`Backoff`] |
/// | `max_retry_after` | 30 s | the longest `Retry-After` honoured as such |
/// | `min_attempt_time` | 100 ms or `attempt_timeout`, the shorter | the least time left worth an attempt |
/// | `max_response_bytes` | 16 MiB | the largest answer body read |
///
/// The pause before a retry is the larger of the backoff's random pause and the answer's
/// `Retry-After` (capped at `max_retry_after`). When that pause would leave less than
/// `min_attempt_time` before the deadline, the client stops and returns the last answer or
/// error instead of sleeping in vain (or sending an attempt with no time to answer). There is
/// no floor under the pause (stripe-node waits at least 0.5 s): full jitter may retry at once.
///
/// ```
/// use idem_client::RetryPolicy;
/// use std::time::Duration;
///
/// let policy = RetryPolicy::default()
///     .max_attempts(6)
///     .attempt_timeout(Duration::from_secs(5))
///     .deadline(Duration::from_secs(20));
/// assert_eq!(policy.max_attempts_value(), 6);
/// assert_eq!(policy.deadline_value(), Duration::from_secs(20));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    attempt_timeout: Duration,
    deadline: Duration,
    backoff: Backoff,
    max_retry_after: Duration,
    min_attempt_time: Option<Duration>,
    max_response_bytes: usize,
}

/// The default of [`RetryPolicy::max_response_bytes`]: 16 MiB.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// The longest default [`RetryPolicy::min_attempt_time`] (a shorter `attempt_timeout` lowers it).
const DEFAULT_MIN_ATTEMPT_TIME: Duration = Duration::from_millis(100);

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            attempt_timeout: Duration::from_secs(10),
            deadline: Duration::from_secs(60),
            backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(5)),
            max_retry_after: Duration::from_secs(30),
            min_attempt_time: None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }
}

impl RetryPolicy {
    /// No retry at all: one attempt (still under the deadline and the attempt timeout).
    ///
    /// ```
    /// assert_eq!(idem_client::RetryPolicy::never().max_attempts_value(), 1);
    /// ```
    pub fn never() -> Self {
        Self::default().max_attempts(1)
    }

    /// Attempts in all, the first one included (0 counts as 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The least time an attempt must have before the deadline (after its pause) to be sent:
    /// with less, the client stops with the last answer or error rather than send an attempt
    /// that can hardly be answered in time (and would leave the outcome in doubt). By default
    /// 100 ms, or `attempt_timeout` when shorter.
    ///
    /// ```
    /// use idem_client::RetryPolicy;
    /// use std::time::Duration;
    ///
    /// let default = RetryPolicy::default();
    /// assert_eq!(default.min_attempt_time_value(), Duration::from_millis(100));
    /// let quick = RetryPolicy::default().attempt_timeout(Duration::from_millis(30));
    /// assert_eq!(quick.min_attempt_time_value(), Duration::from_millis(30));
    /// let set = RetryPolicy::default().min_attempt_time(Duration::from_secs(1));
    /// assert_eq!(set.min_attempt_time_value(), Duration::from_secs(1));
    /// ```
    pub fn min_attempt_time(mut self, least: Duration) -> Self {
        self.min_attempt_time = Some(least);
        self
    }

    /// The largest answer body read, in bytes: an answer announcing more (`Content-Length`)
    /// or sending more is abandoned with [`AttemptError::TooLarge`](crate::AttemptError),
    /// final and in doubt (the server answered, the client cannot say what).
    ///
    /// ```
    /// use idem_client::RetryPolicy;
    ///
    /// assert_eq!(RetryPolicy::default().max_response_bytes_value(), 16 * 1024 * 1024);
    /// assert_eq!(RetryPolicy::default().max_response_bytes(1024).max_response_bytes_value(), 1024);
    /// ```
    pub fn max_response_bytes(mut self, limit: usize) -> Self {
        self.max_response_bytes = limit;
        self
    }

    /// The longest one attempt may take, from sending the request to reading the last byte
    /// of the answer; an attempt still running then is abandoned (its connection closed) and
    /// counts as a timeout.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// The longest the whole operation may take, every attempt and pause included.
    /// `Duration::MAX` (or any deadline too far to compute) means none.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The backoff between attempts.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The longest `Retry-After` honoured: a longer one is waited for only this long (a
    /// server's estimate is usually a worst case, e.g. a lease).
    pub fn max_retry_after(mut self, cap: Duration) -> Self {
        self.max_retry_after = cap;
        self
    }

    /// Attempts in all.
    pub fn max_attempts_value(&self) -> u32 {
        self.max_attempts
    }

    /// The per-attempt timeout.
    pub fn attempt_timeout_value(&self) -> Duration {
        self.attempt_timeout
    }

    /// The whole operation's deadline.
    pub fn deadline_value(&self) -> Duration {
        self.deadline
    }

    /// The backoff.
    pub fn backoff_value(&self) -> Backoff {
        self.backoff
    }

    /// The least time worth an attempt (see [`RetryPolicy::min_attempt_time`]).
    pub fn min_attempt_time_value(&self) -> Duration {
        self.min_attempt_time
            .unwrap_or_else(|| self.attempt_timeout.min(DEFAULT_MIN_ATTEMPT_TIME))
    }

    /// The largest answer body read.
    pub fn max_response_bytes_value(&self) -> usize {
        self.max_response_bytes
    }

    /// The cap on `Retry-After`.
    pub fn max_retry_after_value(&self) -> Duration {
        self.max_retry_after
    }

    /// The pause before retry number `retry` (1 = the second attempt), given the failed
    /// answer's `Retry-After`: the larger of the backoff's random pause and the capped
    /// `Retry-After`.
    ///
    /// ```
    /// use idem_client::RetryPolicy;
    /// use std::time::Duration;
    ///
    /// let policy = RetryPolicy::default().max_retry_after(Duration::from_secs(3));
    /// let pause = policy.pause(1, Some(Duration::from_secs(60)));
    /// assert_eq!(pause, Duration::from_secs(3));
    /// ```
    pub fn pause(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        let jittered = self.backoff.pause(retry);
        match retry_after {
            Some(asked) => jittered.max(asked.min(self.max_retry_after)),
            None => jittered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_honoured_up_to_its_cap_and_never_shortens_the_backoff() {
        let policy = RetryPolicy::default()
            .backoff(Backoff::new(
                Duration::from_millis(100),
                Duration::from_millis(100),
            ))
            .max_retry_after(Duration::from_secs(2));
        for _ in 0..50 {
            assert_eq!(
                policy.pause(1, Some(Duration::from_secs(1))),
                Duration::from_secs(1)
            );
            assert_eq!(
                policy.pause(1, Some(Duration::from_secs(3600))),
                Duration::from_secs(2),
                "capped"
            );
            let tiny = policy.pause(1, Some(Duration::ZERO));
            assert!(tiny <= Duration::from_millis(100), "{tiny:?}");
            let none = policy.pause(4, None);
            assert!(none <= Duration::from_millis(100), "{none:?}");
        }
    }

    #[test]
    fn at_least_one_attempt() {
        assert_eq!(
            RetryPolicy::default().max_attempts(0).max_attempts_value(),
            1
        );
        assert_eq!(RetryPolicy::never().max_attempts_value(), 1);
    }
}
