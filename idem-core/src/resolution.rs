//! What a store applies when a record in doubt is decided: one fenced compare-and-set and one
//! audit entry, in one atomic step.

use crate::scope::RecordId;
use crate::token::FencingToken;
use std::time::Duration;

/// A decision about a record in doubt, ready for the store (store rule 7 of
/// [`Store`](crate::Store)): the change, fenced on the record's token and on the mark of doubt
/// as the decider read it, and the audit entry to keep with it.
///
/// idem-ops' `resolve` makes one from a finding about a record in doubt it read, and applies it
/// through [`Idempotency::store_call`](crate::Idempotency::store_call), so every change of a
/// record in doubt goes through one path and reports its events (C16).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    pub(crate) id: RecordId,
    pub(crate) token: FencingToken,
    pub(crate) read: Vec<u8>,
    pub(crate) change: Change,
    pub(crate) entry: Vec<u8>,
    pub(crate) keep_entry_for: Duration,
}

/// How a [`Resolution`] changes its record.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Change {
    /// Store `response` (encoded as [`StoredResponse::encode`](crate::StoredResponse::encode)
    /// writes it) in place of the answer in doubt, clear the mark, and replay it until
    /// `now + retain_for`.
    Settle {
        /// The real answer, encoded.
        response: Vec<u8>,
        /// Its retention from now.
        retain_for: Duration,
    },
    /// Delete the record: the key is released (C8).
    Release,
    /// Keep the answer; replace the mark with `doubt` (one more attempt) and make the record
    /// due again at `now + retry_after`.
    Defer {
        /// The new mark, encoded ([`Doubt::encode`](crate::store::Doubt::encode)).
        doubt: Vec<u8>,
        /// When it is due again, from now.
        retry_after: Duration,
    },
}

impl Resolution {
    /// A decision about the record `id` that still carries `token` and the mark `read_doubt`
    /// (encoded as [`Doubt::encode`](crate::store::Doubt::encode) writes it): make `change`,
    /// and keep `entry` ([`Reconciliation::encode`](crate::store::Reconciliation::encode)) in
    /// its audit trail for `keep_entry_for`.
    pub fn new(
        id: RecordId,
        token: FencingToken,
        read_doubt: Vec<u8>,
        change: Change,
        entry: Vec<u8>,
        keep_entry_for: Duration,
    ) -> Self {
        Self {
            id,
            token,
            read: read_doubt,
            change,
            entry,
            keep_entry_for,
        }
    }

    /// The record decided about.
    pub fn id(&self) -> &RecordId {
        &self.id
    }

    /// The token the record must still carry.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The mark of doubt, encoded, that the record must still carry: what the decider read.
    pub fn read_doubt(&self) -> &[u8] {
        &self.read
    }

    /// The change.
    pub fn change(&self) -> &Change {
        &self.change
    }

    /// The audit entry ([`Reconciliation::encode`](crate::store::Reconciliation::encode)), to keep
    /// with the store's `now`.
    pub fn entry(&self) -> &[u8] {
        &self.entry
    }

    /// How long the entry is kept from now ([`Policy::audit_retention`](crate::Policy::audit_retention)).
    pub fn keep_entry_for(&self) -> Duration {
        self.keep_entry_for
    }
}
