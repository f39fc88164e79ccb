//! A scenario no `#[tokio::test]` can host: it needs a runtime of its own whose every worker
//! the handlers block. Call it from a plain `#[test]` with the store's harness.

use super::{request, unique_consumer, Elsewhere, Harness};
use crate::{Answer, Begin, Failure, Idempotency, Outcome, Policy, StoredResponse};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

const LEASE: Duration = Duration::from_millis(600);
/// How long each handler blocks its worker: well past the lease.
const BLOCKED: Duration = Duration::from_millis(2500);
/// How close together the two handlers must start for both workers to be blocked at once.
const TOGETHER: Duration = Duration::from_millis(300);

/// C9: with every worker of the application's runtime blocked by handlers for longer than the
/// lease, the engine's heartbeat still renews the leases (from its own thread, on connections
/// that thread drives), so another instance (its own engine over the same store, on a runtime
/// of its own) asking after the lease would have passed is answered in flight, never a
/// takeover of a live execution. The scenario is valid only when both handlers run at once
/// (the scheduler may run them one after the other); it is tried up to three times.
pub fn c09_renewals_do_not_depend_on_the_applications_workers<H: Harness>(harness: &H) {
    for _ in 0..3 {
        if let Some(seen) = attempt(harness) {
            assert!(
                matches!(seen, Begin::Answered(Answer::InFlight { .. })),
                "another instance took over a live execution: {seen:?}"
            );
            return;
        }
    }
    panic!("the two handlers never ran at once: every worker could not be blocked");
}

/// One try: `None` when the handlers did not run at the same time.
fn attempt<H: Harness>(harness: &H) -> Option<Begin> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // The store's connections are opened on the application's runtime.
    let store = Arc::new(runtime.block_on(harness.store()));
    let policy = Policy::default().lease(LEASE);
    let idem = Idempotency::with_policy(Arc::clone(&store), policy.clone()).expect("policy");
    // Another process: the same records, not this process's live executions.
    let other = Idempotency::with_policy(Elsewhere::new(store), policy).expect("policy");
    let consumer = unique_consumer("c09-blocked");
    let requests: Vec<_> = (0..2)
        .map(|i| request(&consumer, &format!("blocked-{i}"), b"{}"))
        .collect();
    let (started, starts) = mpsc::channel::<(usize, Instant)>();
    let asked = requests.clone();
    let probe = std::thread::spawn(move || {
        let first = starts.recv_timeout(BLOCKED * 3).ok()?;
        let second = starts.recv_timeout(BLOCKED).ok()?;
        if second.1.duration_since(first.1) > TOGETHER {
            return None;
        }
        std::thread::sleep((second.1 + LEASE * 2).saturating_duration_since(Instant::now()));
        let probe = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        Some(
            probe
                .block_on(other.begin(&asked[second.0]))
                .expect("begin"),
        )
    });
    let outcomes = runtime.block_on(async {
        let runs: Vec<_> = requests
            .into_iter()
            .enumerate()
            .map(|(i, request)| {
                let (idem, started) = (idem.clone(), started.clone());
                tokio::spawn(async move {
                    idem.run(&request, move |_| async move {
                        let _ = started.send((i, Instant::now()));
                        // A handler that blocks its worker thread (a synchronous call).
                        std::thread::sleep(BLOCKED);
                        Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged"))
                    })
                    .await
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for run in runs {
            outcomes.push(run.await.expect("joined"));
        }
        outcomes
    });
    // Not a valid attempt unless both handlers ran at once; then both must have executed.
    let seen = probe.join().expect("probe")?;
    for outcome in outcomes {
        assert!(matches!(outcome, Ok(Outcome::Executed(_))), "{outcome:?}");
    }
    Some(seen)
}
