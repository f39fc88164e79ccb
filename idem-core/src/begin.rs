//! What a reservation attempt returns: a lease to run the effect under, or an answer.

use crate::clock::Timestamp;
use crate::decision::Acquire;
use crate::fingerprint::Fingerprint;
use crate::outcome::Outcome;
use crate::request::Request;
use crate::response::StoredResponse;
use crate::scope::RecordId;
use crate::token::FencingToken;
use std::ops::ControlFlow;
use std::time::Duration;

/// The right to run a request's effect, held until completion, release or the deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The record.
    pub id: RecordId,
    /// The request's fingerprint.
    pub fingerprint: Fingerprint,
    /// The fencing token the record carries while this lease holds (C6).
    pub token: FencingToken,
    /// When the lease ends unless renewed (C9), in the store's own time.
    pub lease_until: Timestamp,
    /// How it was acquired (fresh, takeover of an orphan, start over after retention).
    pub acquired: Acquire,
}

impl Lease {
    /// A lease for `request` with a fresh token, as a store writes it.
    pub fn new(request: &Request, lease_until: Timestamp, acquired: Acquire) -> Self {
        Self {
            id: request.id.clone(),
            fingerprint: request.fingerprint,
            token: FencingToken::generate(),
            lease_until,
            acquired,
        }
    }
}

/// The outcome of [`Store::reserve`](crate::Store::reserve) and
/// [`Idempotency::begin`](crate::Idempotency::begin).
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Begin {
    /// The caller holds the record: run the effect, then complete (or release on error).
    Acquired(Lease),
    /// A completed duplicate: answer with this response, marked as a replay (C7).
    Replay(StoredResponse),
    /// A duplicate still running elsewhere: answer 409 (or 202) at once (C5).
    InFlight {
        /// Time left on the running lease.
        retry_after: Duration,
    },
    /// Same key, another request: answer 422, nothing runs (C3).
    Mismatch,
}

impl Begin {
    /// What a closure-style caller does next: [`ControlFlow::Continue`] with the lease to run the
    /// effect under, or [`ControlFlow::Break`] with the outcome to return without running it.
    ///
    /// ```
    /// use idem_core::{Begin, Outcome};
    /// use std::ops::ControlFlow;
    /// assert_eq!(Begin::Mismatch.next_step(), ControlFlow::Break(Outcome::Mismatch));
    /// ```
    pub fn next_step(self) -> ControlFlow<Outcome, Lease> {
        match self {
            Begin::Acquired(lease) => ControlFlow::Continue(lease),
            Begin::Replay(response) => ControlFlow::Break(Outcome::Replayed(response)),
            Begin::InFlight { retry_after } => {
                ControlFlow::Break(Outcome::InFlight { retry_after })
            }
            Begin::Mismatch => ControlFlow::Break(Outcome::Mismatch),
        }
    }
}
