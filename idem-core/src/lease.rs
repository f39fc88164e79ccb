//! The right to run a request's effect.

use crate::budget::{self, Budget};
use crate::clock::Timestamp;
use crate::event_kind::EventKind;
use crate::fingerprint::Fingerprint;
use crate::request::Request;
use crate::scope::RecordId;
use crate::token::FencingToken;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a reservation acquires its record: the [`EventKind`] it reports and what it replaces.
///
/// ```
/// use idem_core::store::Acquire;
/// use idem_core::{EventKind, FencingToken};
/// let previous = FencingToken::generate();
/// assert_eq!(Acquire::take_over(previous).kind(), EventKind::TakenOver);
/// assert_eq!(Acquire::FRESH.kind(), EventKind::Acquired);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquire {
    kind: EventKind,
    previous: Option<FencingToken>,
}

impl Acquire {
    /// No record: insert one.
    pub const FRESH: Acquire = Acquire {
        kind: EventKind::Acquired,
        previous: None,
    };

    /// An orphan whose lease passed (C9): its holder `previous` is fenced out.
    pub fn take_over(previous: FencingToken) -> Self {
        Self {
            kind: EventKind::TakenOver,
            previous: Some(previous),
        }
    }

    /// A completed record whose retention passed (C10).
    pub fn start_over(previous: FencingToken) -> Self {
        Self {
            kind: EventKind::StartedOver,
            previous: Some(previous),
        }
    }

    /// What the acquisition reports: `Acquired`, `TakenOver` or `StartedOver`.
    pub fn kind(&self) -> EventKind {
        self.kind
    }

    /// A store's compare-and-set condition: the replaced record's token, and whether it must
    /// be completed (a start over) rather than in progress (a takeover). `None` when fresh.
    ///
    /// ```
    /// use idem_core::store::Acquire;
    /// use idem_core::FencingToken;
    /// let previous = FencingToken::generate();
    /// assert_eq!(Acquire::start_over(previous).replaces(), Some((previous, true)));
    /// assert_eq!(Acquire::take_over(previous).replaces(), Some((previous, false)));
    /// assert_eq!(Acquire::FRESH.replaces(), None);
    /// ```
    pub fn replaces(&self) -> Option<(FencingToken, bool)> {
        self.previous
            .map(|previous| (previous, self.kind == EventKind::StartedOver))
    }
}

/// The right to run a request's effect, held until completion, release or the deadline.
///
/// ```
/// use idem_core::store::{Acquire, Lease};
/// use idem_core::{FencingToken, Request, Timestamp};
/// let request = Request::builder("acct_1", "POST", "/charges").key(Some("k")).body(b"{}").build()?;
/// let token = FencingToken::generate();
/// let lease = Lease::new(&request, token, Timestamp::from_millis(60_000), Acquire::FRESH);
/// assert_eq!(lease.token(), token);
/// assert_eq!(lease.id(), request.id());
/// # Ok::<(), idem_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    id: RecordId,
    fingerprint: Fingerprint,
    token: FencingToken,
    lease_until: Timestamp,
    acquired: Acquire,
    /// The engine's estimate of the lease's end by the monotonic clock.
    local_deadline: Option<Instant>,
    /// The store budget of the request that took it (C13).
    budget: budget::Shared,
}

impl Lease {
    /// The lease of the record a store wrote for `request` with `token` (store time).
    pub fn new(
        request: &Request,
        token: FencingToken,
        lease_until: Timestamp,
        acquired: Acquire,
    ) -> Self {
        Self {
            id: request.id().clone(),
            fingerprint: *request.fingerprint(),
            token,
            lease_until,
            acquired,
            local_deadline: None,
            budget: budget::Shared::default(),
        }
    }

    /// The record.
    pub fn id(&self) -> &RecordId {
        &self.id
    }

    /// The request's fingerprint.
    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    /// The fencing token the record carries while this lease holds (C6).
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// When the lease ends unless renewed (C9), in the store's own time.
    pub fn lease_until(&self) -> Timestamp {
        self.lease_until
    }

    /// How it was acquired.
    pub fn acquired(&self) -> Acquire {
        self.acquired
    }

    /// The key for a downstream provider, `idem_` and 32 hex digits: the same on every retry,
    /// takeover and after retention (retain at least as long as the provider; Stripe: 24 h, the
    /// default), so the provider dedupes a re-run effect. It reveals no key or account.
    ///
    /// ```
    /// use idem_core::store::{Acquire, Lease};
    /// use idem_core::{FencingToken, Request, Timestamp};
    /// let request = Request::builder("acct_1", "POST", "/charges").key(Some("k")).body(b"{}").build()?;
    /// let lease = |token| Lease::new(&request, token, Timestamp::from_millis(60_000), Acquire::FRESH);
    /// let (first, takeover) = (lease(FencingToken::generate()), lease(FencingToken::generate()));
    /// assert_eq!(first.downstream_key(), takeover.downstream_key());
    /// assert!(first.downstream_key().starts_with("idem_"));
    /// assert_eq!(first.downstream_key().len(), 37);
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn downstream_key(&self) -> String {
        self.id.downstream_key()
    }

