//! The opt-in bounded wait of an in-flight duplicate for its original (C5,
//! [`Policy::wait_in_flight`]): the duplicate gets the original's answer when it ends (in this
//! process and in another), a wait ends in flight at its bound, a duplicate of an original that
//! gave its key back runs, and waiters beyond the cap are answered at once.

use super::{policy, request, unique_consumer, Elsewhere, Harness};
use crate::{Answer, Begin, Failure, Idempotency, Outcome, Policy, Request, Store, StoredResponse};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// A policy whose duplicates wait up to `max` (its lease renewed by the heartbeat meanwhile).
fn waiting(max: Duration) -> Policy {
    policy().wait_in_flight(max)
}

fn engine<S: Store + 'static>(store: S, policy: Policy) -> Idempotency<S> {
    Idempotency::with_policy(store, policy).expect("the suite's policies are valid")
}

fn charge(body: &str) -> StoredResponse {
    StoredResponse::new(201, body.to_owned())
}

/// Starts `idem.run(request)` whose handler counts itself in `runs`, tells `started` and
/// finishes with `response` (or gives the key back, with `None`) once `finish` fires.
fn original<S: Store + 'static>(
    idem: &Idempotency<S>,
    request: &Request,
    runs: &Arc<AtomicUsize>,
    response: Option<StoredResponse>,
) -> (
    oneshot::Receiver<()>,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Instant>,
) {
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let (idem, request, runs) = (idem.clone(), request.clone(), Arc::clone(runs));
    let task = tokio::spawn(async move {
        let outcome = idem
            .run(&request, move |_ctx| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let _ = started_tx.send(());
                let _ = finish_rx.await;
                match response {
                    Some(response) => Ok(response),
                    None => Err(Failure::nothing_happened(std::io::Error::other("declined"))),
                }
            })
            .await;
        let ended = Instant::now();
        match outcome {
            Ok(Outcome::Executed(_)) | Err(crate::RunError::Released(_)) => ended,
            other => panic!("the original ended as {other:?}"),
        }
    });
    (started_rx, finish_tx, task)
}

/// Runs a duplicate of `request` whose handler counts itself in `runs`.
async fn duplicate<S: Store + 'static>(
    idem: &Idempotency<S>,
    request: &Request,
    runs: &Arc<AtomicUsize>,
) -> Outcome {
    let runs = Arc::clone(runs);
    idem.run(request, move |_ctx| async move {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Failure<std::io::Error>>(charge("the duplicate ran"))
    })
    .await
    .expect("the duplicate is answered")
}

/// C5: a duplicate under a policy that waits gets the original's replay as soon as the
/// original completes, in the same process and in another (woken by the store's change feed
/// where it has one, else by reading again), its handler never run.
pub async fn c05_a_waiting_duplicate_gets_the_replay_when_the_original_completes<H: Harness>(
    harness: &H,
) {
    let store = Arc::new(harness.store().await);
    let here = engine(Arc::clone(&store), waiting(Duration::from_secs(5)));
    let there = engine(
        Elsewhere::new(Arc::clone(&store)),
        waiting(Duration::from_secs(5)),
    );
    for (case, other) in [("same process", false), ("another process", true)] {
        let req = request(&unique_consumer("c05-wait"), "k", b"{}");
        let runs = Arc::new(AtomicUsize::new(0));
        let (started, finish, original) = original(&here, &req, &runs, Some(charge("ch_1")));
        started.await.expect("the original started");
        let waiter = {
            let (here, there, req, runs) = (here.clone(), there.clone(), req.clone(), runs.clone());
            tokio::spawn(async move {
                let outcome = if other {
                    duplicate(&there, &req, &runs).await
                } else {
                    duplicate(&here, &req, &runs).await
                };
                (outcome, Instant::now())
            })
        };
        // The duplicate is waiting, not answered.
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(!waiter.is_finished(), "{case}: the duplicate did not wait");
        finish.send(()).expect("the original waits to finish");
        let ended = original.await.expect("the original ran");
        let (outcome, answered) = waiter.await.expect("the duplicate ran");
        assert_eq!(
            outcome,
            Outcome::Answered(Answer::Replay(charge("ch_1"))),
            "{case}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{case}: one execution");
        let after = answered.saturating_duration_since(ended);
        // In this process at once; in another within the polling fallback.
        let bound = if other {
            Duration::from_millis(1500)
        } else {
            Duration::from_millis(200)
        };
        assert!(
            after < bound,
            "{case}: answered {after:?} after the original"
        );
    }
}

