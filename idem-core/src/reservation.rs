//! The reservation's protocol (C4, C5, C9, C10), written once.

use crate::answer::Answer;
use crate::begin::Begin;
use crate::clock::Timestamp;
use crate::completion::Completion;
use crate::decision::{decide, Decision};
use crate::error::{Error, StoreErrorKind};
use crate::fingerprint::Fingerprint;
use crate::lease::{Acquire, Lease};
use crate::record::{Record, RecordState};
use crate::replay_cache::ReplayCache;
use crate::request::Request;
use crate::response::StoredResponse;
use crate::scope::RecordId;
use crate::token::FencingToken;
use async_trait::async_trait;
use std::time::{Duration, Instant};

/// How many steps one reservation may take: a guard against a misbehaving store.
const MAX_STEPS: usize = 16;

/// The `Retry-After` of a duplicate of a record another transaction holds.
pub const BUSY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// What every step of one reservation writes, with one token: the next step recognises a
/// write whose answer was lost as its own.
#[derive(Debug, Clone)]
pub struct Claim<'a> {
    request: &'a Request,
    token: FencingToken,
    lease_for: Duration,
    fresh_first: bool,
}

impl<'a> Claim<'a> {
    /// The request being reserved.
    pub fn request(&self) -> &'a Request {
        self.request
    }

    /// The record's identity (consumer, route, key).
    pub fn id(&self) -> &'a RecordId {
        self.request.id()
    }

    /// The request's fingerprint, written with the reservation.
    pub fn fingerprint(&self) -> &'a Fingerprint {
        self.request.fingerprint()
    }

    /// The token every write of this reservation carries.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// How long the lease lasts from the store's write, by its clock.
    pub fn lease_for(&self) -> Duration {
        self.lease_for
    }

    /// Whether this [`reserve`](crate::Store::reserve) may only write a fresh record: the
    /// engine expects none (nearly all its recent reservations were fresh keys). A store may
    /// then send its insert alone, cheaper than its whole reservation, and report
    /// [`Reserved::Lost`] when it wrote nothing; the engine's next step is a whole
    /// reservation. Never on a later step; ignoring it is always correct.
    pub fn expects_fresh(&self) -> bool {
        self.fresh_first
    }
}

/// What one atomic step of a reservation did or found (rule 2 of [`Store`](crate::Store)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reserved {
    /// The step wrote the claim's record: a fresh insert (C4), or a replace.
    Written {
        /// The lease's deadline, by the store's clock.
        until: Timestamp,
    },
    /// `reserve` only, nothing written: the record (its response only for the claim's fingerprint,
    /// or its alternative's, C3).
    Found {
        /// The record, its response still encoded.
        record: Record<Option<Vec<u8>>>,
        /// The store's time of the read (C11).
        now: Timestamp,
        /// Whether the record carries a mark of doubt (store rule 6): its answer may change.
        in_doubt: bool,
    },
    /// An uncommitted transaction holds the record (C15): in flight, or mismatch (C3).
    Held {
        /// Whether the holder is known to run another body.
        mismatch: bool,
    },
    /// Nothing written, nothing to answer from: the record changed, a read missed a commit
    /// after its snapshot, [`read`](crate::Store::read) found no record, or a reserve that
    /// [expected a fresh key](Claim::expects_fresh) wrote none.
    Lost,
}

impl Reserved {
    /// The answer to `request` without writing, `None` if it would acquire, as a reservation
    /// decides it: a record under either of its fingerprints (C3) is in flight or replayed as
    /// found, and a holder of another body may be it under its alternative (in flight).
    pub fn answer(self, request: &Request) -> Result<Option<Answer>, Error> {
        match self {
            Reserved::Found { record, now, .. } => {
                let fingerprint = deciding(&record, request);
                match decide(Some(record), &fingerprint, now) {
                    Decision::Answered(answer) => Ok(Some(answer.try_map(decode_replay)?)),
                    Decision::Acquired(_) => Ok(None),
                }
            }
            Reserved::Held { mismatch } => Ok(Some(held(
                mismatch && request.alternative_fingerprint().is_none(),
            ))),
            Reserved::Written { .. } | Reserved::Lost => Ok(None),
        }
    }
}

