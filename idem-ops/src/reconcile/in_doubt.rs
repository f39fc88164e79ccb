//! One record in doubt, as a reconciler reads it.

use crate::listing::Inspected;
use idem_core::store::{Doubt, RecordState};
use idem_core::{FencingToken, Fingerprint, RecordId, StoredResponse, Timestamp};

/// A completed record whose answer is in doubt, read whole: what a reconciler needs to ask the
/// provider (the triple, the request's fingerprint, the handler's [`note`](Doubt::note), the
/// [`downstream_key`](Self::downstream_key) the handler sent), and what it was answered so far.
///
/// Read it with [`in_doubt`](super::in_doubt); a decision about it is
/// applied only while the record still carries the mark as read here (two deciders that read
/// it, one wins).
///
/// ```
/// use idem_core::{Failure, Idempotency, MemoryStore, StoredResponse};
/// use idem_ops::reconcile::{in_doubt, InDoubt};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let idem = Idempotency::new(MemoryStore::new());
/// let request = idem.request("acct_1", "POST", "/charges").key(Some("k1")).body(b"{}").build()?;
/// let _ = idem.run(&request, |_ctx| async {
///     Err::<StoredResponse, _>(Failure::unknown("network timed out").noting("auth 3f2a"))
/// }).await;
/// let case: InDoubt = in_doubt(&idem, request.id()).await?.expect("in doubt");
/// assert_eq!(case.answer.status, 500);
/// assert_eq!(case.doubt.note, "auth 3f2a");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InDoubt {
    /// The record's (consumer, route, key).
    pub id: RecordId,
    /// The fingerprint of the request that executed (C3).
    pub fingerprint: Fingerprint,
    /// The token of the execution in doubt.
    pub token: FencingToken,
    /// The answer in doubt, as replayed to every retry until the record is settled.
    pub answer: StoredResponse,
    /// Why, what the handler attached, how many checks found it still unknown.
    pub doubt: Doubt,
    /// When the execution's reservation was made, if the store knows.
    pub reserved_at: Option<Timestamp>,
    /// When the answer in doubt was stored, if the store knows.
    pub completed_at: Option<Timestamp>,
    /// When the key is new again unless the record is settled first (C10).
    pub expires_at: Timestamp,
    /// When the record is next due for a check.
    pub check_at: Option<Timestamp>,
    /// The mark as stored: what a decision is fenced on.
    pub(super) read: Vec<u8>,
}

impl InDoubt {
    /// The record in doubt that `inspected` (the record of `id`) is, or `None` for one that is
    /// not (in progress, completed with its own answer).
    pub fn from_inspected(id: RecordId, inspected: Inspected) -> Option<InDoubt> {
        let doubt = inspected.doubt?;
        // A mark about another execution (left by a release that did not know marks).
        if doubt.token != inspected.record.token {
            return None;
        }
        let RecordState::Completed {
            response,
            expires_at,
        } = inspected.record.state
        else {
            return None;
        };
        Some(InDoubt {
            id,
            fingerprint: inspected.record.fingerprint,
            token: inspected.record.token,
            answer: response,
            read: doubt.encode(),
            doubt,
            reserved_at: inspected.provenance.reserved_at,
            completed_at: inspected.provenance.completed_at,
            expires_at,
            check_at: inspected.check_at,
        })
    }

    /// The idempotency key the handler was given for its downstream call
    /// ([`Context::downstream_key`](idem_core::Context::downstream_key)): what to ask the
    /// provider by.
    pub fn downstream_key(&self) -> String {
        self.id.downstream_key()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Provenance;
    use idem_core::store::{DoubtCause, Record};
    use idem_core::{IdempotencyKey, Scope};

    fn inspected(record_token: FencingToken, doubt_token: FencingToken) -> Inspected {
        Inspected {
            record: Record {
                fingerprint: Fingerprint::builder().body(b"{}").finish(),
                token: record_token,
                state: RecordState::Completed {
                    response: StoredResponse::new(500, "in doubt"),
                    expires_at: Timestamp::from_millis(10),
                },
            },
            provenance: Provenance::default(),
            doubt: Some(Doubt {
                token: doubt_token,
                ..Doubt::new(DoubtCause::Failure, "n")
            }),
            check_at: Some(Timestamp::from_millis(1)),
        }
    }

    fn id() -> RecordId {
        RecordId::new(
            Scope::new("acct", "POST /charges").expect("valid"),
            IdempotencyKey::new("k").expect("valid"),
        )
    }

    #[test]
    fn c08_a_mark_about_another_execution_is_not_doubt() {
        let token = FencingToken::generate();
        assert!(InDoubt::from_inspected(id(), inspected(token, token)).is_some());
        // A start over by a release that did not clear marks: the record has a new token.
        let stale = inspected(FencingToken::generate(), token);
        assert!(InDoubt::from_inspected(id(), stale).is_none());
    }
}
