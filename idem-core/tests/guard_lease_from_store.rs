//! The guard's `complete` with a lease the engine did not take (a store's own reservation,
//! `StoreExt::reservation`, for tools and tests): its store steps are bounded by one budget
//! (C13) like any request's, and the write goes on by itself past the answer (C8).

mod support;

use idem_core::store::{Deadline, StoreExt};
use idem_core::{Begin, Idempotency, Policy, StoredResponse};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{request, Faulty};

/// C13: `complete` with a lease that carries no request budget and no local deadline, on a
/// store that cannot be written, answers within one store budget (plus a margin for a loaded
/// machine), never waits for the store to come back; the completion still lands once it does.
#[tokio::test]
async fn c13_a_guard_completion_of_a_store_lease_answers_within_one_budget() {
    let budget = Duration::from_millis(300);
    let store = Arc::new(Faulty::default());
    let policy = Policy::default()
        .lease(Duration::from_secs(20))
        .store_timeout(budget);
    let idem = Idempotency::with_policy(Arc::clone(&store), policy).expect("policy");
    let req = request(&idem, "store-lease");
    let reserved = store
        .reservation(&req, Duration::from_secs(20), Deadline::default())
        .await
        .expect("reserved");
    let Begin::Acquired(lease) = reserved else {
        panic!("a fresh key is acquired");
    };
    store.unwritable.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let completed = tokio::time::timeout(
        Duration::from_secs(5),
        idem.complete(lease, StoredResponse::new(201, "charged")),
    )
    .await;
    let took = started.elapsed();
    let Ok(completed) = completed else {
        panic!("complete still waiting after {took:?}");
    };
    assert!(completed.is_err(), "{completed:?}");
    assert!(
        took < budget + Duration::from_millis(700),
        "answered after {took:?}"
    );

    store.unwritable.store(false, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(10), idem.drain())
        .await
        .expect("the continuation lands once the store is writable");
    let again = idem.begin(&req).await.expect("begin");
    assert!(
        matches!(&again, Begin::Answered(idem_core::Answer::Replay(stored)) if stored.status == 201),
        "{again:?}"
    );
}
