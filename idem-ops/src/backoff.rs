//! How long a change feed ([`crate::feed::Feed`]) waits before it connects again after its
//! listener failed or could not be opened: [`MIN`] at first, doubling up to [`MAX`], back to
//! [`MIN`] once a connection proved healthy (a ping arrived on it).

use std::time::Duration;

/// The first delay.
pub(crate) const MIN: Duration = Duration::from_millis(100);

/// The longest delay.
pub(crate) const MAX: Duration = Duration::from_secs(5);

/// The delays between a feed's connection attempts.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Backoff {
    /// Delays starting at [`MIN`].
    pub(crate) fn new() -> Self {
        Self { next: MIN }
    }

    /// The delay to wait now; the one after it is twice as long, at most [`MAX`].
    pub(crate) fn next(&mut self) -> Duration {
        let delay = self.next;
        self.next = (delay * 2).min(MAX);
        delay
    }

    /// Back to [`MIN`]: the last connection worked.
    pub(crate) fn reset(&mut self) {
        self.next = MIN;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c13_reconnections_back_off_and_start_again_after_a_healthy_connection() {
        let mut backoff = Backoff::new();
        let delays: Vec<_> = (0..8).map(|_| backoff.next()).collect();
        assert_eq!(delays[0], MIN);
        assert_eq!(delays[1], MIN * 2);
        assert!(delays.windows(2).all(|pair| pair[0] <= pair[1]));
        assert_eq!(delays[7], MAX);
        backoff.reset();
        assert_eq!(backoff.next(), MIN);
    }
}
