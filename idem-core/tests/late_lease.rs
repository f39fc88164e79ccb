//! A lease that is mostly gone before the handler starts (C9, C8): when its renewal fails and
//! too little is left for the heartbeat to renew in time, nothing runs (the key is given back,
//! 503), so another instance never runs the effect a second time beside it.

mod support;

use idem_core::{Failure, Idempotency, Outcome, Policy, Request, RunError, StoredResponse};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::Faulty;

#[tokio::test]
async fn c09_a_failed_renewal_before_the_handler_never_lets_the_lease_pass_while_it_runs() {
    const LEASE: Duration = Duration::from_millis(600);
    // The reservation's answer arrives with a fifth of the lease left (a slow network, a
    // starved task): `still_held` renews, the renewal fails once (a reset connection).
    let store = Arc::new(Faulty {
        slow_reserves: AtomicUsize::new(1),
        reserve_answer_after: Duration::from_millis(480),
        failing_renews: AtomicUsize::new(1),
        ..Faulty::default()
    });
    let policy = Policy::default().lease(LEASE);
    let late = Idempotency::with_policy(Arc::clone(&store), policy.clone()).expect("policy");
    // Another instance of the application, on the same store.
    let other = Idempotency::with_policy(Arc::clone(&store), policy).expect("policy");
    let request = late
        .request("acct", "POST", "/charges")
        .key(Some("renewal-failed"))
        .body(b"{}")
        .build()
        .expect("valid");
    let effects = Arc::new(AtomicUsize::new(0));
    let counted = |idem: Idempotency<Arc<Faulty>>, effects: Arc<AtomicUsize>, request: Request| async move {
        idem.run(&request, move |_| async move {
            effects.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(600)).await;
            Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged"))
        })
        .await
    };
    let first = tokio::spawn(counted(late.clone(), Arc::clone(&effects), request.clone()));
    // The other instance's retry, just after the lease would have passed had nobody renewed.
    tokio::time::sleep(Duration::from_millis(650)).await;
    let retry: Result<Outcome, RunError<&'static str>> =
        counted(other, Arc::clone(&effects), request.clone()).await;
    let first = first.await.expect("joined");
    eprintln!("first = {first:?}\nretry = {retry:?}");
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "the handler ran with less lease left than the heartbeat's first beat; the lease \
         passed while it ran and another instance ran the effect again"
    );
}
