//! Records in doubt and their reconciliation (docs/state-machine.md, "Records in doubt").
//!
//! An execution whose outcome is unknown (the card network timed out after the request was
//! sent) keeps its key with an answer in doubt (C8): a 500, or the handler's own answer, marked
//! with a [`Doubt`]. Nothing re-runs blind; the other half is here: the application asks the
//! provider about each record in doubt (idem-ops runs its check periodically) and says what it
//! found ([`Finding`]): the effect happened ([`Verdict::Settled`]: its real answer replaces the one in
//! doubt), it did not ([`Verdict::NotHappened`]: the key is released and the next retry runs),
//! or nobody knows yet ([`Verdict::StillUnknown`]: asked again after a backoff).
//!
//! Every decision is one fenced compare-and-set on the mark of doubt it read
//! ([`Store::resolve`](crate::Store::resolve)): two reconcilers, or a reconciler and an operator, that read one record
//! never both win; a record released and executed again carries another token, which no
//! decision about the old execution can touch. Each applied decision leaves an entry
//! ([`Reconciliation`]) in the store's audit trail in the same atomic step, readable with
//! [`Operator::reconciliations`] and the `idem doubt` commands.
//!
//! ```
//! use idem_core::reconcile::{Finding, Resolved};
//! use idem_core::{Answer, Failure, Idempotency, MemoryStore, Outcome, StoredResponse};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let idem = Idempotency::new(MemoryStore::new());
//! let request = idem.request("acct_1", "POST", "/charges").key(Some("k1")).body(b"{}").build()?;
//! // The card network timed out after the request was sent: the outcome is unknown.
//! let first = idem.run(&request, |_ctx| async {
//!     Err::<StoredResponse, _>(Failure::unknown("card network timed out"))
//! }).await;
//! assert!(first.is_err());
//!
//! // The reconciler asks the network by the key the handler sent it: it did charge.
//! let case = idem.in_doubt(request.id()).await?.expect("in doubt");
//! let finding = Finding::settled(StoredResponse::new(201, r#"{"id":"ch_1"}"#))
//!     .asked(format!("GET /authorizations/{}", case.downstream_key()))
//!     .answered("captured");
//! assert!(matches!(idem.resolve(&case, finding, "reconciler").await?, Resolved::Settled(_)));
//!
//! // The client's retry gets the real charge; nothing ran again.
//! let retry = idem.run(&request, |_ctx| async {
//!     Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "never sent"))
//! }).await?;
//! assert!(matches!(retry, Outcome::Answered(Answer::Replay(r)) if r.body == br#"{"id":"ch_1"}"#));
//! assert_eq!(idem.store().reconciliations(request.id()).await?.len(), 1);
//! # use idem_core::store::Operator;
//! # Ok(())
//! # }
//! ```

mod finding;
mod in_doubt;

pub use crate::doubt::{Doubt, DoubtCause};
pub use crate::resolution::{Change, Resolution};
pub use crate::trail::{Decided, Reconciliation};
pub use finding::{Finding, Verdict};
pub use in_doubt::InDoubt;

use crate::engine::Idempotency;
use crate::error::{Error, Field};
use crate::event::{Event, EventKind, Operation};
use crate::response::StoredResponse;
use crate::scope::RecordId;
use crate::store::Operator;
use std::time::Duration;

/// When a record found still unknown at its `attempt`-th check is due again, unless the
/// finding said ([`Finding::retry_after`]): 30 s, doubling at each attempt, at most an hour.
///
/// ```
/// use idem_core::reconcile::backoff;
/// use std::time::Duration;
/// assert_eq!(backoff(1), Duration::from_secs(30));
/// assert_eq!(backoff(2), Duration::from_secs(60));
/// assert_eq!(backoff(40), Duration::from_secs(3600));
/// ```
pub fn backoff(attempt: u32) -> Duration {
    let first = Duration::from_secs(30);
    let max = Duration::from_secs(3600);
    let doublings = attempt.saturating_sub(1).min(16);
    first.saturating_mul(1 << doublings).min(max)
}

/// What one decision about a record in doubt did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resolved {
    /// The real answer is stored (as here, filtered by the policy) and replayed.
    Settled(StoredResponse),
    /// The key was released: the next retry executes.
    Released,
    /// Still unknown; due again after `retry_after`.
    Deferred {
        /// How many checks found it unknown, this one included.
        attempt: u32,
        /// When it is due again.
        retry_after: Duration,
    },
    /// The record changed since it was read (another decider won, or its retention passed):
    /// nothing was written.
    Contested,
}

/// A random number for one decision ([`Reconciliation::nonce`]).
fn nonce() -> u64 {
    // A fresh token is 16 random bytes; half of them is plenty for one record's trail.
    let [a, b, c, d, e, f, g, h, ..] = *crate::token::FencingToken::generate().as_bytes();
    u64::from_be_bytes([a, b, c, d, e, f, g, h])
}

impl<S: Operator> Idempotency<S> {
    /// Whether the trail of `id` holds `entry` (its token and nonce): the decision applied.
    async fn decision_landed(&self, id: &RecordId, entry: &Reconciliation) -> Result<bool, Error> {
        let trail = self
            .store_call(
                Operation::Inspect,
                Some(id),
                self.store().reconciliations(id),
            )
            .await?;
        Ok(trail
            .iter()
            .any(|kept| kept.token == entry.token && kept.nonce == entry.nonce))
    }

