//! What a request gets at the start: it acquires the record, or it is answered.

use crate::answer::Answer;
use crate::lease::Lease;
use crate::response::StoredResponse;

/// What a request gets at the start: it acquires the record (`A`), or it is answered without
/// running anything (an [`Answer`]). One enum for every layer of the state machine:
///
/// - `Begin` (a [`Lease`] and a stored response): what a reservation ends in
///   ([`Reservation`](crate::store::Reservation)) and [`Idempotency::begin`](crate::Idempotency::begin)
///   returns;
/// - [`Decision`](crate::store::Decision) (`Begin<Acquire, R>`): what the pure
///   [`decide`](crate::store::decide) says, before a store applies it.
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
pub enum Begin<A = Lease, R = StoredResponse> {
    /// The caller acquires the record: run the effect, then complete (or release if nothing
    /// happened). For a decision, how it acquires ([`Acquire`](crate::store::Acquire)).
    Acquired(A),
    /// The caller is answered without running anything: a replay, in flight, or a mismatch.
    Answered(Answer<R>),
}