/// The fingerprint `record` is decided under for `request`: the record's own if it is under
/// either of the request's fingerprints (C3), decided as found: in flight, taken over under the
/// request's own, or replayed from the response the step fetched under either (rule 2 of
/// [`Store`](crate::Store); a completed one without it is corrupt, C12). Else the request's
/// own: another body's record is a mismatch.
fn deciding(record: &Record<Option<Vec<u8>>>, request: &Request) -> Fingerprint {
    if request.accepts(&record.fingerprint) {
        record.fingerprint
    } else {
        *request.fingerprint()
    }
}

fn held(mismatch: bool) -> Answer {
    if mismatch {
        Answer::Mismatch
    } else {
        Answer::InFlight {
            retry_after: BUSY_RETRY_AFTER,
        }
    }
}

/// A replay's response, decoded (a completed record always has one).
fn decode_replay(response: Option<Vec<u8>>) -> Result<StoredResponse, Error> {
    let response = response.ok_or_else(|| {
        Error::CorruptRecord("a completed record of the same request without a response".to_owned())
    })?;
    StoredResponse::decode(&response)
}

/// The next thing to do for a reservation.
#[derive(Debug)]
#[must_use]
enum Step {
    Read,
    Reserve,
    Replace(Acquire),
    Done(Begin),
}

/// One request's reservation across its steps: it decides and loops, the steps only report.
///
/// ```
/// use idem_core::store::{Acquire, BlockingSteps, Claim, Reservation, Reserved};
/// use idem_core::{Begin, Error, Request, Timestamp};
/// use std::time::Duration;
/// struct Empty; // finds no record, inserts a fresh one
/// impl BlockingSteps for Empty {
///     fn reserve(&mut self, _claim: &Claim<'_>) -> Result<Reserved, Error> {
///         Ok(Reserved::Written { until: Timestamp::from_millis(60_000) })
///     }
///     fn replace(&mut self, _claim: &Claim<'_>, _acquire: Acquire) -> Result<Reserved, Error> {
///         Ok(Reserved::Lost)
///     }
/// }
/// let request = Request::builder("acct_1", "POST", "/charges").key(Some("k1")).body(b"{}").build()?;
/// let reservation = Reservation::new(&request, Duration::from_secs(60));
/// let token = reservation.claim().token();
/// let Begin::Acquired(lease) = reservation.run_blocking(&mut Empty)? else { unreachable!() };
/// assert_eq!(lease.token(), token);
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug)]
pub struct Reservation<'a> {
    claim: Claim<'a>,
    /// How the last compare-and-set meant to acquire; `None`: only a fresh insert.
    replacing: Option<Acquire>,
    steps: usize,
    errors: usize,
    /// How many failed steps may be tried again: 1, or 0 where a step cannot be sent again.
    retries: usize,
    /// Whether to read first where the steps can (the engine's choice).
    may_read: bool,
    /// Where the replays the steps read are kept: the engine's cache, if it has one.
    keep: Option<Keep>,
}

/// The engine's replay cache, with the store generation and the instant taken before a
/// reservation's first step or a completion's write.
#[derive(Debug)]
pub(crate) struct Keep {
    pub(crate) cache: ReplayCache,
    pub(crate) generation: u64,
    pub(crate) read_at: Instant,
}

impl Clone for Keep {
    fn clone(&self) -> Self {
        Self {
            cache: self.cache.share(),
            generation: self.generation,
            read_at: self.read_at,
        }
    }
}

impl Keep {
    /// Keeps a completion written since `read_at`, unless it is in doubt.
    pub(crate) fn completed(&self, completion: &Completion) {
        if completion.doubt().is_none() {
            let (id, fingerprint) = (completion.id(), completion.fingerprint());
            let (response, left) = (Some(completion.response()), completion.retain_for());
            let (read_at, generation) = (self.read_at, self.generation);
            self.cache
                .keep(id, fingerprint, response, left, read_at, generation);
        }
    }
}

impl<'a> Reservation<'a> {
    /// A reservation of `request` for `lease_for`, with a fresh token.
    pub fn new(request: &'a Request, lease_for: Duration) -> Self {
        Self {
            claim: Claim {
                request,
                token: FencingToken::generate(),
                lease_for,
                fresh_first: false,
            },
            replacing: None,
            steps: 0,
            errors: 0,
            retries: 1,
            may_read: true,
            keep: None,
        }
    }

    /// [`new`](Self::new) for steps never sent again after a failure (in a one-commit transaction,
    /// C15, or where no answer is lost): a failed step is the reservation's error.
    pub fn without_retry(request: &'a Request, lease_for: Duration) -> Self {
        Self {
            retries: 0,
            ..Self::new(request, lease_for)
        }
    }

