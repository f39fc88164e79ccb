//! One store call of a request (C13, C16): bounded by what is left of its budget, charged to
//! it, and reported as an event.

use crate::budget::Budget;
use crate::deadline::Deadline;
use crate::error::Error;
use crate::event::{Event, EventKind, Operation};
use crate::scope::RecordId;
use crate::timeout::is_timed_out;
use std::future::Future;
use std::time::Instant;

/// Runs one store call within what is left of `budget`, charging the time waited, and `emit`s
/// it as a [`StoreCall`](EventKind::StoreCall) event and, when it spent the rest, a
/// [`BudgetSpent`](EventKind::BudgetSpent) one naming the step. A spent budget starts no call.
pub(crate) async fn spend<T, F, C>(
    budget: &Budget,
    operation: Operation,
    id: Option<&RecordId>,
    call: C,
    emit: impl Fn(Event<'_>),
) -> Result<T, Error>
where
    C: FnOnce(Deadline) -> F,
    F: Future<Output = Result<T, Error>>,
{
    let started = Instant::now();
    let deadline = budget.deadline();
    // Without a time driver (guard style) only the store's own waits are bounded.
    // One timer for the whole call: the store's own `bound` inside starts none.
    let result = deadline
        .bound(operation, call(deadline.bounded_by_caller()))
        .await;
    let elapsed = started.elapsed();
    budget.charge(elapsed);
    let about = |kind| {
        let event = Event::new(kind).of(operation);
        id.map_or(event, |id| event.about(id))
    };
    let event = about(EventKind::StoreCall).took(elapsed);
    match &result {
        Ok(_) => emit(event),
        Err(error) => {
            emit(event.failed(error));
            if is_timed_out(error) && budget.is_spent() {
                emit(
                    about(EventKind::BudgetSpent)
                        .took(budget.total)
                        .failed(error),
                );
            }
        }
    }
    result
}
