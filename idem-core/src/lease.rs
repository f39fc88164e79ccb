//! The right to run a request's effect.

use crate::clock::Timestamp;
use crate::decision::Acquire;
use crate::fingerprint::Fingerprint;
use crate::request::Request;
use crate::scope::RecordId;
use crate::token::FencingToken;
use std::time::{Duration, Instant};

/// The right to run a request's effect, held until completion, release or the deadline.
///
/// A store makes it when it writes a reservation ([`Lease::new`], with the token it wrote and the
/// deadline in the store's own time, which a server store may learn from the server); the engine
/// hands it to the caller, who completes or releases with it.
///
/// ```
/// use idem_core::store::{Acquire, Lease};
/// use idem_core::{FencingToken, Request, Timestamp};
/// let request = Request::builder("acct_1", "POST", "/charges").key(Some("k")).body(b"{}").build()?;
/// let token = FencingToken::generate();
/// let lease = Lease::new(&request, token, Timestamp::from_millis(60_000), Acquire::Fresh);
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
    /// When the lease ends by this process's monotonic clock, as far as the engine knows (set
    /// by the engine from the policy's lease, measured from before the reservation was sent).
    local_deadline: Option<Instant>,
}

impl Lease {
    /// The lease a store hands out after writing an in-progress record for `request` carrying
    /// `token`, with `lease_until` as its deadline in the store's time.
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

    /// How it was acquired (fresh, takeover of an orphan, start over after retention).
    pub fn acquired(&self) -> Acquire {
        self.acquired
    }

    pub(crate) fn renewed(&mut self, lease_until: Timestamp, local_deadline: Instant) {
        self.lease_until = lease_until;
        self.local_deadline = Some(local_deadline);
    }

    pub(crate) fn set_local_deadline(&mut self, local_deadline: Instant) {
        self.local_deadline = Some(local_deadline);
    }

    /// The engine's estimate of when the lease ends, by the monotonic clock.
    pub(crate) fn local_deadline(&self) -> Option<Instant> {
        self.local_deadline
    }
}

/// `start + lease`, saturating far in the future: the local deadline of a lease taken or
/// renewed at `start` (the engine's, and the metrics decorator's view of it).
pub(crate) fn deadline_after(start: Instant, lease: Duration) -> Instant {
    start
        .checked_add(lease)
        .unwrap_or_else(|| start + Duration::from_secs(365 * 24 * 3600))
}
