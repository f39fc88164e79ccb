//! The unique-constraint alternative: an idempotent create without an idempotency table (each
//! SQL store's `insert_or_fetch`), answered as a reservation is.

use crate::answer::Answer;
use crate::begin::Begin;

/// What `insert_or_fetch` answers, in a reservation's words: [`Begin::Acquired`] with the row
/// this request inserted (201); for a row already there, a retry's
/// [`Answer::Replay`] of it (200) if `same_request`, else [`Answer::Mismatch`] (422: a reused
/// identifier; never overwrite the row). Never [`Answer::InFlight`]: a concurrent create waits
/// for the row's transaction.
///
/// ```
/// use idem_core::store::existing_row;
/// use idem_core::{Answer, Begin};
/// assert_eq!(existing_row(7, true), Begin::Answered(Answer::Replay(7)));
/// assert_eq!(existing_row(7, false), Begin::Answered(Answer::Mismatch));
/// ```
pub fn existing_row<T>(row: T, same_request: bool) -> Begin<T, T> {
    Begin::Answered(if same_request {
        Answer::Replay(row)
    } else {
        Answer::Mismatch
    })
}

/// For store writers: `insert_or_fetch`'s INSERT inserted nothing and its fetch found no row,
/// `attempts` times: its statements do not name the same key.
pub fn unresolved_insert_or_fetch(backend: &'static str, attempts: usize) -> crate::Error {
    crate::Error::store(
        backend,
        crate::StoreErrorKind::Misconfigured,
        format!(
            "insert_or_fetch: the INSERT inserted nothing and the fetch found no row, {attempts} times: \
             the INSERT's ON CONFLICT must name the key's constraint, and the fetch must look up the same key"
        ),
    )
}
