//! When a failed delivery is tried again.

use std::time::Duration;

use crate::OutboxError;

/// The delays between a delivery's attempts: the first attempt runs at once, attempt `n + 1`
/// after the `n`-th delay; once every delay is used, the delivery is dead (kept, never
/// dropped). Each delay is jittered by up to ± the jitter fraction (default 0.2), and a
/// receiver's `Retry-After` stretches it (never shortens it).
///
/// ```
/// use idem_outbox::Schedule;
/// use std::time::Duration;
/// let svix = Schedule::default();
/// assert_eq!(svix.attempts(), 8); // at once, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h
/// let quick = Schedule::new([Duration::from_millis(50), Duration::from_millis(100)])?.jitter(0.0)?;
/// assert_eq!(quick.delay_after(1), Some(Duration::from_millis(50)));
/// assert_eq!(quick.delay_after(3), None); // dead after its third attempt
/// # Ok::<(), idem_outbox::OutboxError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    delays: Vec<Duration>,
    jitter: f64,
}

/// At most this many delays (attempts beyond the first).
pub const MAX_RETRIES: usize = 64;

impl Default for Schedule {
    /// Svix's: at once, then 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h.
    fn default() -> Self {
        let (s, m, h) = (1, 60, 3600);
        Self {
            delays: [5 * s, 5 * m, 30 * m, 2 * h, 5 * h, 10 * h, 10 * h]
                .into_iter()
                .map(Duration::from_secs)
                .collect(),
            jitter: 0.2,
        }
    }
}

impl Schedule {
    /// The delays after each failed attempt (none: one attempt only), at most [`MAX_RETRIES`].
    pub fn new(delays: impl IntoIterator<Item = Duration>) -> Result<Self, OutboxError> {
        let delays: Vec<Duration> = delays.into_iter().collect();
        if delays.len() > MAX_RETRIES {
            return Err(OutboxError::InvalidSetting(
                "a schedule holds at most 64 delays",
            ));
        }
        Ok(Self {
            delays,
            jitter: 0.2,
        })
    }

    /// The same delays, each jittered by up to ± `fraction` of itself (0 to 1).
    pub fn jitter(mut self, fraction: f64) -> Result<Self, OutboxError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(OutboxError::InvalidSetting(
                "jitter is a fraction from 0 to 1",
            ));
        }
        self.jitter = fraction;
        Ok(self)
    }

    /// How many attempts a delivery gets in all.
    pub fn attempts(&self) -> usize {
        self.delays.len() + 1
    }

    /// The delays, unjittered.
    pub fn delays(&self) -> &[Duration] {
        &self.delays
    }

    /// The delay before the attempt after attempt `attempt` (1 for the first), jittered; `None`
    /// when that was the last.
    pub fn delay_after(&self, attempt: u32) -> Option<Duration> {
        let index = usize::try_from(attempt).ok()?.checked_sub(1)?;
        let delay = *self.delays.get(index)?;
        if self.jitter == 0.0 {
            return Some(delay);
        }
        // A uniform factor in [1 - jitter, 1 + jitter].
        let unit = (crate::id::random_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let factor = 1.0 + self.jitter * (2.0 * unit - 1.0);
        Some(delay.mul_f64(factor.max(0.0)))
    }

    /// The stored form: the delays in ms, comma separated.
    pub(crate) fn to_stored(&self) -> String {
        let delays: Vec<String> = self
            .delays
            .iter()
            .map(|d| d.as_millis().to_string())
            .collect();
        format!("{};{}", self.jitter, delays.join(","))
    }

    /// From [`to_stored`](Self::to_stored)'s form.
    pub(crate) fn from_stored(text: &str) -> Result<Self, OutboxError> {
        let corrupt = || OutboxError::Corrupt(format!("schedule {text:?}"));
        let (jitter, delays) = text.split_once(';').ok_or_else(corrupt)?;
        let jitter: f64 = jitter.parse().map_err(|_| corrupt())?;
        let delays = delays
            .split(',')
            .filter(|d| !d.is_empty())
            .map(|d| {
                d.parse::<u64>()
                    .map(Duration::from_millis)
                    .map_err(|_| corrupt())
            })
            .collect::<Result<Vec<_>, _>>()?;
        Schedule::new(delays)?.jitter(jitter).map_err(|_| corrupt())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c17_svix_schedule_by_default_jittered_within_bounds() {
        let schedule = Schedule::default();
        assert_eq!(schedule.attempts(), 8);
        for _ in 0..100 {
            let d = schedule.delay_after(2).unwrap_or_default();
            assert!(
                d >= Duration::from_secs(240) && d <= Duration::from_secs(360),
                "{d:?}"
            );
        }
        assert_eq!(schedule.delay_after(8), None);
        assert_eq!(schedule.delay_after(0), None);
    }

    #[test]
    fn stored_form_round_trips_and_junk_is_corrupt() -> Result<(), OutboxError> {
        let schedule =
            Schedule::new([Duration::from_millis(5), Duration::from_secs(2)])?.jitter(0.5)?;
        assert_eq!(Schedule::from_stored(&schedule.to_stored())?, schedule);
        let none = Schedule::new([])?;
        assert_eq!(Schedule::from_stored(&none.to_stored())?, none);
        assert!(matches!(
            Schedule::from_stored("x"),
            Err(OutboxError::Corrupt(_))
        ));
        assert!(matches!(
            Schedule::from_stored("0.2;a"),
            Err(OutboxError::Corrupt(_))
        ));
        Ok(())
    }
}
