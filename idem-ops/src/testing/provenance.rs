//! The conformance scenarios of what an operator reads beside a record (store rule 6): when its
//! reservation was made and its completion landed, by the store's one clock (C11), which
//! process holds it, and every record of one key across consumers and routes (C2).

use super::listing::{completed, engine, every_page, fresh, reserve};
use super::{policy, request, request_on, unique_consumer, OperatorHarness, LEASE};
use crate::Holder;
use crate::{Inspected, ListQuery, ListedState, ListingOrder, Operator, Selection};
use idem_core::store::Deadline;
use idem_core::{Begin, RecordId, StoredResponse, Timestamp};
use std::time::Duration;

/// The most a store's two readings of one instant may differ by: a server store keeps the
/// deadline and the reservation time to the millisecond, each rounded on its own.
const ROUNDING: Duration = Duration::from_millis(1);

async fn inspected<S: Operator + ?Sized>(store: &S, id: &RecordId) -> Inspected {
    store
        .inspect(id, Deadline::default())
        .await
        .expect("inspect")
        .expect("the record is there")
}

fn lease_until(inspected: &Inspected) -> Timestamp {
    match inspected.record.state {
        idem_core::store::RecordState::InProgress { lease_until } => lease_until,
        ref other => panic!("expected in progress, got {other:?}"),
    }
}

/// C11: a reservation records when it was made, by the store's clock (the same clock as its
/// lease: the deadline is the reservation time plus the lease), and which process made it
/// (this one); a takeover is a new reservation, with a later time and the taker as holder; the
/// pending listing shows the same.
pub async fn c11_reservation_time_and_holder_are_recorded_on_reserve_and_takeover<
    H: OperatorHarness,
>(
    harness: &H,
) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c11r");
    let req = request(&consumer, "k", b"{}");
    reserve(&idem, &req).await;
    let first = inspected(&*store, req.id()).await;
    let reserved = first
        .provenance
        .reserved_at
        .expect("a reservation records its time");
    let until = lease_until(&first);
    let span = until.saturating_since(reserved);
    assert!(
        span + ROUNDING >= LEASE && span <= LEASE + ROUNDING,
        "the lease runs from the reservation time, by one clock: {first:?}"
    );
    assert_eq!(
        first.provenance.holder.known(),
        Some(Holder::this_process())
    );
    assert_eq!(first.provenance.completed_at, None);
    let listed = every_page(&*store, ListQuery::in_progress(Duration::ZERO), 10).await;
    let [row] = listed.as_slice() else {
        panic!("one record pending: {listed:?}");
    };
    assert_eq!(row.reserved_at, Some(reserved));
    assert_eq!(row.holder.known(), Some(Holder::this_process()));
    assert_eq!(row.completed_at, None);

    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    reserve(&idem, &req).await;
    let taken = inspected(&*store, req.id()).await;
    assert_ne!(taken.record.token, first.record.token, "a takeover");
    let retaken = taken
        .provenance
        .reserved_at
        .expect("a takeover records its time");
    assert!(
        retaken.saturating_since(reserved) >= LEASE,
        "a takeover is a new reservation, after the lease passed: {first:?} then {taken:?}"
    );
    assert_eq!(
        taken.provenance.holder.known(),
        Some(Holder::this_process())
    );
    assert_eq!(taken.provenance.completed_at, None);
}

