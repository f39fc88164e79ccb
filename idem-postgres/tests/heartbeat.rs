//! Renewals that the application cannot starve (C9): with every worker of the application's
//! runtime blocked by handlers for longer than the lease, the engine's heartbeat still renews
//! the leases on PostgreSQL (on connections opened by its own thread), so another instance
//! never takes over a live execution.

mod common;

use common::{pg_url, store_on};
use idem_core::{Answer, Begin, Failure, Idempotency, Outcome, Policy, Request, StoredResponse};
use idem_postgres::{Isolation, StatementMode};
use std::time::Duration;

#[test]
fn c09_renewals_do_not_depend_on_the_applications_workers() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let policy = Policy::default().lease(Duration::from_millis(600));
    // The store's connections are opened on the application's runtime, whose workers the
    // handlers below block.
    let store = runtime.block_on(store_on(
        &pg_url(),
        StatementMode::Prepared,
        Isolation::ReadCommitted,
    ));
    let idem = Idempotency::with_policy(store.clone(), policy.clone()).expect("policy");
    let other = Idempotency::with_policy(store, policy).expect("policy");
    let requests: Vec<Request> = (0..2)
        .map(|i| {
            idem.request("acct", "POST", "/charges")
                .key(Some(&format!("blocked-{i}")))
                .body(b"{}")
                .build()
                .expect("valid")
        })
        .collect();
    let asked = requests[0].clone();
    // Another instance, with a runtime of its own, asks once the lease would have passed
    // without renewals.
    let probe = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1600));
        let probe = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        probe.block_on(other.begin(&asked)).expect("begin")
    });
    runtime.block_on(async {
        let runs: Vec<_> = requests
            .into_iter()
            .map(|request| {
                let idem = idem.clone();
                tokio::spawn(async move {
                    idem.run(&request, |_| async {
                        // A handler that blocks its worker thread (a synchronous call).
                        std::thread::sleep(Duration::from_millis(2500));
                        Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged"))
                    })
                    .await
                })
            })
            .collect();
        for run in runs {
            let outcome = run.await.expect("joined").expect("ran");
            assert!(matches!(outcome, Outcome::Executed(_)), "{outcome:?}");
        }
    });
    let seen = probe.join().expect("probe");
    assert!(
        matches!(seen, Begin::Answered(Answer::InFlight { .. })),
        "another instance took over a live execution: {seen:?}"
    );
}
