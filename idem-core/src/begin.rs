//! What a request gets at the start: it acquires the record, or it is answered.

use crate::answer::Answer;
use crate::lease::Lease;
use crate::response::StoredResponse;

/// What a request gets at the start: the record (`A`: a [`Lease`], or a decision's `Acquire`),
/// or an [`Answer`].
///
/// ```
/// use idem_core::{Answer, Begin, Idempotency, MemoryStore};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
/// let idem = Idempotency::new(MemoryStore::new());
/// let request = idem.request("acct_1", "POST", "/charges").key(Some("k")).body(b"{}").build()?;
/// let Begin::Acquired(_lease) = idem.begin(&request).await? else { unreachable!() };
/// assert!(matches!(idem.begin(&request).await?, Begin::Answered(Answer::InFlight { .. })));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Begin<A = Lease, R = StoredResponse> {
    /// Run the effect, then complete or release.
    Acquired(A),
    /// Answered without running anything.
    Answered(Answer<R>),
}
