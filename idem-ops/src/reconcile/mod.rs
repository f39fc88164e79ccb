//! Records in doubt and their reconciliation (docs/state-machine.md, "Records in doubt").
//!
//! An execution whose outcome is unknown (the card network timed out after the request was
//! sent) keeps its key with an answer in doubt (C8): a 500, or the handler's own answer, marked
//! with a [`Doubt`]. Nothing re-runs blind; the other half is here: the application asks the
//! provider about each record in doubt ([`reconcile_every`](crate::reconcile_every) runs its
//! check periodically) and says what it found ([`Finding`]): the effect happened
//! ([`Finding::settled`]: its real answer replaces the one in doubt), it did not
//! ([`Finding::not_happened`]: the key is released and the next retry runs), or nobody knows
//! yet ([`Finding::still_unknown`]: asked again after a backoff). [`in_doubt`] reads a record
//! in doubt, [`resolve`] applies a finding about it and answers what was [`Decided`].
//!
//! Every decision is one fenced compare-and-set on the mark of doubt it read
//! ([`Store::resolve`](idem_core::Store::resolve)): two reconcilers, or a reconciler and an
//! operator, that read one record never both win; a record released and executed again
//! carries another token, which no decision about the old execution can touch. Each applied
//! decision leaves an entry ([`Reconciliation`]) in the store's audit trail in the same atomic
//! step, readable with [`Operator::reconciliations`] and the `idem doubt` commands.
//!
//! ```
//! use idem_core::{Answer, Failure, Idempotency, MemoryStore, Outcome, StoredResponse};
//! use idem_ops::reconcile::{in_doubt, resolve, Decided, Finding};
//! use idem_core::store::Deadline;
//! use idem_ops::Operator;
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
//! let case = in_doubt(&idem, request.id()).await?.expect("in doubt");
//! let finding = Finding::settled(StoredResponse::new(201, r#"{"id":"ch_1"}"#))
//!     .asked(format!("GET /authorizations/{}", case.downstream_key()))
//!     .answered("captured");
//! let decided = resolve(&idem, &case, finding, "reconciler").await?;
//! assert_eq!(decided, Some(Decided::Settled { status: 201 }));
//!
//! // The client's retry gets the real charge; nothing ran again.
//! let retry = idem.run(&request, |_ctx| async {
//!     Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "never sent"))
//! }).await?;
//! assert!(matches!(retry, Outcome::Answered(Answer::Replay(r)) if r.body == br#"{"id":"ch_1"}"#));
//! let trail = idem.store().reconciliations(request.id(), Deadline::default()).await?;
//! assert_eq!(trail.len(), 1);
//! # Ok(())
//! # }
//! ```

mod finding;
mod in_doubt;

pub use finding::Finding;
pub use idem_core::store::{Decided, Doubt, DoubtCause, Reconciliation};
pub use in_doubt::InDoubt;

use crate::operator::Operator;
use finding::Found;
use idem_core::store::Resolution;
use idem_core::Timestamp;
use idem_core::{Error, Event, EventKind, FencingToken, Field, Idempotency, Operation, RecordId};
use std::time::Duration;

/// When a record found still unknown at its `attempt`-th check is due again, unless the
/// finding said ([`Finding::retry_after`]): 30 s, doubling at each attempt, at most an hour.
///
/// ```
/// use idem_ops::reconcile::backoff;
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

/// A random number for one decision ([`Reconciliation::nonce`]).
fn nonce() -> u64 {
    // A fresh token is 16 random bytes; half of them is plenty for one record's trail.
    let [a, b, c, d, e, f, g, h, ..] = *FencingToken::generate().as_bytes();
    u64::from_be_bytes([a, b, c, d, e, f, g, h])
}

/// Whether the trail of `id` holds `entry` (its token and nonce): the decision applied.
async fn decision_landed<S: Operator>(
    idem: &Idempotency<S>,
    id: &RecordId,
    entry: &Reconciliation,
) -> Result<bool, Error> {
    let trail = idem
        .store_call(Operation::Inspect, Some(id), |deadline| {
            idem.store().reconciliations(id, deadline)
        })
        .await?;
    Ok(trail
        .iter()
        .any(|kept| kept.token == entry.token && kept.nonce == entry.nonce))
}

