//! Two engines over one store in one process (one per router, say) share their registry of
//! live executions (C9, `Store::identity`): a duplicate reaching the other engine while the
//! first execution's completion is still being written past the lease is answered in flight,
//! never a takeover and a second effect.

mod support;

use idem_core::{Failure, Idempotency, Outcome, Policy, RunError, StoredResponse};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::Faulty;

#[tokio::test]
async fn c09_a_live_execution_is_never_taken_over_by_another_engine_of_the_process() {
    let store = Arc::new(Faulty {
        one_process: true,
        ..Faulty::default()
    });
    let policy = Policy::default().lease(Duration::from_millis(200));
    let api = Idempotency::with_policy(Arc::clone(&store), policy.clone()).expect("policy");
    let admin = Idempotency::with_policy(Arc::clone(&store), policy).expect("policy");
    let request = api
        .request("acct", "POST", "/charges")
        .key(Some("two-engines"))
        .body(b"{}")
        .build()
        .expect("valid");
    let effects = Arc::new(AtomicUsize::new(0));
    let run = |idem: &Idempotency<Arc<Faulty>>, effects: Arc<AtomicUsize>| {
        let (idem, request, store) = (idem.clone(), request.clone(), Arc::clone(&store));
        async move {
            idem.run(&request, move |_| async move {
                effects.fetch_add(1, Ordering::SeqCst);
                store.unwritable.store(true, Ordering::SeqCst);
                Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged"))
            })
            .await
        }
    };
    let first = run(&api, Arc::clone(&effects)).await;
    assert!(matches!(first, Err(RunError::Incomplete(_))), "{first:?}");
    // The lease passed in the store; the first execution is alive, still completing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let on_api: Result<Outcome, _> = run(&api, Arc::clone(&effects)).await;
    let on_admin: Result<Outcome, _> = run(&admin, Arc::clone(&effects)).await;
    eprintln!("retry on the same engine = {on_api:?}\nretry on the other engine = {on_admin:?}");
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "the process's other engine took its live execution over and ran the effect again"
    );
}

/// C5, C9: a guard completion that fails after its lease was taken over by an execution of
/// this same process, and goes on by itself until it finds the record another's, leaves that
/// execution registered as live: a duplicate arriving while the live execution's store lease
/// has lapsed (its renewals failing) is answered in flight from memory, never a takeover that
/// runs the effect a second time beside it.
#[tokio::test]
async fn c09_a_failed_guard_completion_leaves_the_live_takeover_registered() {
    use idem_core::{Answer, Begin};
    use tokio::sync::Notify;
    let store = Arc::new(Faulty {
        one_process: true,
        ..Faulty::default()
    });
    let lease = Duration::from_millis(300);
    let idem = Idempotency::with_policy(Arc::clone(&store), Policy::default().lease(lease))
        .expect("policy");
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some("guard-then-takeover"))
        .body(b"{}")
        .build()
        .expect("valid");
    let Begin::Acquired(stale) = idem.begin(&request).await.expect("begin") else {
        panic!("a fresh key is acquired");
    };
    // The guard's effect outlasts its lease; an execution of this process takes the key over.
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    let effects = Arc::new(AtomicUsize::new(0));
    let (started, finish) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let live = {
        let (idem, request) = (idem.clone(), request.clone());
        let (effects, started, finish) = (
            Arc::clone(&effects),
            Arc::clone(&started),
            Arc::clone(&finish),
        );
        tokio::spawn(async move {
            idem.run(&request, move |_| async move {
                effects.fetch_add(1, Ordering::SeqCst);
                started.notify_one();
                finish.notified().await;
                Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "taken over"))
            })
            .await
        })
    };
    tokio::time::timeout(Duration::from_secs(5), started.notified())
        .await
        .expect("the takeover runs");

    // The stale guard completes now, refused for good: it goes on until it finds the record
    // another's.
    store.refusing.store(true, Ordering::SeqCst);
    let completed = idem
        .complete(stale, StoredResponse::new(201, "stale"))
        .await;
    assert!(completed.is_err(), "{completed:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    store.refusing.store(false, Ordering::SeqCst);

    // The live execution's renewals fail for a while: its store lease lapses as it runs.
    store.failing_renews.store(1_000, Ordering::SeqCst);
    tokio::time::sleep(lease * 2).await;
    let duplicate = {
        let effects = Arc::clone(&effects);
        idem.run(&request, move |_| async move {
            effects.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "again"))
        })
        .await
    };
    store.failing_renews.store(0, Ordering::SeqCst);
    finish.notify_one();
    let _ = tokio::time::timeout(Duration::from_secs(5), live).await;
    assert!(
        matches!(duplicate, Ok(Outcome::Answered(Answer::InFlight { .. }))),
        "a duplicate beside a live execution of this process: {duplicate:?}"
    );
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "the effect ran twice at once"
    );
}
