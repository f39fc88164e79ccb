//! The conformance scenarios of what operators see (`list`, `stats`; store rule 6): the
//! orphans a crash left (C9) and the records a retention keeps (C10).

use super::{
    policy, request, request_on, unique_consumer, OperatorHarness, LEASE, SHORT_RETENTION,
};
use crate::{Cursor, ListQuery, Listed, ListedState, ListingOrder, Operator, Selection};
use idem_core::store::Deadline;
use idem_core::store::Store;
use idem_core::{Begin, Error, Field, Idempotency, Policy, Request, StoredResponse};
use std::sync::Arc;
use std::time::Duration;

pub(super) async fn fresh<H: OperatorHarness>(harness: &H) -> Arc<H::Store> {
    Arc::new(harness.store().await)
}

pub(super) fn engine<S: Store + 'static>(store: &Arc<S>, policy: Policy) -> Idempotency<Arc<S>> {
    Idempotency::with_policy(Arc::clone(store), policy).expect("the suite's policies are valid")
}

pub(super) async fn reserve<S: Store + 'static>(idem: &Idempotency<Arc<S>>, request: &Request) {
    match idem.begin(request).await.expect("begin") {
        // The lease is left to run out or to hold: these records are listed, not completed.
        Begin::Acquired(_lease) => {}
        other => panic!("expected to acquire, got {other:?}"),
    }
}

pub(super) async fn completed<S: Store + 'static>(
    idem: &Idempotency<Arc<S>>,
    request: &Request,
    status: u16,
) {
    match idem.begin(request).await.expect("begin") {
        Begin::Acquired(lease) => {
            idem.complete(lease, StoredResponse::new(status, "a body never listed"))
                .await
                .expect("complete");
        }
        other => panic!("expected to acquire, got {other:?}"),
    }
}

/// Every page of `query`, `limit` records at a time, in the selection's order: checks that no
/// page is over the limit and that the listing ends. A scan store's pages are put in the
/// selection's order here, and a record its scan returned twice is kept once.
pub(super) async fn every_page<S: Operator + ?Sized>(
    store: &S,
    query: ListQuery,
    limit: usize,
) -> Vec<Listed> {
    let mut all: Vec<Listed> = Vec::new();
    let mut query = query.limit(limit);
    for _ in 0..10_000 {
        let page = store.list(&query, Deadline::default()).await.expect("list");
        assert!(
            page.records.len() <= limit,
            "{} records on a page of {limit}",
            page.records.len()
        );
        all.extend(page.records);
        let Some(next) = page.next else {
            if store.listing_order() == ListingOrder::Scan {
                in_selection_order(query.selection(), &mut all);
            }
            let mut ids: Vec<_> = all.iter().map(|r| &r.id).collect();
            ids.sort_unstable_by_key(|id| (id.consumer(), id.route(), id.key()));
            let before = ids.len();
            ids.dedup();
            assert_eq!(before, ids.len(), "a record listed twice: {all:?}");
            return all;
        };
        query = query.after(next);
    }
    panic!("the listing does not end");
}

fn in_selection_order(selection: &Selection, records: &mut Vec<Listed>) {
    records.sort_by(|a, b| {
        let order = |r: &Listed| {
            let at = match selection {
                Selection::InProgress { .. } | Selection::InDoubt { .. } => r.reserved_at,
                _ => None,
            };
            (
                at,
                r.id.consumer().to_owned(),
                r.id.route().to_owned(),
                r.id.key().to_owned(),
            )
        };
        order(a).cmp(&order(b))
    });
    records.dedup_by(|a, b| a.id == b.id);
}

fn keys(listed: &[Listed]) -> Vec<&str> {
    listed.iter().map(|r| r.id.key()).collect()
}

/// C9: in-progress records are listed by age, oldest first, whether their lease holds or has
/// passed, never a completed one; a takeover is a new reservation with a new age; a page never
/// exceeds its limit and the pages cover the listing once; a cursor the store did not make is
/// refused.
pub async fn c09_in_progress_records_are_listed_by_age<H: OperatorHarness>(harness: &H) {
    let store = fresh(harness).await;
    let short = engine(&store, policy());
    let long = engine(&store, policy().lease(Duration::from_secs(3600)));
    let consumer = unique_consumer("c09l");
    let orphan = request(&consumer, "orphan", b"{}");
    reserve(&short, &orphan).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let running = request(&consumer, "running", b"{}");
    reserve(&long, &running).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    completed(&long, &request(&consumer, "done", b"{}"), 201).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let young = request(&consumer, "young", b"{}");
    reserve(&long, &young).await;

    let all = every_page(&*store, ListQuery::in_progress(Duration::ZERO), 1).await;
    assert_eq!(keys(&all), ["orphan", "running", "young"]);
    assert!(all
        .windows(2)
        .all(|w| w[0].reserved_at.is_some() && w[0].reserved_at <= w[1].reserved_at));
    assert!(all
        .iter()
        .all(|r| r.id.consumer() == consumer && matches!(r.state, ListedState::InProgress { .. })));
    let none = every_page(
        &*store,
        ListQuery::in_progress(Duration::from_secs(3600)),
        10,
    )
    .await;
    assert!(none.is_empty(), "{none:?}");

    // The orphan's lease passes: still listed (awaiting a takeover), its deadline behind it.
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    let fresh_one = request(&consumer, "fresh", b"{}");
    reserve(&long, &fresh_one).await;
    let aged = every_page(&*store, ListQuery::in_progress(LEASE / 2), 10).await;
    assert_eq!(
        keys(&aged),
        ["orphan", "running", "young"],
        "the fresh one is too young"
    );
    let stats = store.stats(Deadline::default()).await.expect("stats");
    match aged[0].state {
        ListedState::InProgress { lease_until } => assert!(lease_until <= stats.now),
        other => panic!("{other:?}"),
    }

    // A takeover is a new reservation: the record is now the youngest.
    reserve(&short, &orphan).await;
    let all = every_page(&*store, ListQuery::in_progress(Duration::ZERO), 2).await;
    assert_eq!(keys(&all), ["running", "young", "fresh", "orphan"]);

    let foreign = ListQuery::in_progress(Duration::ZERO).after(Cursor::new("not a cursor"));
    assert!(
        matches!(
            store.list(&foreign, Deadline::default()).await,
            Err(Error::InvalidInput {
                field: Field::Cursor,
                ..
            })
        ),
        "a cursor the store did not make is refused"
    );
}

