//! A scenario no `#[tokio::test]` can host: it needs a runtime of its own whose every worker
//! is blocked. Call it from a plain `#[test]` with the store's harness.

use super::{request, unique_consumer, Elsewhere, Harness};
use crate::{Answer, Begin, Failure, Idempotency, Outcome, Policy, StoredResponse};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

const LEASE: Duration = Duration::from_millis(600);
/// How long the application's workers are blocked: well past the lease.
const BLOCKED: Duration = Duration::from_millis(2500);
/// How close together the blocking tasks must start for both workers to be blocked at once.
const TOGETHER: Duration = Duration::from_millis(300);
/// The application runtime's workers.
const WORKERS: usize = 2;

/// C9: while every worker of the application's runtime is blocked (synchronous work in its
/// tasks) for longer than the lease, the engine's heartbeat still renews the leases of the
/// executions under way (from its own thread, on connections that thread drives), so another
/// instance (its own engine over the same records, on a runtime of its own) asking after the
/// lease would have passed is answered in flight, never a takeover of a live execution. The
/// scenario is valid only when every worker was blocked at once (a loaded machine may schedule
/// otherwise); it is tried up to five times.
pub fn c09_renewals_do_not_depend_on_the_applications_workers<H: Harness>(harness: &H) {
    for _ in 0..5 {
        if attempt(harness).is_some() {
            return;
        }
    }
    panic!("the application's workers were never all blocked at once");
}

/// One try: `None` when the workers were not all blocked at the same time.
fn attempt<H: Harness>(harness: &H) -> Option<Begin> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
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
    let asked = request(&consumer, "blocked", b"{}");
    // The execution: its handler waits (asynchronously) until the test lets it finish.
    let (started, handler_started) = mpsc::channel::<()>();
    let (finish, finished) = tokio::sync::oneshot::channel::<()>();
    let run = {
        let (idem, request) = (idem.clone(), asked.clone());
        runtime.spawn(async move {
            idem.run(&request, move |_| async move {
                let _ = started.send(());
                let _ = finished.await;
                Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged"))
            })
            .await
        })
    };
    handler_started
        .recv_timeout(BLOCKED)
        .expect("the handler starts");
    // Now every worker of the application's runtime is blocked by synchronous work.
    let (blocking, blocks) = mpsc::channel::<Instant>();
    let blockers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let blocking = blocking.clone();
            runtime.spawn(async move {
                let _ = blocking.send(Instant::now());
                std::thread::sleep(BLOCKED);
            })
        })
        .collect();
    let mut starts = Vec::new();
    for _ in 0..WORKERS {
        starts.push(blocks.recv_timeout(BLOCKED).ok());
    }
    let starts: Option<Vec<Instant>> = starts.into_iter().collect();
    let seen = starts.and_then(|starts| {
        let first = *starts.iter().min()?;
        let last = *starts.iter().max()?;
        if last.duration_since(first) > TOGETHER {
            return None;
        }
        std::thread::sleep((last + LEASE * 2).saturating_duration_since(Instant::now()));
        let probe = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        Some(probe.block_on(other.begin(&asked)).expect("begin"))
    });
    let _ = finish.send(());
    let outcome = runtime.block_on(async {
        for blocker in blockers {
            let _ = blocker.await;
        }
        run.await.expect("joined")
    });
    // Not a valid attempt unless every worker was blocked at once; then the execution must
    // have completed under its lease.
    let seen = seen?;
    assert!(
        matches!(seen, Begin::Answered(Answer::InFlight { .. })),
        "another instance took over a live execution: {seen:?}"
    );
    assert!(matches!(outcome, Ok(Outcome::Executed(_))), "{outcome:?}");
    Some(seen)
}
