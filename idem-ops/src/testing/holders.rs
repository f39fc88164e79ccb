//! The scenario of what an operator reads beside a record when two processes share it (C11):
//! it takes two handles on one store's records, so each store runs it from its own tests with a
//! second handle that records another holder (a builder's `holder`), outside the [`Harness`]
//! suite.
//!
//! [`Harness`]: super::OperatorHarness

use super::listing::{engine, reserve};
use super::{policy, request, unique_consumer, LEASE, SHORT_RETENTION};
use crate::Holder;
use crate::{Inspected, Operator};
use idem_core::store::Deadline;
use idem_core::{Begin, RecordId, StoredResponse};
use std::time::Duration;

async fn inspected<S: Operator + ?Sized>(store: &S, id: &RecordId) -> Inspected {
    store
        .inspect(id, Deadline::default())
        .await
        .expect("inspect")
        .expect("the record is there")
}

/// C11 across processes: `second` is a handle on the same records as `first` that records
/// `second_holder` (another process, as a store builder's `holder` makes it; it must differ from
/// `first`'s). A takeover by `second`
/// records the taker's holder and a later reservation time; a start over after the retention
/// by `first` clears the completion time and records `first`'s holder again. Called by each
/// store's own tests, with two handles of its kind.
pub async fn c11_a_takeover_and_a_start_over_record_the_new_holder<S: Operator + 'static>(
    first: S,
    second: S,
    second_holder: &Holder,
) {
    let (first, second) = (std::sync::Arc::new(first), std::sync::Arc::new(second));
    let short = SHORT_RETENTION;
    let (mine, theirs) = (
        engine(&first, policy().retention(short)),
        engine(&second, policy().retention(short)),
    );
    let consumer = unique_consumer("c11h");
    let req = request(&consumer, "k", b"{}");
    reserve(&mine, &req).await;
    let before = inspected(&*first, req.id()).await;
    let first_holder = before
        .provenance
        .holder
        .known()
        .expect("a reservation records its holder")
        .clone();
    assert_ne!(&first_holder, second_holder, "two processes");
    let reserved = before.provenance.reserved_at.expect("a reservation time");

    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    let Begin::Acquired(lease) = theirs.begin(&req).await.expect("begin") else {
        panic!("an orphan is taken over");
    };
    let taken = inspected(&*first, req.id()).await;
    assert_ne!(taken.record.token, before.record.token, "a takeover");
    assert_eq!(taken.provenance.holder.known(), Some(second_holder));
    let retaken = taken.provenance.reserved_at.expect("a takeover time");
    assert!(
        retaken.saturating_since(reserved) >= LEASE,
        "a new reservation, after the lease: {before:?} then {taken:?}"
    );
    theirs
        .complete(lease, StoredResponse::new(201, "theirs"))
        .await
        .expect("complete");
    let done = inspected(&*first, req.id()).await;
    assert!(done.provenance.completed_at.is_some(), "{done:?}");
    assert_eq!(done.provenance.holder.known(), Some(second_holder));

    tokio::time::sleep(short + Duration::from_millis(100)).await;
    reserve(&mine, &req).await;
    let again = inspected(&*second, req.id()).await;
    assert!(again.record.is_in_progress(), "started over: {again:?}");
    assert_eq!(again.provenance.completed_at, None, "{again:?}");
    assert_eq!(again.provenance.holder.known(), Some(&first_holder));
    let started = again.provenance.reserved_at.expect("a start-over time");
    assert!(started > retaken, "{taken:?} then {again:?}");
}
