//! Whether a reservation reads first ([`Capabilities::read_first`](crate::store::Capabilities))
//! or expects a fresh key ([`Claim::expects_fresh`](crate::store::Claim::expects_fresh)):
//! decided by the share of recent reservations that were answers.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// The whole share, in fixed point.
const ALL: u32 = 1 << 16;
/// Above this share of answers the reservations read first (a read saves a write's cost on an
/// answer and adds a round trip to a fresh key: it pays once answers are most of the load).
const ENTER: u32 = ALL / 4 * 3;
/// Below this share they reserve first again (apart from `ENTER`, so that a load near the
/// line does not switch at every reservation).
const LEAVE: u32 = ALL / 5 * 3;
/// Below this share a reservation expects a fresh key (a store may send its insert alone: a
/// fresh key saves the whole reservation's cost, an answer pays a round trip more).
const FRESH_ENTER: u32 = ALL / 8;
/// Above this share it reserves in full again.
const FRESH_LEAVE: u32 = ALL / 4;
/// How much one reservation moves the share: 1/32 (it follows a change of load within about
/// a hundred reservations).
const WEIGHT_SHIFT: u32 = 5;

/// The share of this engine's recent reservations answered without a write (replays, in
/// flight, mismatches), and whether the next ones read first. It starts reading first: a
/// load of fresh keys turns it off after a few dozen reservations.
#[derive(Debug)]
pub(crate) struct AnswerMix {
    share: AtomicU32,
    reading: AtomicBool,
    fresh: AtomicBool,
}

impl Default for AnswerMix {
    fn default() -> Self {
        Self {
            share: AtomicU32::new(ALL),
            reading: AtomicBool::new(true),
            fresh: AtomicBool::new(false),
        }
    }
}

impl AnswerMix {
    /// Whether the next reservation reads first.
    pub(crate) fn reads_first(&self) -> bool {
        self.reading.load(Ordering::Relaxed)
    }

    /// Whether the next reservation expects a fresh key.
    pub(crate) fn expects_fresh(&self) -> bool {
        self.fresh.load(Ordering::Relaxed)
    }

    /// Counts one reservation: `answered` without a write, or acquired.
    pub(crate) fn counted(&self, answered: bool) {
        let target = if answered { ALL } else { 0 };
        let step = |share: u32| share - (share >> WEIGHT_SHIFT) + (target >> WEIGHT_SHIFT);
        let before = self
            .share
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |share| {
                Some(step(share))
            });
        let share = step(before.unwrap_or_else(|share| share));
        if share >= ENTER {
            self.reading.store(true, Ordering::Relaxed);
        } else if share <= LEAVE {
            self.reading.store(false, Ordering::Relaxed);
        }
        if share <= FRESH_ENTER {
            self.fresh.store(true, Ordering::Relaxed);
        } else if share >= FRESH_LEAVE {
            self.fresh.store(false, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c04_fresh_keys_turn_the_read_off_and_answers_turn_it_back_on() {
        let mix = AnswerMix::default();
        assert!(mix.reads_first(), "starts reading");
        let fresh = (1..=100).find(|_| {
            mix.counted(false);
            !mix.reads_first()
        });
        assert!(fresh.is_some_and(|n| n <= 32), "{fresh:?} fresh keys");
        let answers = (1..=200).find(|_| {
            mix.counted(true);
            mix.reads_first()
        });
        assert!(answers.is_some_and(|n| n <= 64), "{answers:?} answers");
        // Two answers in three: above the line to leave, below the one to enter.
        for i in 0..300 {
            mix.counted(i % 3 != 0);
        }
        assert!(mix.reads_first(), "a mixed load keeps what it was");
        for _ in 0..300 {
            mix.counted(false);
        }
        assert!(!mix.reads_first());
        for i in 0..300 {
            mix.counted(i % 3 != 0);
        }
        assert!(!mix.reads_first(), "and stays off");
    }

    #[test]
    fn c04_only_fresh_keys_make_a_reservation_expect_one() {
        let mix = AnswerMix::default();
        assert!(!mix.expects_fresh(), "starts reading");
        let fresh = (1..=200).find(|_| {
            mix.counted(false);
            mix.expects_fresh()
        });
        assert!(fresh.is_some_and(|n| n <= 80), "{fresh:?} fresh keys");
        assert!(!mix.reads_first());
        // One answer in six: between the two lines, it keeps expecting fresh keys.
        for i in 0..300 {
            mix.counted(i % 6 == 0);
        }
        assert!(mix.expects_fresh(), "a few answers keep it");
        // One in three: above the line to leave.
        let answers = (1..=200).find(|i| {
            mix.counted(i % 3 == 0);
            !mix.expects_fresh()
        });
        assert!(answers.is_some(), "more answers turn it off");
        for _ in 0..300 {
            mix.counted(true);
        }
        assert!(mix.reads_first() && !mix.expects_fresh());
    }
}
