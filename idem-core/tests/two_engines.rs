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