/// C5: a wait is bounded: a duplicate whose original outlasts the wait is answered in flight
/// when the wait ends (with `Retry-After`), and the guard style waits the same way.
pub async fn c05_a_wait_ends_in_flight_at_its_bound<H: Harness>(harness: &H) {
    let store = Arc::new(harness.store().await);
    let max = Duration::from_millis(250);
    let idem = engine(
        Arc::clone(&store),
        waiting(max).lease(Duration::from_secs(10)),
    );
    let req = request(&unique_consumer("c05-bound"), "k", b"{}");
    let Begin::Acquired(lease) = idem.begin(&req).await.expect("begin") else {
        panic!("a fresh key is acquired");
    };
    let started = Instant::now();
    let answer = idem.begin(&req).await.expect("the duplicate is answered");
    let waited = started.elapsed();
    assert!(
        matches!(answer, Begin::Answered(Answer::InFlight { .. })),
        "{answer:?}"
    );
    assert!(
        waited >= max,
        "answered after {waited:?}, before the wait's end"
    );
    assert!(
        waited < max + Duration::from_millis(750),
        "answered after {waited:?}"
    );
    idem.complete(lease, charge("ok")).await.expect("complete");
    assert_eq!(
        idem.begin(&req).await.expect("begin"),
        Begin::Answered(Answer::Replay(charge("ok")))
    );
}

/// C5, C8: a duplicate waiting for an original that gives its key back (nothing happened) runs
/// its own handler, once.
pub async fn c05_a_duplicate_of_a_released_original_runs_after_waiting<H: Harness>(harness: &H) {
    let store = Arc::new(harness.store().await);
    let idem = engine(Arc::clone(&store), waiting(Duration::from_secs(5)));
    let req = request(&unique_consumer("c05-released"), "k", b"{}");
    let runs = Arc::new(AtomicUsize::new(0));
    let (started, finish, original) = original(&idem, &req, &runs, None);
    started.await.expect("the original started");
    let waiter = {
        let (idem, req, runs) = (idem.clone(), req.clone(), runs.clone());
        tokio::spawn(async move { duplicate(&idem, &req, &runs).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    finish.send(()).expect("the original waits to finish");
    original.await.expect("the original ran");
    let outcome = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("the duplicate is answered")
        .expect("the duplicate ran");
    assert_eq!(outcome, Outcome::Executed(charge("the duplicate ran")));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the original, then the duplicate"
    );
}

/// C5: waiters are capped per process: beyond [`Policy::max_waiters`] a duplicate is answered
/// in flight at once; with a cap of 0 nobody waits.
pub async fn c05_waiters_beyond_the_cap_are_answered_at_once<H: Harness>(harness: &H) {
    let store = Arc::new(harness.store().await);
    let cap = 3;
    let idem = engine(
        Arc::clone(&store),
        waiting(Duration::from_secs(2))
            .lease(Duration::from_secs(10))
            .max_waiters(cap),
    );
    let req = request(&unique_consumer("c05-cap"), "k", b"{}");
    let Begin::Acquired(lease) = idem.begin(&req).await.expect("begin") else {
        panic!("a fresh key is acquired");
    };
    let duplicates = 20;
    let mut tasks = Vec::new();
    for _ in 0..duplicates {
        let (idem, req) = (idem.clone(), req.clone());
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            let answer = idem.begin(&req).await.expect("answered");
            (answer, started.elapsed())
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    idem.complete(lease, charge("ok")).await.expect("complete");
    let (mut at_once, mut waited) = (0, 0);
    for task in tasks {
        let (answer, took) = task.await.expect("a duplicate");
        match answer {
            Begin::Answered(Answer::InFlight { .. }) => {
                assert!(
                    took < Duration::from_millis(250),
                    "in flight after {took:?}"
                );
                at_once += 1;
            }
            Begin::Answered(Answer::Replay(_)) => waited += 1,
            other => panic!("{other:?}"),
        }
    }
    // Other tests of this process may hold permits too: at most `cap` of these waited.
    assert!(waited <= cap, "{waited} waited beyond the cap of {cap}");
    assert_eq!(at_once + waited, duplicates);

    let none = engine(
        Arc::clone(&store),
        waiting(Duration::from_secs(2))
            .lease(Duration::from_secs(10))
            .max_waiters(0),
    );
    let req = request(&unique_consumer("c05-cap0"), "k", b"{}");
    let Begin::Acquired(lease) = none.begin(&req).await.expect("begin") else {
        panic!("a fresh key is acquired");
    };
    let started = Instant::now();
    let answer = none.begin(&req).await.expect("answered");
    assert!(matches!(answer, Begin::Answered(Answer::InFlight { .. })));
    assert!(started.elapsed() < Duration::from_millis(250));
    none.complete(lease, charge("ok")).await.expect("complete");
}
