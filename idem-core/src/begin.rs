//! What a reservation attempt returns: a lease to run the effect under, or an answer.

use crate::answer::Answer;
use crate::lease::Lease;

/// The outcome of [`Store::reserve`](crate::Store::reserve) and
/// [`Idempotency::begin`](crate::Idempotency::begin).
///
/// ```
/// use idem_core::{Answer, Begin, Idempotency, MemoryStore};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_core::Error> {
/// let idem = Idempotency::new(MemoryStore::new());
/// let request = idem.request("acct_1", "POST", "/charges").key(Some("k")).body(b"{}").build()?;
/// let Begin::Acquired(_lease) = idem.begin(&request).await? else { unreachable!() };
/// let again = idem.begin(&request).await?;
/// assert!(matches!(again, Begin::Answered(Answer::InFlight { .. })));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Begin {
    /// The caller holds the record: run the effect, then complete (or release if nothing
    /// happened).
    Acquired(Lease),
    /// The caller is answered without running anything: a replay, in flight, or a mismatch.
    Answered(Answer),
}