    /// Applies `finding` to the record in doubt `case`, as decided `by` (a name for the audit
    /// trail: an operator, a reconciler): settles it with its real answer, releases its key,
    /// or defers it, in one fenced step with its audit entry ([`Store::resolve`](crate::Store::resolve)). If the record
    /// changed since `case` was read, nothing is written and the answer is
    /// [`Resolved::Contested`]; a decision that applied but whose answer the store lost (and
    /// that it tried again) is told by its own entry in the trail, so it is reported applied.
    /// A settled answer that cannot be stored (a status outside
    /// 100..=599, a header with a control character) is [`Error::InvalidInput`], nothing
    /// written.
    ///
    /// ```
    /// use idem_core::reconcile::{Finding, Resolved};
    /// use idem_core::{Failure, Idempotency, MemoryStore, StoredResponse};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let request = idem.request("acct_1", "POST", "/charges").key(Some("k1")).body(b"{}").build()?;
    /// let _ = idem.run(&request, |_ctx| async {
    ///     Err::<StoredResponse, _>(Failure::unknown("network timed out"))
    /// }).await;
    /// let case = idem.in_doubt(request.id()).await?.expect("in doubt");
    /// let finding = Finding::not_happened().answered("no authorization in the dashboard");
    /// assert_eq!(idem.resolve(&case, finding.clone(), "operator alice").await?, Resolved::Released);
    /// // The same case again: the record is gone, the decision loses.
    /// assert_eq!(idem.resolve(&case, finding, "operator bob").await?, Resolved::Contested);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn resolve(
        &self,
        case: &InDoubt,
        finding: Finding,
        by: &str,
    ) -> Result<Resolved, Error> {
        let policy = self.policy();
        let (verdict, asked, answer) = finding.into_parts();
        let (change, decided, resolved) = match verdict {
            Verdict::Settled(response) => {
                let response = policy.prepare(response)?;
                let encoded = response.encode()?;
                (
                    Change::Settle {
                        response: encoded,
                        retain_for: policy.retention,
                    },
                    Decided::Settled {
                        status: response.status,
                    },
                    Resolved::Settled(response),
                )
            }
            Verdict::NotHappened => (Change::Release, Decided::Released, Resolved::Released),
            Verdict::StillUnknown { retry_after } => {
                // Every decision changes the mark (that is what fences the next one): a mark
                // that cannot count one more attempt is settled or released, not deferred.
                let attempt = case.doubt.attempts.checked_add(1).ok_or_else(|| {
                    Error::invalid(
                        Field::Config,
                        "this record was found still unknown too often to defer it again: settle or release it",
                    )
                })?;
                let retry_after = retry_after.unwrap_or_else(|| backoff(attempt));
                let doubt = Doubt {
                    attempts: attempt,
                    ..case.doubt.clone()
                };
                (
                    Change::Defer {
                        doubt: doubt.encode(),
                        retry_after,
                    },
                    Decided::StillUnknown {
                        attempt,
                        retry_after,
                    },
                    Resolved::Deferred {
                        attempt,
                        retry_after,
                    },
                )
            }
        };
        let entry = Reconciliation {
            at: crate::clock::Timestamp::from_millis(0),
            token: case.token,
            by: crate::doubt::bounded(by.to_owned(), Reconciliation::MAX_BY),
            decided,
            asked,
            answer,
            nonce: nonce(),
        };
        let resolution = Resolution {
            id: case.id.clone(),
            token: case.token,
            read: case.read.clone(),
            change,
            entry: entry.encode(),
            keep_entry_for: policy.audit_retention,
        };
        let mut applied = self
            .store_call(
                Operation::Resolve,
                Some(&case.id),
                self.store().resolve(&resolution),
            )
            .await?;
        if !applied {
            // A store that lost the answer of an attempt that applied, and tried again, finds
            // the mark changed: by this decision, if the trail has its entry.
            applied = self.decision_landed(&case.id, &entry).await?;
        }
        let (kind, resolved) = match (applied, resolved) {
            (false, _) => (EventKind::DoubtContested, Resolved::Contested),
            (true, resolved @ Resolved::Settled(_)) => (EventKind::DoubtSettled, resolved),
            (true, resolved @ Resolved::Released) => (EventKind::DoubtReleased, resolved),
            (true, resolved) => (EventKind::DoubtDeferred, resolved),
        };
        self.emit(Event::new(kind).about(&case.id).held_by(case.token));
        Ok(resolved)
    }

    /// The record `id` if its answer is in doubt, read now; `None` if there is none or it is
    /// not in doubt (in progress, settled, released, or marked about an earlier execution).
    /// Read as stored: a record whose retention passed but that is not purged yet is returned
    /// (see [`InDoubt::expires_at`]), and a decision about it is contested, as about any
    /// expired record. A mark that does not decode is [`Error::CorruptRecord`]: the record
    /// keeps replaying its answer until its retention passes, and no decision can be made.
    pub async fn in_doubt(&self, id: &RecordId) -> Result<Option<InDoubt>, Error> {
        let inspected = self
            .store_call(Operation::Inspect, Some(id), self.store().inspect(id))
            .await?;
        Ok(inspected.and_then(|inspected| InDoubt::from_inspected(id.clone(), inspected)))
    }
}