    pub(crate) fn renewed(&mut self, lease_until: Timestamp, local_deadline: Instant) {
        self.lease_until = lease_until;
        self.local_deadline = Some(local_deadline);
    }

    pub(crate) fn set_local_deadline(&mut self, local_deadline: Instant) {
        self.local_deadline = Some(local_deadline);
    }

    pub(crate) fn local_deadline(&self) -> Option<Instant> {
        self.local_deadline
    }

    /// Carries the budget of the request that took the lease.
    pub(crate) fn share_budget(&mut self, budget: Arc<Budget>) {
        self.budget = budget::Shared(Some(budget));
    }

    /// The budget of the request that took the lease, if the engine took it.
    pub(crate) fn budget(&self) -> Option<Arc<Budget>> {
        self.budget.0.clone()
    }
}

/// `start + lease` (saturating a year on): the local deadline of a lease taken at `start`.
pub(crate) fn deadline_after(start: Instant, lease: Duration) -> Instant {
    start
        .checked_add(lease)
        .unwrap_or_else(|| start + Duration::from_secs(365 * 24 * 3600))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn downstream_key(id: &RecordId) -> String {
        id.downstream_key()
    }
    use crate::scope::tests::id;

    /// Pinned: a provider keeps the key it was sent for a day or more, so a record retried
    /// or taken over by another process, or by the next release, must send the same one. The
    /// values were computed apart from this code, with another blake3 implementation: the
    /// derive-key context, then each part as its length (u64, little-endian) and its bytes, the
    /// first 16 bytes of the digest in lowercase hex.
    #[test]
    fn c02_golden_downstream_keys() {
        let golden = [
            (
                (
                    "acct_42",
                    "POST /v1/charges",
                    "8e03978e-40d5-43e8-bc93-6894a57f9324",
                ),
                "idem_c2cdf5ee51d0b0bd01cf3d173bbff564",
            ),
            (
                (
                    "acct_43",
                    "POST /v1/charges",
                    "8e03978e-40d5-43e8-bc93-6894a57f9324",
                ),
                "idem_80f51019225577636c82b99c897e563d",
            ),
            (
                (
                    "acct_42",
                    "POST /v1/refunds",
                    "8e03978e-40d5-43e8-bc93-6894a57f9324",
                ),
                "idem_b9f41cdfafe61bd6305c18507b49050f",
            ),
            (
                ("stripe", "EVENT inbox", "k"),
                "idem_f7a11f5296f60c0e54984cf03f8980cb",
            ),
        ];
        for ((consumer, route, key), expected) in golden {
            assert_eq!(
                downstream_key(&id(consumer, route, key)),
                expected,
                "{consumer} {route} {key}"
            );
        }
    }

    #[test]
    fn c02_downstream_keys_are_scoped_and_cannot_collide_by_joining() {
        let triples = [
            id("a:b", "c", "d"),
            id("a", "b:c", "d"),
            id("a", "b", "c:d"),
            id("ab", "c", "d"),
            id("a", "bc", "d"),
            id("a", "b", "cd"),
        ];
        for (i, x) in triples.iter().enumerate() {
            for y in &triples[i + 1..] {
                assert_ne!(downstream_key(x), downstream_key(y), "{x:?} {y:?}");
            }
        }
    }

    #[test]
    fn c02_a_downstream_key_is_37_characters_every_provider_accepts() {
        for record in [
            id("c", "r", "k"),
            id(&"c".repeat(255), &"r".repeat(1024), &"~".repeat(255)),
        ] {
            let key = downstream_key(&record);
            assert_eq!(key.len(), 37, "{key}");
            assert!(key.starts_with("idem_"), "{key}");
            assert!(
                key[5..]
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                "{key}"
            );
        }
    }

    /// The same record, taken over by the next attempt after its holder's lease passed: a new
    /// token, the same downstream key, so the provider sees the first attempt's key again.
    #[tokio::test]
    async fn c09_a_takeover_sends_the_same_downstream_key() {
        use crate::{Begin, Idempotency, ManualClock, MemoryStore, Policy, Timestamp};
        let clock = ManualClock::new(Timestamp::from_millis(1_000));
        let policy = Policy::default().lease(Duration::from_secs(1));
        let idem = Idempotency::with_policy(MemoryStore::with_clock(clock.clone()), policy)
            .expect("a policy");
        let request = |consumer: &str| {
            idem.request(consumer, "POST", "/v1/charges")
                .key(Some("k-1"))
                .body(b"{}")
                .build()
                .expect("a request")
        };
        let Begin::Acquired(first) = idem.begin(&request("acct_1")).await.expect("begin") else {
            panic!("the first attempt acquires");
        };
        clock.advance(Duration::from_secs(2));
        let Begin::Acquired(takeover) = idem.begin(&request("acct_1")).await.expect("begin") else {
            panic!("the lease passed: the retry takes over");
        };
        assert_eq!(takeover.acquired(), Acquire::take_over(first.token()));
        assert_ne!(first.token(), takeover.token());
        assert_eq!(first.downstream_key(), takeover.downstream_key());
        let Begin::Acquired(other) = idem.begin(&request("acct_2")).await.expect("begin") else {
            panic!("another consumer's key is another record");
        };
        assert_ne!(other.downstream_key(), first.downstream_key());
    }
}