/// Applies `finding` to the record in doubt `case` through `idem`, as decided `by` (a name for
/// the audit trail: an operator, a reconciler): settles it with its real answer (filtered by
/// the engine's policy), releases its key, or defers it, in one fenced step with its audit
/// entry ([`Store::resolve`](idem_core::Store::resolve)), reported as the engine's events.
/// Returns what was decided, as the audit trail keeps it; `None` if the record changed since
/// `case` was read (nothing is written: another decider won, or its retention passed). A
/// decision that applied but whose answer the store lost (and that it tried again) is told by
/// its own entry in the trail, so it is reported applied. A settled answer that cannot be
/// stored (a status outside 100..=599, a header with a control character) is
/// [`Error::InvalidInput`], nothing written.
///
/// ```
/// use idem_core::{Failure, Idempotency, MemoryStore, StoredResponse};
/// use idem_ops::reconcile::{in_doubt, resolve, Decided, Finding};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let idem = Idempotency::new(MemoryStore::new());
/// let request = idem.request("acct_1", "POST", "/charges").key(Some("k1")).body(b"{}").build()?;
/// let _ = idem.run(&request, |_ctx| async {
///     Err::<StoredResponse, _>(Failure::unknown("network timed out"))
/// }).await;
/// let case = in_doubt(&idem, request.id()).await?.expect("in doubt");
/// let finding = Finding::not_happened().answered("no authorization in the dashboard");
/// assert_eq!(resolve(&idem, &case, finding.clone(), "operator alice").await?, Some(Decided::Released));
/// // The same case again: the record is gone, the decision loses.
/// assert_eq!(resolve(&idem, &case, finding, "operator bob").await?, None);
/// # Ok(())
/// # }
/// ```
pub async fn resolve<S: Operator>(
    idem: &Idempotency<S>,
    case: &InDoubt,
    finding: Finding,
    by: &str,
) -> Result<Option<Decided>, Error> {
    let policy = idem.policy();
    let (found, asked, answer) = finding.into_parts();
    let entry = |decided| Reconciliation {
        at: Timestamp::from_millis(0),
        token: case.token,
        by: finding::bounded(by.to_owned(), Reconciliation::MAX_BY),
        decided,
        asked,
        answer,
        nonce: nonce(),
    };
    let (id, read, keep_entry_for) = (case.id.clone(), case.read.clone(), policy.audit_retention);
    let (entry, resolution) = match found {
        Found::Settled(response) => {
            let response = policy.prepare(response)?;
            let entry = entry(Decided::Settled {
                status: response.status,
            });
            let encoded = response.encode()?;
            let resolution =
                Resolution::settle(id, read, &entry, encoded, policy.retention, keep_entry_for)?;
            (entry, resolution)
        }
        Found::NotHappened => {
            let entry = entry(Decided::Released);
            let resolution = Resolution::release(id, read, &entry, keep_entry_for)?;
            (entry, resolution)
        }
        Found::StillUnknown(retry_after) => {
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
            let entry = entry(Decided::StillUnknown {
                attempt,
                retry_after,
            });
            let resolution = Resolution::defer(id, read, &entry, doubt.encode(), keep_entry_for)?;
            (entry, resolution)
        }
    };
    let decided = resolution.decided();
    let mut applied = idem
        .store_call(Operation::Resolve, Some(&case.id), |deadline| {
            idem.store().resolve(&resolution, deadline)
        })
        .await?;
    if !applied {
        // A store that lost the answer of an attempt that applied, and tried again, finds
        // the mark changed: by this decision, if the trail has its entry.
        applied = decision_landed(idem, &case.id, &entry).await?;
    }
    let kind = match (applied, decided) {
        (false, _) => EventKind::DoubtContested,
        (true, Decided::Settled { .. }) => EventKind::DoubtSettled,
        (true, Decided::Released) => EventKind::DoubtReleased,
        (true, _) => EventKind::DoubtDeferred,
    };
    idem.emit(Event::new(kind).about(&case.id).held_by(case.token));
    Ok(applied.then_some(decided))
}

/// The record `id` if its answer is in doubt, read now through `idem`; `None` if there is
/// none or it is not in doubt (in progress, settled, released, or marked about an earlier
/// execution). Read as stored: a record whose retention passed but that is not purged yet is
/// returned (see [`InDoubt::expires_at`]), and a decision about it is contested, as about any
/// expired record. A mark that does not decode is [`Error::CorruptRecord`]: the record keeps
/// replaying its answer until its retention passes, and no decision can be made.
pub async fn in_doubt<S: Operator>(
    idem: &Idempotency<S>,
    id: &RecordId,
) -> Result<Option<InDoubt>, Error> {
    let inspected = idem
        .store_call(Operation::Inspect, Some(id), |deadline| {
            idem.store().inspect(id, deadline)
        })
        .await?;
    Ok(inspected.and_then(|inspected| InDoubt::from_inspected(id.clone(), inspected)))
}