    /// [`Reservation`] under `token`, an acquired lease's: its step writes that lease's record
    /// again where it is gone (a one-commit reservation an effect's own `ROLLBACK` took with
    /// it), or finds it.
    pub(crate) fn under(mut self, token: FencingToken) -> Self {
        self.claim.token = token;
        self
    }

    /// [`Reservation`] reading first only if `may_read` (and its steps can).
    pub(crate) fn reading_first(mut self, may_read: bool) -> Self {
        self.may_read = may_read;
        self
    }

    /// [`Reservation`] whose first step, a reserve, [expects a fresh key](Claim::expects_fresh)
    /// if `fresh` (and it does not read first).
    pub(crate) fn inserting_first(mut self, fresh: bool) -> Self {
        self.claim.fresh_first = fresh;
        self
    }

    /// [`Reservation`] keeping the replays it reads in `keep`.
    pub(crate) fn keeping(mut self, keep: Option<Keep>) -> Self {
        self.keep = keep;
        self
    }

    /// What every step writes.
    pub fn claim(&self) -> &Claim<'a> {
        &self.claim
    }

    /// The next step after `reserved`; `replacing`: it was a `replace`.
    fn next(&mut self, reserved: Reserved, replacing: bool) -> Result<Step, Error> {
        match reserved {
            Reserved::Written { until } => {
                let acquire = self.replacing.filter(|_| replacing);
                Ok(self.acquired(until, acquire.unwrap_or(Acquire::FRESH)))
            }
            // Held by another body, perhaps this request under its alternative fingerprint:
            // in flight, which a retry tells apart once the holder ends (never a 422 it cannot
            // be sure of).
            Reserved::Held { mismatch } => {
                let mismatch = mismatch && self.claim.request.alternative_fingerprint().is_none();
                Ok(Step::Done(Begin::Answered(held(mismatch))))
            }
            // `replacing` is kept: a record found later with the token was written by an
            // earlier send of the replace. The record changed: reserve again.
            Reserved::Lost => {
                self.count()?;
                Ok(Step::Reserve)
            }
            Reserved::Found {
                record,
                now,
                in_doubt,
            } => {
                if let Some(step) = self.own(&record) {
                    return Ok(step);
                }
                let stored = record.fingerprint;
                let left = record.deadline().saturating_since(now);
                let completed = !record.is_in_progress();
                // Every step is under the request's own fingerprint, and a record under its
                // alternative (C3) is decided as found: nothing is ever written under it.
                let fingerprint = deciding(&record, self.claim.request);
                match decide(Some(record), &fingerprint, now) {
                    Decision::Answered(answer) => {
                        let answer = answer.try_map(decode_replay)?;
                        let kept = match &answer {
                            Answer::Replay(response) => Some(Some(response)),
                            Answer::Mismatch if completed => Some(None),
                            _ => None,
                        };
                        if let (Some(response), Some(keep), false) = (kept, &self.keep, in_doubt) {
                            let (id, read_at) = (self.claim.id(), keep.read_at);
                            keep.cache
                                .keep(id, stored, response, left, read_at, keep.generation);
                        }
                        Ok(Step::Done(Begin::Answered(answer)))
                    }
                    Decision::Acquired(acquire) => {
                        self.count()?;
                        // A new execution; from now on the compare-and-set may have written
                        // the token.
                        self.replacing = Some(acquire);
                        Ok(Step::Replace(acquire))
                    }
                }
            }
        }
    }

    /// After `error`: an unavailable store is tried again once from [`Step::Reserve`] with the
    /// same token (a failed read, which wrote nothing, keeps that retry for the writes);
    /// anything else (a transaction conflict included) is the reservation's error.
    fn failed(&mut self, error: Error, reading: bool) -> Result<Step, Error> {
        let unavailable = error
            .as_store()
            .is_some_and(|e| e.kind() == StoreErrorKind::Unavailable);
        if unavailable && (reading || self.errors < self.retries) {
            self.errors += usize::from(!reading);
            self.count()?;
            return Ok(Step::Reserve);
        }
        Err(error)
    }

    fn after(&mut self, result: Result<Reserved, Error>, step: &Step) -> Result<Step, Error> {
        // Only the first step may expect a fresh key: whatever it found, the next reserves in full.
        self.claim.fresh_first = false;
        match result {
            Ok(reserved) => self.next(reserved, matches!(step, Step::Replace(_))),
            Err(error) => self.failed(error, matches!(step, Step::Read)),
        }
    }

    fn acquired(&self, until: Timestamp, acquire: Acquire) -> Step {
        Step::Done(Begin::Acquired(Lease::new(
            self.claim.request,
            self.claim.token,
            until,
            acquire,
        )))
    }

    /// The lease for `record` if it is this reservation's own (token, in progress, fingerprint).
    fn own(&self, record: &Record<Option<Vec<u8>>>) -> Option<Step> {
        match record.state {
            RecordState::InProgress { lease_until }
                if record.token == self.claim.token
                    && record.fingerprint == *self.claim.fingerprint() =>
            {
                let acquire = self.replacing.unwrap_or(Acquire::FRESH);
                Some(self.acquired(lease_until, acquire))
            }
            _ => None,
        }
    }

    fn count(&mut self) -> Result<(), Error> {
        self.steps += 1;
        if self.steps >= MAX_STEPS {
            return Err(Error::store(
                "idem",
                StoreErrorKind::Other,
                "the reservation kept losing its race",
            ));
        }
        Ok(())
    }
}