/// C10: a consumer's live completed records are listed with their status, never their body,
/// on every route or one, and never another consumer's, an in-progress one or an expired one.
pub async fn c10_completed_records_are_listed_per_consumer<H: OperatorHarness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let short = engine(&store, policy().retention(SHORT_RETENTION));
    let consumer = unique_consumer("c10l");
    let neighbour = format!("{consumer}x");
    let mut expected = Vec::new();
    for (route, key, status) in [
        ("POST /b", "k2", 402),
        ("POST /a", "k1", 201),
        ("POST /b", "k1", 201),
        ("POST /a", "k3", 500),
        ("POST /a", "k2", 201),
    ] {
        completed(&idem, &request_on(&consumer, route, key, b"{}"), status).await;
        expected.push((route.to_owned(), key.to_owned(), status));
    }
    expected.sort();
    reserve(&idem, &request_on(&consumer, "POST /a", "k0", b"{}")).await;
    completed(&idem, &request_on(&neighbour, "POST /a", "k1", b"{}"), 201).await;
    completed(&short, &request_on(&consumer, "POST /a", "k9", b"{}"), 201).await;
    tokio::time::sleep(SHORT_RETENTION + Duration::from_millis(100)).await;

    let query = ListQuery::completed(&consumer).expect("valid consumer");
    let all = every_page(&*store, query.clone(), 2).await;
    let seen: Vec<(String, String, u16)> = all
        .iter()
        .map(|r| match r.state {
            ListedState::Completed { status, .. } => {
                assert_eq!(r.id.consumer(), consumer);
                assert!(r.reserved_at.is_some());
                (r.id.route().to_owned(), r.id.key().to_owned(), status)
            }
            other => panic!("an in-progress record listed as completed: {other:?}"),
        })
        .collect();
    assert_eq!(
        seen, expected,
        "by route then key, each once, live ones only"
    );

    let on_b = every_page(&*store, query.route("POST /b").expect("valid route"), 10).await;
    assert_eq!(keys(&on_b), ["k1", "k2"]);
    assert!(on_b.iter().all(|r| r.id.route() == "POST /b"));
}

/// C9, C10: `stats` counts the namespace's records by state at the store's clock: live and
/// orphaned in-progress records, live and expired completed ones (a TTL store may have deleted
/// the expired ones already), and the oldest reservation in progress.
pub async fn c10_stats_count_records_by_state<H: OperatorHarness>(harness: &H) {
    let store = fresh(harness).await;
    let long = engine(&store, policy().lease(Duration::from_secs(3600)));
    let short = engine(&store, policy().retention(SHORT_RETENTION));
    let consumer = unique_consumer("c10s");
    let empty = store.stats(Deadline::default()).await.expect("stats");
    assert_eq!(empty.total(), 0, "a fresh namespace: {empty:?}");
    assert_eq!(empty.oldest_in_progress, None);

    reserve(&short, &request(&consumer, "orphan", b"{}")).await;
    for key in ["running-1", "running-2"] {
        reserve(&long, &request(&consumer, key, b"{}")).await;
    }
    for key in ["done-1", "done-2", "done-3"] {
        completed(&long, &request(&consumer, key, b"{}"), 201).await;
    }
    for key in ["expiring-1", "expiring-2"] {
        completed(&short, &request(&consumer, key, b"{}"), 201).await;
    }
    tokio::time::sleep(SHORT_RETENTION.max(LEASE) + Duration::from_millis(100)).await;

    let stats = store.stats(Deadline::default()).await.expect("stats");
    assert_eq!((stats.in_progress, stats.completed), (2, 3), "{stats:?}");
    if store.capabilities().server_ttl {
        assert!(stats.orphaned <= 1 && stats.expired <= 2, "{stats:?}");
    } else {
        assert_eq!((stats.orphaned, stats.expired), (1, 2), "{stats:?}");
    }
    let oldest = stats
        .oldest_in_progress
        .expect("records in progress have an age");
    assert!(oldest <= stats.now, "{stats:?}");
    assert!(
        stats.now.saturating_since(oldest) >= SHORT_RETENTION.max(LEASE),
        "{stats:?}"
    );
}