/// C11: a completion records when it landed, by the store's clock (the retention runs from
/// it), and keeps the reservation's time and holder; a start over after the retention clears
/// it. The completed listing shows the same times.
pub async fn c11_completion_time_is_recorded_on_complete<H: OperatorHarness>(harness: &H) {
    let store = fresh(harness).await;
    let retention = Duration::from_secs(3600);
    let idem = engine(&store, policy().retention(retention));
    let consumer = unique_consumer("c11c");
    let req = request(&consumer, "k", b"{}");
    let Begin::Acquired(lease) = idem.begin(&req).await.expect("begin") else {
        panic!("a fresh key is acquired");
    };
    let pause = Duration::from_millis(50);
    tokio::time::sleep(pause).await;
    idem.complete(lease, StoredResponse::new(201, "done"))
        .await
        .expect("complete");
    let done = inspected(&*store, req.id()).await;
    let reserved = done.provenance.reserved_at.expect("kept after completion");
    let landed = done
        .provenance
        .completed_at
        .expect("a completion records its time");
    assert!(
        landed.saturating_since(reserved) + ROUNDING >= pause,
        "completed after the pause, by the same clock: {done:?}"
    );
    let idem_core::store::RecordState::Completed { expires_at, .. } = done.record.state else {
        panic!("completed: {done:?}");
    };
    let kept = expires_at.saturating_since(landed);
    assert!(
        kept + ROUNDING >= retention && kept <= retention + ROUNDING,
        "the retention runs from the completion: {done:?}"
    );
    assert_eq!(done.provenance.holder.known(), Some(Holder::this_process()));
    let listed = every_page(&*store, ListQuery::completed(&consumer).expect("valid"), 10).await;
    let [row] = listed.as_slice() else {
        panic!("one completed record: {listed:?}");
    };
    assert_eq!(
        (row.reserved_at, row.completed_at),
        (Some(reserved), Some(landed))
    );
}

/// C2: the records of one key under every consumer and route are found by the key alone, in
/// every state, each once, by consumer then route, a bounded page at a time; records of other
/// keys are not; a key refused by C1 is refused here too.
pub async fn c02_lookup_by_key_finds_every_consumer_and_route_bounded<H: OperatorHarness>(
    harness: &H,
) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy().lease(Duration::from_secs(3600)));
    let key = "shared-key";
    let consumers = [
        unique_consumer("c02k-a"),
        unique_consumer("c02k-b"),
        unique_consumer("c02k-c"),
    ];
    let routes = ["POST /v1/refunds", "POST /v1/charges"];
    let mut expected = Vec::new();
    for (i, consumer) in consumers.iter().enumerate() {
        for route in routes {
            let req = request_on(consumer, route, key, b"{}");
            if i == 1 {
                reserve(&idem, &req).await;
            } else {
                completed(&idem, &req, 201).await;
            }
            expected.push((consumer.clone(), route.to_owned()));
        }
        reserve(&idem, &request(consumer, "another-key", b"{}")).await;
    }
    expected.sort();

    let limit = 4;
    let found = every_page(&*store, ListQuery::key(key).expect("valid key"), limit).await;
    let seen: Vec<(String, String)> = found
        .iter()
        .map(|r| {
            assert_eq!(r.id.key(), key, "{r:?}");
            (r.id.consumer().to_owned(), r.id.route().to_owned())
        })
        .collect();
    assert_eq!(
        seen, expected,
        "every record of the key, by consumer then route"
    );
    for r in &found {
        let in_progress = r.id.consumer() == consumers[1];
        assert_eq!(
            matches!(r.state, ListedState::InProgress { .. }),
            in_progress,
            "{r:?}"
        );
        assert!(r.reserved_at.is_some(), "{r:?}");
        assert_eq!(r.holder.known(), Some(Holder::this_process()), "{r:?}");
        assert_eq!(r.completed_at.is_some(), !in_progress, "{r:?}");
    }
    if store.listing_order() == ListingOrder::Selection {
        let first = store
            .list(
                &ListQuery::key(key).expect("valid key").limit(limit),
                Deadline::default(),
            )
            .await
            .expect("list");
        assert_eq!(first.records.len(), limit, "a full first page");
        assert!(
            first.next.is_some(),
            "more records than the page: a next page"
        );
    }
    let none = every_page(&*store, ListQuery::key("never-used").expect("valid"), 10).await;
    assert!(none.is_empty(), "{none:?}");
    assert!(ListQuery::key("a key").is_err());
    assert!(matches!(
        ListQuery::key(key).expect("valid").selection(),
        Selection::Key { .. }
    ));
}
