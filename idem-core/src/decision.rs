//! The pure decision logic (docs/state-machine.md), no I/O, no clock; every store applies it.

use crate::answer::Answer;
use crate::begin::Begin;
use crate::clock::Timestamp;
use crate::error::Error;
use crate::fingerprint::Fingerprint;
use crate::lease::Acquire;
use crate::record::{Record, RecordState};
use crate::token::FencingToken;

/// What a request gets given the current record: acquire, and how ([`Begin::Acquired`], C4), or
/// an answer ([`Begin::Answered`]). A reservation's enum with [`Acquire`] in place of the lease.
pub type Decision<R = crate::StoredResponse> = Begin<Acquire, R>;

/// Decides what a request with `fingerprint` gets at `now`, given the `current` record.
///
/// - no record, or one past its deadline whatever its fingerprint: acquire (C9, C10);
/// - a live record with another fingerprint: [`Answer::Mismatch`] in any state (422 before
///   409, C3);
/// - a live in-progress record: [`Answer::InFlight`] with the time left on its lease (C5);
/// - a live completed record: [`Answer::Replay`] of its response (C7).
///
/// ```
/// use idem_core::store::{decide, Acquire, Decision};
/// use idem_core::{Fingerprint, Timestamp};
/// let fp = Fingerprint::builder().body(b"x").finish();
/// let none: Option<idem_core::store::Record> = None;
/// assert_eq!(decide(none, &fp, Timestamp::from_millis(0)), Decision::Acquired(Acquire::FRESH));
/// ```
pub fn decide<R>(
    current: Option<Record<R>>,
    fingerprint: &Fingerprint,
    now: Timestamp,
) -> Decision<R> {
    let Some(record) = current else {
        return Decision::Acquired(Acquire::FRESH);
    };
    if !record.is_live(now) {
        let previous = record.token;
        return Decision::Acquired(match record.state {
            RecordState::InProgress { .. } => Acquire::take_over(previous),
            RecordState::Completed { .. } => Acquire::start_over(previous),
        });
    }
    if record.fingerprint != *fingerprint {
        return Decision::Answered(Answer::Mismatch);
    }
    Decision::Answered(match record.state {
        RecordState::InProgress { lease_until } => Answer::InFlight {
            retry_after: lease_until.saturating_since(now),
        },
        RecordState::Completed { response, .. } => Answer::Replay(response),
    })
}

/// The fence of complete, release, renew (C6, C9): `token`, in progress (expired or not).
///
/// ```
/// use idem_core::store::{check_fence, Record};
/// use idem_core::{Error, FencingToken};
/// let none: Option<&Record> = None;
/// assert!(matches!(check_fence(none, &FencingToken::generate()), Err(Error::LeaseLost)));
/// ```
pub fn check_fence<R>(current: Option<&Record<R>>, token: &FencingToken) -> Result<(), Error> {
    match current {
        Some(record) if record.token == *token && record.is_in_progress() => Ok(()),
        _ => Err(Error::LeaseLost),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::response::StoredResponse;
    use std::time::Duration;

    fn fp(body: &[u8]) -> Fingerprint {
        Fingerprint::builder().body(body).finish()
    }
    fn at(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }
    fn in_progress(body: &[u8], token: FencingToken, until: u64) -> Record {
        Record {
            fingerprint: fp(body),
            token,
            state: RecordState::InProgress {
                lease_until: at(until),
            },
        }
    }
    fn completed(body: &[u8], token: FencingToken, until: u64) -> Record {
        let response = StoredResponse::new(201, "done");
        Record {
            fingerprint: fp(body),
            token,
            state: RecordState::Completed {
                response,
                expires_at: at(until),
            },
        }
    }

    #[test]
    fn c04_absent_acquires_fresh() {
        assert_eq!(
            decide::<StoredResponse>(None, &fp(b"a"), at(5)),
            Decision::Acquired(Acquire::FRESH)
        );
    }

    #[test]
    fn c05_live_in_progress_same_fingerprint_is_in_flight_with_time_left() {
        let t = FencingToken::generate();
        assert_eq!(
            decide(Some(in_progress(b"a", t, 1_000)), &fp(b"a"), at(400)),
            Decision::Answered(Answer::InFlight {
                retry_after: Duration::from_millis(600)
            })
        );
    }

    #[test]
    fn c03_live_in_progress_other_fingerprint_is_mismatch_not_in_flight() {
        let t = FencingToken::generate();
        assert_eq!(
            decide(Some(in_progress(b"a", t, 1_000)), &fp(b"b"), at(400)),
            Decision::Answered(Answer::Mismatch)
        );
    }

    #[test]
    fn c07_live_completed_same_fingerprint_replays() {
        let t = FencingToken::generate();
        assert_eq!(
            decide(Some(completed(b"a", t, 1_000)), &fp(b"a"), at(999)),
            Decision::Answered(Answer::Replay(StoredResponse::new(201, "done")))
        );
    }

    #[test]
    fn c03_live_completed_other_fingerprint_is_mismatch() {
        let t = FencingToken::generate();
        assert_eq!(
            decide(Some(completed(b"a", t, 1_000)), &fp(b"b"), at(0)),
            Decision::Answered(Answer::Mismatch)
        );
    }

    #[test]
    fn c09_expired_in_progress_is_taken_over_at_the_deadline() {
        let t = FencingToken::generate();
        let expect = Decision::Acquired(Acquire::take_over(t));
        assert_eq!(
            decide(Some(in_progress(b"a", t, 1_000)), &fp(b"a"), at(1_000)),
            expect
        );
        assert_eq!(
            decide(Some(in_progress(b"a", t, 1_000)), &fp(b"b"), at(5_000)),
            expect
        );
    }

    #[test]
    fn c10_expired_completed_starts_over_at_the_deadline() {
        let t = FencingToken::generate();
        let expect = Decision::Acquired(Acquire::start_over(t));
        assert_eq!(
            decide(Some(completed(b"a", t, 1_000)), &fp(b"a"), at(1_000)),
            expect
        );
        assert_eq!(
            decide(Some(completed(b"a", t, 1_000)), &fp(b"z"), at(1_001)),
            expect
        );
        assert_eq!(expect, Decision::Acquired(Acquire::start_over(t)));
        assert_eq!(Acquire::start_over(t).replaces(), Some((t, true)));
        assert_eq!(Acquire::take_over(t).replaces(), Some((t, false)));
        assert_eq!(Acquire::FRESH.replaces(), None);
    }

    #[test]
    fn c06_fence_requires_same_token_and_in_progress() {
        let t = FencingToken::generate();
        let other = FencingToken::generate();
        assert!(check_fence(Some(&in_progress(b"a", t, 10)), &t).is_ok());
        // An expired lease nobody took over still carries the token.
        assert!(check_fence(Some(&in_progress(b"a", t, 0)), &t).is_ok());
        assert!(matches!(
            check_fence(Some(&in_progress(b"a", other, 10)), &t),
            Err(Error::LeaseLost)
        ));
        assert!(matches!(
            check_fence(Some(&completed(b"a", t, 10)), &t),
            Err(Error::LeaseLost)
        ));
        assert!(matches!(
            check_fence::<StoredResponse>(None, &t),
            Err(Error::LeaseLost)
        ));
    }
}