/// A reservation's steps, driven by [`Reservation::run`].
#[async_trait]
pub trait Steps: Send {
    /// Whether a [`read`](Self::read) comes first: it answers a replay, an in-flight duplicate
    /// or a mismatch, or takes over an expired record, without the reservation's write.
    fn reads_first(&self) -> bool {
        false
    }
    /// One [`Store::read`](crate::Store::read) step (asked only if [`reads_first`](Self::reads_first)).
    async fn read(&mut self, claim: &Claim<'_>) -> Result<Reserved, Error> {
        let _ = claim;
        Ok(Reserved::Lost)
    }
    /// One [`Store::reserve`](crate::Store::reserve) step.
    async fn reserve(&mut self, claim: &Claim<'_>) -> Result<Reserved, Error>;
    /// One [`Store::replace`](crate::Store::replace) step.
    async fn replace(&mut self, claim: &Claim<'_>, acquire: Acquire) -> Result<Reserved, Error>;
}

/// A reservation's two steps, run synchronously by [`Reservation::run_blocking`].
pub trait BlockingSteps {
    /// One [`Store::reserve`](crate::Store::reserve) step.
    fn reserve(&mut self, claim: &Claim<'_>) -> Result<Reserved, Error>;
    /// One [`Store::replace`](crate::Store::replace) step.
    fn replace(&mut self, claim: &Claim<'_>, acquire: Acquire) -> Result<Reserved, Error>;
}

impl Reservation<'_> {
    /// Runs the reservation to its end over `steps`: the protocol's one loop.
    pub async fn run(mut self, steps: &mut (impl Steps + ?Sized)) -> Result<Begin, Error> {
        let reads = self.may_read && steps.reads_first();
        self.claim.fresh_first &= !reads;
        let mut step = if reads { Step::Read } else { Step::Reserve };
        loop {
            step = match step {
                Step::Read => self.after(steps.read(&self.claim).await, &step)?,
                Step::Reserve => self.after(steps.reserve(&self.claim).await, &step)?,
                Step::Replace(acquire) => {
                    self.after(steps.replace(&self.claim, acquire).await, &step)?
                }
                Step::Done(begin) => return Ok(begin),
            }
        }
    }

    /// [`run`](Self::run), for steps that run synchronously in one hop.
    pub fn run_blocking(
        mut self,
        steps: &mut (impl BlockingSteps + ?Sized),
    ) -> Result<Begin, Error> {
        self.claim.fresh_first = false;
        let mut step = Step::Reserve;
        loop {
            step = match step {
                Step::Read | Step::Reserve => {
                    self.after(steps.reserve(&self.claim), &Step::Reserve)?
                }
                Step::Replace(acquire) => self.after(steps.replace(&self.claim, acquire), &step)?,
                Step::Done(begin) => return Ok(begin),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::response::StoredResponse;

    fn request(body: &[u8]) -> Request {
        Request::builder("acct", "POST", "/x")
            .key(Some("k"))
            .body(body)
            .build()
            .expect("a valid request")
    }

    fn in_progress(token: FencingToken, fingerprint: Fingerprint, until: u64) -> Reserved {
        Reserved::Found {
            record: Record {
                fingerprint,
                token,
                state: RecordState::InProgress {
                    lease_until: Timestamp::from_millis(until),
                },
            },
            now: Timestamp::from_millis(1_000),
            in_doubt: false,
        }
    }

    /// A live completed record of `req` carrying `response`.
    fn completed(req: &Request, response: &StoredResponse) -> Reserved {
        let encoded = response.encode().expect("encodable");
        completed_with(*req.fingerprint(), Some(encoded))
    }

    /// A live completed record under `fingerprint`, with `response` as a store reports it.
    fn completed_with(fingerprint: Fingerprint, response: Option<Vec<u8>>) -> Reserved {
        Reserved::Found {
            record: Record {
                fingerprint,
                token: FencingToken::generate(),
                state: RecordState::Completed {
                    response,
                    expires_at: Timestamp::from_millis(9_000),
                },
            },
            now: Timestamp::from_millis(1_000),
            in_doubt: false,
        }
    }

    /// Steps whose reserve answers from `replies` in turn and notes whether each claim expected
    /// a fresh key.
    struct Scripted {
        replies: Vec<Reserved>,
        expected: Vec<bool>,
        reads: bool,
    }

    #[async_trait]
    impl Steps for Scripted {
        fn reads_first(&self) -> bool {
            self.reads
        }
        async fn read(&mut self, claim: &Claim<'_>) -> Result<Reserved, Error> {
            self.reserve(claim).await
        }
        async fn reserve(&mut self, claim: &Claim<'_>) -> Result<Reserved, Error> {
            self.expected.push(claim.expects_fresh());
            Ok(self.replies.remove(0))
        }
        async fn replace(&mut self, _: &Claim<'_>, _: Acquire) -> Result<Reserved, Error> {
            Ok(Reserved::Lost)
        }
    }

    #[tokio::test]
    async fn c04_only_the_first_reserve_expects_a_fresh_key_and_lost_reserves_in_full() {
        let req = request(b"{}");
        let response = StoredResponse::new(201, "made");
        let completed = completed(&req, &response);
        // The insert alone wrote nothing: the next step reserves in full and replays.
        let mut steps = Scripted {
            replies: vec![Reserved::Lost, completed.clone()],
            expected: Vec::new(),
            reads: false,
        };
        let begin = Reservation::new(&req, Duration::from_secs(60))
            .inserting_first(true)
            .run(&mut steps)
            .await
            .expect("answered");
        assert_eq!(begin, Begin::Answered(Answer::Replay(response)));
        assert_eq!(steps.expected, [true, false]);
        // A reservation that reads first never expects a fresh key.
        let mut steps = Scripted {
            replies: vec![completed],
            expected: Vec::new(),
            reads: true,
        };
        let begin = Reservation::new(&req, Duration::from_secs(60))
            .inserting_first(true)
            .run(&mut steps)
            .await
            .expect("answered");
        assert!(
            matches!(begin, Begin::Answered(Answer::Replay(_))),
            "{begin:?}"
        );
        assert_eq!(steps.expected, [false]);
        // Not asked: never.
        let until = Timestamp::from_millis(61_000);
        let mut steps = Scripted {
            replies: vec![Reserved::Written { until }],
            expected: Vec::new(),
            reads: false,
        };
        let begin = Reservation::new(&req, Duration::from_secs(60))
            .run(&mut steps)
            .await
            .expect("acquired");
        assert!(matches!(begin, Begin::Acquired(_)), "{begin:?}");
        assert_eq!(steps.expected, [false]);
    }

    #[test]
    fn c04_an_inserted_record_is_acquired_fresh_with_the_claims_token() {
        let req = request(b"{}");
        let mut r = Reservation::new(&req, Duration::from_secs(60));
        let until = Timestamp::from_millis(61_000);
        match r.next(Reserved::Written { until }, false) {
            Ok(Step::Done(Begin::Acquired(lease))) => {
                assert_eq!(lease.token(), r.claim().token());
                assert_eq!(lease.lease_until(), until);
                assert_eq!(lease.acquired(), Acquire::FRESH);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn c05_a_live_record_of_the_same_request_is_in_flight() {
        let req = request(b"{}");
        let mut r = Reservation::new(&req, Duration::from_secs(60));
        let found = in_progress(FencingToken::generate(), *req.fingerprint(), 5_000);
        match r.next(found, false) {
            Ok(Step::Done(Begin::Answered(Answer::InFlight { retry_after }))) => {
                assert_eq!(retry_after, Duration::from_secs(4));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn c03_a_live_record_of_another_body_is_a_mismatch() {
        let req = request(b"{}");
        let other = request(b"{\"a\":1}");
        let mut r = Reservation::new(&req, Duration::from_secs(60));
        let found = in_progress(FencingToken::generate(), *other.fingerprint(), 5_000);
        assert!(matches!(
            r.next(found, false),
            Ok(Step::Done(Begin::Answered(Answer::Mismatch)))
        ));
    }

    #[test]
    fn c07_a_completed_record_replays_its_decoded_response() {
        let req = request(b"{}");
        let mut r = Reservation::new(&req, Duration::from_secs(60));
        let response = StoredResponse::new(201, "made");
        let found = completed(&req, &response);
        match r.next(found, false) {
            Ok(Step::Done(Begin::Answered(Answer::Replay(replayed)))) => {
                assert_eq!(replayed, response);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn c12_a_completed_record_of_the_same_request_without_its_response_is_corrupt() {
        let req = request(b"{}");
        let mut r = Reservation::new(&req, Duration::from_secs(60));
        let found = completed_with(*req.fingerprint(), None);
        assert!(matches!(r.next(found, false), Err(Error::CorruptRecord(_))));
    }

    #[test]
    fn c09_an_expired_record_is_replaced_and_a_lost_race_reads_again() {
        let req = request(b"{}");
        let mut r = Reservation::new(&req, Duration::from_secs(60));
        let previous = FencingToken::generate();
        let found = in_progress(previous, *req.fingerprint(), 500);
        match r.next(found, false) {
            Ok(Step::Replace(acquire)) => assert_eq!(acquire, Acquire::take_over(previous)),
            other => panic!("{other:?}"),
        }
        assert!(matches!(r.next(Reserved::Lost, true), Ok(Step::Reserve)));
        let until = Timestamp::from_millis(61_000);
        let found = in_progress(previous, *req.fingerprint(), 500);
        assert!(matches!(r.next(found, false), Ok(Step::Replace(_))));
        match r.next(Reserved::Written { until }, true) {
            Ok(Step::Done(Begin::Acquired(lease))) => {
                assert_eq!(lease.acquired(), Acquire::take_over(previous));
                assert_eq!(lease.token(), r.claim().token());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn c05_a_busy_row_or_a_held_key_is_answered_at_once() {
        let req = request(b"{}");
        let mut r = Reservation::new(&req, Duration::from_secs(60));
        assert!(matches!(
            r.next(Reserved::Held { mismatch: false }, true),
            Ok(Step::Done(Begin::Answered(Answer::InFlight { .. })))
        ));
        assert!(matches!(
            r.next(Reserved::Held { mismatch: false }, false),
            Ok(Step::Done(Begin::Answered(Answer::InFlight { .. })))
        ));
        assert!(matches!(
            r.next(Reserved::Held { mismatch: true }, false),
            Ok(Step::Done(Begin::Answered(Answer::Mismatch)))
        ));
    }

    #[test]
    fn c04_a_record_carrying_the_claims_token_is_this_reservations_own() {
        let req = request(b"{}");
        let mut r = Reservation::new(&req, Duration::from_secs(60));
        let previous = FencingToken::generate();
        // The takeover's answer was lost: the link failed after the store applied it.
        let found = in_progress(previous, *req.fingerprint(), 500);
        assert!(matches!(r.next(found, false), Ok(Step::Replace(_))));
        let lost = Error::store("test", StoreErrorKind::Unavailable, "reset");
        assert!(matches!(r.failed(lost, false), Ok(Step::Reserve)));
        let mine = in_progress(r.claim().token(), *req.fingerprint(), 61_000);
        match r.next(mine, false) {
            Ok(Step::Done(Begin::Acquired(lease))) => {
                assert_eq!(lease.acquired(), Acquire::take_over(previous));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn c13_a_second_failure_or_a_permanent_one_is_the_reservations_error() {
        let req = request(b"{}");
        let mut r = Reservation::new(&req, Duration::from_secs(60));
        let unavailable = || Error::store("test", StoreErrorKind::Unavailable, "reset");
        assert!(matches!(r.failed(unavailable(), false), Ok(Step::Reserve)));
        assert!(r.failed(unavailable(), false).is_err());
        let mut r = Reservation::new(&req, Duration::from_secs(60));
        let misconfigured = Error::store("test", StoreErrorKind::Misconfigured, "no table");
        assert!(r.failed(misconfigured, false).is_err());
        let mut r = Reservation::new(&req, Duration::from_secs(60));
        let conflict = Error::store("test", StoreErrorKind::TransactionConflict, "40001");
        assert!(
            r.failed(conflict, false).is_err(),
            "its transaction has rolled back"
        );
    }

    #[test]
    fn c13_a_failed_read_keeps_the_retry_for_the_writes() {
        let req = request(b"{}");
        let mut r = Reservation::new(&req, Duration::from_secs(60));
        let unavailable = || Error::store("test", StoreErrorKind::Unavailable, "reset");
        assert!(matches!(r.failed(unavailable(), true), Ok(Step::Reserve)));
        // The reservation's answer lost: its retry finds the record as its own.
        assert!(matches!(r.failed(unavailable(), false), Ok(Step::Reserve)));
        assert!(r.failed(unavailable(), false).is_err());
    }

    #[test]
    fn c15_a_reservation_without_retry_returns_the_first_failure() {
        let req = request(b"{}");
        let mut r = Reservation::without_retry(&req, Duration::from_secs(60));
        let unavailable = Error::store("test", StoreErrorKind::Unavailable, "disk full");
        assert!(r.failed(unavailable, false).is_err());
    }

    #[test]
    fn c04_endless_races_end_in_an_error() {
        let req = request(b"{}");
        let mut r = Reservation::new(&req, Duration::from_secs(60));
        let mut last = Ok(Step::Reserve);
        for _ in 0..MAX_STEPS {
            last = r.next(Reserved::Lost, false);
            if last.is_err() {
                break;
            }
        }
        assert!(last.is_err());
    }

    /// C3: a record under the alternative fingerprint is the request's own, decided as found
    /// with no step more: completed, it is replayed from the response the step fetched under
    /// either fingerprint (rule 2 of `Store`); in progress, in flight. A completed one without
    /// its response is corrupt (C12), as under the request's own: never a 422, never a step.
    #[test]
    fn c03_a_record_under_the_alternative_fingerprint_is_decided_as_found() {
        let old = request(b"{ \"a\": 1 }");
        let req = request(b"{\"a\":1}").with_alternative_fingerprint(*old.fingerprint());
        let response = StoredResponse::new(201, "made");
        let mut r = Reservation::new(&req, Duration::from_secs(60));
        let step = r.next(completed(&old, &response), false);
        assert!(
            matches!(step, Ok(Step::Done(Begin::Answered(Answer::Replay(ref r)))) if r.body == b"made"),
            "{step:?}"
        );
        let mut r = Reservation::new(&req, Duration::from_secs(60));
        let without = completed_with(*old.fingerprint(), None);
        assert!(matches!(
            r.next(without, false),
            Err(Error::CorruptRecord(_))
        ));
        let mut r = Reservation::new(&req, Duration::from_secs(60));
        let found = in_progress(FencingToken::generate(), *old.fingerprint(), 5_000);
        assert!(matches!(
            r.next(found, false),
            Ok(Step::Done(Begin::Answered(Answer::InFlight { .. })))
        ));
        // A third body is a mismatch, under either fingerprint.
        let other = request(b"{\"a\":2}");
        let mut r = Reservation::new(&req, Duration::from_secs(60));
        let found = in_progress(FencingToken::generate(), *other.fingerprint(), 5_000);
        assert!(matches!(
            r.next(found, false),
            Ok(Step::Done(Begin::Answered(Answer::Mismatch)))
        ));
    }

    /// Steps whose read never tells (a store that reads no header of the record) and whose
    /// reserve finds `found`; counting both.
    struct ReadsNothing {
        found: Reserved,
        reads: usize,
        reserves: usize,
    }

    #[async_trait]
    impl Steps for ReadsNothing {
        fn reads_first(&self) -> bool {
            true
        }
        async fn read(&mut self, _: &Claim<'_>) -> Result<Reserved, Error> {
            self.reads += 1;
            Ok(Reserved::Lost)
        }
        async fn reserve(&mut self, _: &Claim<'_>) -> Result<Reserved, Error> {
            self.reserves += 1;
            Ok(self.found.clone())
        }
        async fn replace(&mut self, _: &Claim<'_>, _: Acquire) -> Result<Reserved, Error> {
            Ok(Reserved::Lost)
        }
    }

    /// C3, C5: a record in flight under the request's alternative fingerprint that the read
    /// cannot tell (no header: written by a store that never reads first) is in flight as the
    /// reservation finds it: never a read under the alternative, which could not tell either
    /// and would send the claim back to its own fingerprint until the steps ran out.
    #[tokio::test]
    async fn c03_in_flight_under_the_alternative_is_answered_as_found() {
        let old = request(b"raw");
        let req = request(b"canonical").with_alternative_fingerprint(*old.fingerprint());
        let mut steps = ReadsNothing {
            found: in_progress(FencingToken::generate(), *old.fingerprint(), 5_000),
            reads: 0,
            reserves: 0,
        };
        let begin = Reservation::new(&req, Duration::from_secs(60))
            .run(&mut steps)
            .await;
        assert!(
            matches!(begin, Ok(Begin::Answered(Answer::InFlight { .. }))),
            "{begin:?}"
        );
        assert_eq!((steps.reads, steps.reserves), (1, 1));
    }

    /// C3, C5: a store that answers from a read (SQLite's readers, the engine's claim of a key
    /// in use in the process) answers as a reservation decides: a record in progress under the
    /// request's alternative is in flight as found, not a 422 that sends the engine to a
    /// whole execution under the alternative (which writes under it if the holder is gone by
    /// then); a completed one under the alternative is replayed, or corrupt without its
    /// response (C12); a holder of another body may be the request under its alternative: in
    /// flight.
    #[test]
    fn c03_an_answer_from_a_read_decides_as_a_reservation_does() {
        let old = request(b"raw");
        let req = request(b"canonical").with_alternative_fingerprint(*old.fingerprint());
        let found = in_progress(FencingToken::generate(), *old.fingerprint(), 5_000);
        assert!(matches!(
            found.clone().answer(&req),
            Ok(Some(Answer::InFlight { .. }))
        ));
        let plain = request(b"canonical");
        assert!(matches!(found.answer(&plain), Ok(Some(Answer::Mismatch))));
        let done = completed_with(*old.fingerprint(), None);
        assert!(matches!(done.answer(&req), Err(Error::CorruptRecord(_))));
        let replayed = completed(&old, &StoredResponse::new(201, "made"));
        assert!(matches!(replayed.answer(&req), Ok(Some(Answer::Replay(_)))));
        let held = Reserved::Held { mismatch: true };
        assert!(matches!(
            held.clone().answer(&req),
            Ok(Some(Answer::InFlight { .. }))
        ));
        assert!(matches!(held.answer(&plain), Ok(Some(Answer::Mismatch))));
        let other = request(b"another");
        let found = in_progress(FencingToken::generate(), *other.fingerprint(), 5_000);
        assert!(matches!(found.answer(&req), Ok(Some(Answer::Mismatch))));
    }

    /// C3, C5: a record held uncommitted by another body may be this request under its
    /// alternative: in flight (a retry tells), never a 422 it cannot be sure of, and nothing
    /// written under the alternative.
    #[test]
    fn c03_a_record_held_by_another_body_is_in_flight_for_a_request_with_an_alternative() {
        let old = request(b"raw");
        let req = request(b"canonical").with_alternative_fingerprint(*old.fingerprint());
        let mut r = Reservation::new(&req, Duration::from_secs(60));
        let held = Reserved::Held { mismatch: true };
        assert!(matches!(
            r.next(held.clone(), false),
            Ok(Step::Done(Begin::Answered(Answer::InFlight { .. })))
        ));
        assert_eq!(r.claim().fingerprint(), req.fingerprint());
        let plain = request(b"canonical");
        let mut r = Reservation::new(&plain, Duration::from_secs(60));
        assert!(matches!(
            r.next(held, false),
            Ok(Step::Done(Begin::Answered(Answer::Mismatch)))
        ));
    }

    /// C3: every step is under the request's own fingerprint: a record that changed is
    /// reserved again, and an expired record under the alternative is replaced under the
    /// request's own.
    #[test]
    fn c03_writes_are_under_the_request_s_own_fingerprint() {
        let old = request(b"raw");
        let req = request(b"canonical").with_alternative_fingerprint(*old.fingerprint());
        let mut r = Reservation::new(&req, Duration::from_secs(60));
        let expired = Reserved::Found {
            record: Record {
                fingerprint: *old.fingerprint(),
                token: FencingToken::generate(),
                state: RecordState::InProgress {
                    lease_until: Timestamp::from_millis(1_000),
                },
            },
            now: Timestamp::from_millis(5_000),
            in_doubt: false,
        };
        assert!(matches!(r.next(Reserved::Lost, false), Ok(Step::Reserve)));
        assert_eq!(r.claim().fingerprint(), req.fingerprint());
        assert!(matches!(r.next(expired, false), Ok(Step::Replace(_))));
        assert_eq!(r.claim().fingerprint(), req.fingerprint());
    }
}
