//! What a store applies when a record in doubt is decided.

use crate::error::{Error, Field};
use crate::scope::RecordId;
use crate::token::FencingToken;
use crate::trail::{Decided, Reconciliation};
use std::time::Duration;

/// A decision about a record in doubt for [`Store::resolve`](crate::Store::resolve) (rule 7),
/// applied through [`Idempotency::store_call`](crate::Idempotency::store_call) (C16). A store
/// matches on the decision and writes the bytes the accessors give.
///
/// ```
/// use idem_core::store::{Decided, Reconciliation, Resolution};
/// use idem_core::{FencingToken, IdempotencyKey, RecordId, Scope, Timestamp};
/// use std::time::Duration;
/// let (token, at, day) = (FencingToken::generate(), Timestamp::from_millis(0), Duration::from_secs(86_400));
/// let decided = Decided::Settled { status: 201 };
/// let entry = Reconciliation { at, token, by: "alice".into(), decided, asked: "".into(), answer: "".into(), nonce: 7 };
/// let id = RecordId::new(Scope::new("acct_1", "POST /charges")?, IdempotencyKey::new("k1")?);
/// let resolution = Resolution::settle(id, b"mark".to_vec(), &entry, b"201".to_vec(), day, day)?;
/// match resolution.decided() {
///     Decided::Settled { .. } => assert_eq!(resolution.response(), b"201"), // and retain_for()
///     Decided::Released => unreachable!("delete the record"),
///     Decided::StillUnknown { .. } => unreachable!("write doubt(), due after retry_after"),
///     _ => unreachable!("a decision this store does not know: refuse it"),
/// }
/// assert_eq!((resolution.token(), resolution.entry()), (token, &entry.encode()[..]));
/// # Ok::<(), idem_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    id: RecordId,
    token: FencingToken,
    read: Vec<u8>,
    decided: Decided,
    written: Vec<u8>,
    retain_for: Duration,
    entry: Vec<u8>,
    keep_entry_for: Duration,
}

impl Resolution {
    /// The effect happened: `id` replays `response` for `retain_for`, unmarked, if it still
    /// carries `entry`'s token and the mark `read_doubt`; `entry` is kept for `keep_entry_for`.
    /// [`Error::InvalidInput`] if `entry` records another decision (so for the two below).
    pub fn settle(
        id: RecordId,
        read_doubt: Vec<u8>,
        entry: &Reconciliation,
        response: Vec<u8>,
        retain_for: Duration,
        keep_entry_for: Duration,
    ) -> Result<Self, Error> {
        let written = (response, retain_for);
        Self::of(id, read_doubt, entry, written, keep_entry_for, "settled")
    }

    /// The effect did not happen: the record is deleted, its key released (C8).
    pub fn release(
        id: RecordId,
        read_doubt: Vec<u8>,
        entry: &Reconciliation,
        keep_entry_for: Duration,
    ) -> Result<Self, Error> {
        let written = (Vec::new(), Duration::ZERO);
        Self::of(id, read_doubt, entry, written, keep_entry_for, "released")
    }

    /// Still unknown: the record keeps its answer, gets the mark `doubt` (one more attempt)
    /// and is due again after the decision's `retry_after`.
    pub fn defer(
        id: RecordId,
        read_doubt: Vec<u8>,
        entry: &Reconciliation,
        doubt: Vec<u8>,
        keep_entry_for: Duration,
    ) -> Result<Self, Error> {
        let (written, decision) = ((doubt, Duration::ZERO), "still_unknown");
        Self::of(id, read_doubt, entry, written, keep_entry_for, decision)
    }

    fn of(
        id: RecordId,
        read_doubt: Vec<u8>,
        entry: &Reconciliation,
        (written, retain_for): (Vec<u8>, Duration),
        keep_entry_for: Duration,
        decision: &str,
    ) -> Result<Self, Error> {
        if entry.decided.name() != decision {
            return Err(Error::invalid(
                Field::Config,
                format!("the entry records {}, not {decision}", entry.decided.name()),
            ));
        }
        Ok(Self {
            id,
            token: entry.token,
            read: read_doubt,
            decided: entry.decided,
            written,
            retain_for,
            entry: entry.encode(),
            keep_entry_for,
        })
    }

    /// The record decided about.
    pub fn id(&self) -> &RecordId {
        &self.id
    }

    /// The token the record must still carry: the entry's.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The mark of doubt, encoded, that the record must still carry: what the decider read.
    pub fn read_doubt(&self) -> &[u8] {
        &self.read
    }

    /// What was decided, as the entry records it.
    pub fn decided(&self) -> Decided {
        self.decided
    }

    /// For a settle, the real answer to store, encoded; empty otherwise.
    pub fn response(&self) -> &[u8] {
        match self.decided {
            Decided::Settled { .. } => &self.written,
            _ => &[],
        }
    }

    /// For a settle, how long the real answer is replayed from now; zero otherwise.
    pub fn retain_for(&self) -> Duration {
        self.retain_for
    }

    /// For a defer, the new mark, encoded; empty otherwise.
    pub fn doubt(&self) -> &[u8] {
        match self.decided {
            Decided::StillUnknown { .. } => &self.written,
            _ => &[],
        }
    }

    /// The audit entry ([`Reconciliation::encode`]), to keep with the store's `now`.
    pub fn entry(&self) -> &[u8] {
        &self.entry
    }

    /// How long the entry is kept from now ([`Policy::audit_retention`](crate::Policy::audit_retention)).
    pub fn keep_entry_for(&self) -> Duration {
        self.keep_entry_for
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IdempotencyKey, Scope, Timestamp};

    fn entry(decided: Decided) -> Reconciliation {
        Reconciliation {
            at: Timestamp::from_millis(0),
            token: FencingToken::generate(),
            by: "reconciler".into(),
            decided,
            asked: String::new(),
            answer: String::new(),
            nonce: 1,
        }
    }

    fn id() -> RecordId {
        let scope = Scope::new("acct", "POST /charges").expect("scope");
        RecordId::new(scope, IdempotencyKey::new("k").expect("key"))
    }

    #[test]
    fn the_decision_is_the_entrys_and_only_its_bytes_are_written() {
        let day = Duration::from_secs(86_400);
        let retry_after = Duration::from_secs(30);
        let deferred = entry(Decided::StillUnknown {
            attempt: 2,
            retry_after,
        });
        let defer = Resolution::defer(id(), b"old".to_vec(), &deferred, b"new".to_vec(), day)
            .expect("a deferring entry");
        assert_eq!(defer.decided(), deferred.decided);
        assert_eq!((defer.doubt(), defer.response()), (&b"new"[..], &b""[..]));
        assert_eq!(defer.entry(), deferred.encode());
        assert_eq!(defer.token(), deferred.token);

        let released = entry(Decided::Released);
        let release = Resolution::release(id(), b"old".to_vec(), &released, day).expect("release");
        assert_eq!((release.doubt(), release.response()), (&b""[..], &b""[..]));
    }

    #[test]
    fn an_entry_that_records_another_decision_is_refused() {
        let day = Duration::from_secs(86_400);
        let released = entry(Decided::Released);
        let settled = entry(Decided::Settled { status: 201 });
        let settle = Resolution::settle(id(), Vec::new(), &released, Vec::new(), day, day);
        assert!(matches!(settle, Err(Error::InvalidInput { .. })));
        assert!(Resolution::release(id(), Vec::new(), &settled, day).is_err());
        assert!(Resolution::defer(id(), Vec::new(), &settled, Vec::new(), day).is_err());
    }
}
