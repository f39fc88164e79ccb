//! One store budget per request (C13): every store step of a request draws from it, the
//! handler's time does not; spent before the effect, the answer is store-down, after it
//! "outcome unknown" (C8) while the completion keeps trying on its own; a `budget_spent` event
//! names the step that spent it (C16). A key given back (nothing happened, C8) while the store
//! is down is given back once it answers, not left to wait out its lease.

mod support;

use idem_core::{
    Error, Event, EventKind, Failure, Idempotency, Observer, Operation, Outcome, Policy, Request,
    RunError, StoreErrorKind, StoredResponse,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use support::Faulty;

/// The policy's budget in these tests.
const BUDGET: Duration = Duration::from_millis(400);
/// Long: a completion that gave up within the budget is not waiting for the lease.
const LEASE: Duration = Duration::from_secs(20);
/// What a loaded two-core machine may add to an answer beyond its budget.
const MARGIN: Duration = Duration::from_millis(600);

/// One event seen: kind, step, time taken.
type Seen = (EventKind, Option<Operation>, Duration);

/// The events seen.
#[derive(Clone, Default)]
struct Spent(Arc<Mutex<Vec<Seen>>>);

impl Observer for Spent {
    fn observe(&self, event: &Event<'_>) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push((
            event.kind(),
            event.operation(),
            event.elapsed(),
        ));
    }
}

impl Spent {
    /// The steps that spent a budget.
    fn steps(&self) -> Vec<Option<Operation>> {
        self.seen(EventKind::BudgetSpent)
            .map(|(op, _)| op)
            .collect()
    }

    /// The time the store calls of `operation` took, together.
    fn store_time(&self, operation: Operation) -> Duration {
        self.seen(EventKind::StoreCall)
            .filter(|(op, _)| *op == Some(operation))
            .map(|(_, took)| took)
            .sum()
    }

    fn seen(&self, kind: EventKind) -> impl Iterator<Item = (Option<Operation>, Duration)> {
        let seen = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        seen.into_iter()
            .filter(move |(k, _, _)| *k == kind)
            .map(|(_, op, took)| (op, took))
    }
}

fn engine(store: &Arc<Faulty>, spent: &Spent) -> Idempotency<Arc<Faulty>> {
    Idempotency::builder(Arc::clone(store))
        .policy(Policy::default().lease(LEASE).store_timeout(BUDGET))
        .without_tracing()
        .observer(spent.clone())
        .build()
        .expect("policy")
}

fn request(idem: &Idempotency<Arc<Faulty>>, key: &str) -> Request {
    idem.request("acct", "POST", "/charges")
        .key(Some(key))
        .body(b"{\"amount\":100}")
        .build()
        .expect("valid")
}

/// A handler that counts its runs and, once run, freezes the store (`freeze`).
async fn charge(
    idem: &Idempotency<Arc<Faulty>>,
    request: &Request,
    store: &Arc<Faulty>,
    runs: &Arc<AtomicUsize>,
    freeze: bool,
) -> Result<Outcome, RunError<&'static str>> {
    let (store, runs) = (Arc::clone(store), Arc::clone(runs));
    idem.run(request, move |_| async move {
        runs.fetch_add(1, Ordering::SeqCst);
        store.frozen.store(freeze, Ordering::SeqCst);
        Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged"))
    })
    .await
}

/// C13, C8: the store freezes once the effect ran. The caller is answered "outcome unknown"
/// within one budget, not after the lease; the completion goes on by itself and lands when the
/// store thaws, so the retry replays and the effect ran once.
#[tokio::test]
async fn c13_a_store_frozen_after_the_effect_answers_outcome_unknown_within_one_budget() {
    let store = Arc::new(Faulty::default());
    let spent = Spent::default();
    let idem = engine(&store, &spent);
    let req = request(&idem, "frozen-after-effect");
    let runs = Arc::new(AtomicUsize::new(0));

    let started = Instant::now();
    let first = charge(&idem, &req, &store, &runs, true).await;
    let took = started.elapsed();
    assert!(matches!(first, Err(RunError::Incomplete(_))), "{first:?}");
    assert!(took < BUDGET + MARGIN, "answered after {took:?}");
    assert_eq!(spent.steps(), [Some(Operation::Complete)]);

    store.frozen.store(false, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(5);
    let retry = loop {
        match charge(&idem, &req, &store, &runs, false).await {
            Ok(Outcome::Answered(answer)) if !answer.is_replay() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => break other,
        }
    };
    let replayed = retry.ok().and_then(|o| o.response().cloned());
    assert_eq!(replayed, Some(StoredResponse::new(201, "charged")));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the effect ran twice");
}

/// C13, C8: in guard style too, a store frozen once the effect ran answers `complete` within
/// the request's one budget, not after the lease: the error (outcome unknown) while the
/// completion goes on by itself and lands when the store thaws, so a retry replays.
#[tokio::test]
async fn c13_a_guard_completion_on_a_frozen_store_answers_within_one_budget() {
    let store = Arc::new(Faulty::default());
    let spent = Spent::default();
    let idem = engine(&store, &spent);
    let req = request(&idem, "guard-frozen-after-effect");
    let idem_core::Begin::Acquired(lease) = idem.begin(&req).await.expect("begin") else {
        panic!("a fresh key is acquired");
    };
    store.frozen.store(true, Ordering::SeqCst);

    let started = Instant::now();
    let completing = idem.complete(lease, StoredResponse::new(201, "charged"));
    let completed = tokio::time::timeout(LEASE, completing).await;
    let took = started.elapsed();
    assert!(matches!(completed, Ok(Err(_))), "{completed:?}");
    assert!(took < BUDGET + MARGIN, "answered after {took:?}");

    store.frozen.store(false, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(5);
    let retry = loop {
        match idem.begin(&req).await.expect("begin") {
            idem_core::Begin::Answered(answer)
                if !answer.is_replay() && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => break other,
        }
    };
    assert!(
        matches!(&retry, idem_core::Begin::Answered(idem_core::Answer::Replay(stored))
            if *stored == StoredResponse::new(201, "charged")),
        "{retry:?}"
    );
}

/// C13: frozen before anything ran, the request is store-down (retryable) within one budget,
/// and the handler never runs.
#[tokio::test]
async fn c13_a_store_frozen_before_the_effect_is_store_down_within_one_budget() {
    let store = Arc::new(Faulty::default());
    let spent = Spent::default();
    let idem = engine(&store, &spent);
    let req = request(&idem, "frozen-before");
    let runs = Arc::new(AtomicUsize::new(0));
    store.frozen.store(true, Ordering::SeqCst);

    let started = Instant::now();
    let answer = charge(&idem, &req, &store, &runs, true).await;
    let took = started.elapsed();
    let Err(RunError::Idem(error)) = answer else {
        panic!("store-down expected: {answer:?}");
    };
    assert_eq!(
        error.as_store().map(|e| e.kind()),
        Some(StoreErrorKind::Unavailable)
    );
    assert!(error.is_retryable());
    assert!(took < BUDGET + MARGIN, "answered after {took:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(spent.steps(), [Some(Operation::Reserve)]);
}

/// C13: the steps share one budget. A reservation that takes most of it leaves the completion
/// only the rest: the request's store time stays within one budget, not one per step.
#[tokio::test]
async fn c13_the_steps_of_a_request_share_one_budget() {
    let store = Arc::new(Faulty {
        reserve_answer_after: BUDGET.mul_f32(0.7),
        ..Faulty::default()
    });
    store.slow_reserves.store(1, Ordering::SeqCst);
    let spent = Spent::default();
    let idem = engine(&store, &spent);
    let req = request(&idem, "shared-budget");
    let runs = Arc::new(AtomicUsize::new(0));

    let started = Instant::now();
    let first = charge(&idem, &req, &store, &runs, true).await;
    let took = started.elapsed();
    store.frozen.store(false, Ordering::SeqCst);
    assert!(matches!(first, Err(RunError::Incomplete(_))), "{first:?}");
    assert!(took < BUDGET + MARGIN, "answered after {took:?}");
    assert_eq!(spent.steps(), [Some(Operation::Complete)]);
    // The completion had what the reservation left: with a budget per step it has it all.
    let reserving = spent.store_time(Operation::Reserve);
    let completing = spent.store_time(Operation::Complete);
    assert!(reserving >= BUDGET.mul_f32(0.7), "{reserving:?}");
    assert!(
        completing <= BUDGET.saturating_sub(reserving) + Duration::from_millis(60),
        "the completion waited {completing:?} after a reservation of {reserving:?}"
    );
}

/// C13: a request's own budget (a caller's deadline) replaces the policy's.
#[tokio::test]
async fn c13_a_request_carries_its_own_budget() {
    let store = Arc::new(Faulty::default());
    let spent = Spent::default();
    let idem = Idempotency::builder(Arc::clone(&store))
        .policy(
            Policy::default()
                .lease(LEASE)
                .store_timeout(Duration::from_secs(30)),
        )
        .without_tracing()
        .observer(spent.clone())
        .build()
        .expect("policy");
    let req = request(&idem, "own-budget").with_store_budget(BUDGET);
    store.frozen.store(true, Ordering::SeqCst);

    let started = Instant::now();
    let begun = idem.begin(&req).await;
    let took = started.elapsed();
    assert!(
        matches!(&begun, Err(Error::Store(e)) if e.kind() == StoreErrorKind::Unavailable),
        "{begun:?}"
    );
    assert!(took < BUDGET + MARGIN, "answered after {took:?}");
    assert_eq!(spent.steps(), [Some(Operation::Reserve)]);
}

/// A handler that failed before its effect (nothing happened, C8), after which the store is
/// frozen (`freeze`) for `thaw_after`.
async fn fail_before_the_effect(
    idem: &Idempotency<Arc<Faulty>>,
    request: &Request,
    store: &Arc<Faulty>,
    runs: &Arc<AtomicUsize>,
) -> Result<Outcome, RunError<&'static str>> {
    let (store, runs) = (Arc::clone(store), Arc::clone(runs));
    idem.run(request, move |_| async move {
        runs.fetch_add(1, Ordering::SeqCst);
        store.frozen.store(true, Ordering::SeqCst);
        Err::<StoredResponse, _>(Failure::nothing_happened("card network down"))
    })
    .await
}

/// Retries `request` until its handler runs again or `within` passes; returns how long the key
/// was held after `since`.
async fn free_again_after(
    idem: &Idempotency<Arc<Faulty>>,
    request: &Request,
    store: &Arc<Faulty>,
    runs: &Arc<AtomicUsize>,
    since: Instant,
    within: Duration,
) -> Duration {
    loop {
        let answer = charge(idem, request, store, runs, false).await;
        match answer {
            Ok(Outcome::Answered(answer)) if !answer.is_replay() => {
                assert!(
                    since.elapsed() < within,
                    "the key was still held after {within:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(Outcome::Executed(_)) => return since.elapsed(),
            other => panic!("a retry of a released key: {other:?}"),
        }
    }
}

/// C8, C13: the store freezes after a handler failed before its effect. The caller is answered
/// within one budget; the key is given back once the store answers again (here after several
/// budgets), not after the lease (20 s): the corrected retry runs.
#[tokio::test]
async fn c08_a_key_given_back_while_the_store_is_frozen_is_free_once_it_thaws() {
    let store = Arc::new(Faulty::default());
    let spent = Spent::default();
    let idem = engine(&store, &spent);
    let req = request(&idem, "released-while-frozen");
    let runs = Arc::new(AtomicUsize::new(0));

    let started = Instant::now();
    let first = fail_before_the_effect(&idem, &req, &store, &runs).await;
    assert!(matches!(first, Err(RunError::Released(_))), "{first:?}");
    assert!(
        started.elapsed() < BUDGET + MARGIN,
        "answered after {:?}",
        started.elapsed()
    );
    assert_eq!(spent.steps(), [Some(Operation::Release)]);

    // Frozen for longer than the request's budget and the next one together.
    tokio::time::sleep(BUDGET * 4).await;
    store.frozen.store(false, Ordering::SeqCst);
    let thawed = Instant::now();
    let held = free_again_after(&idem, &req, &store, &runs, thawed, Duration::from_secs(5)).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the corrected retry did not run"
    );
    assert!(
        held < LEASE / 4,
        "the key was held {held:?} after the store thawed"
    );
}

/// C8: a release the store refuses for a moment (connection refused, within the budget) is
/// tried again, so the key is free long before its lease ends.
#[tokio::test]
async fn c08_a_release_refused_for_a_moment_is_tried_again() {
    let store = Arc::new(Faulty {
        failing_releases: AtomicUsize::new(3),
        ..Faulty::default()
    });
    let spent = Spent::default();
    let idem = engine(&store, &spent);
    let req = request(&idem, "release-refused");
    let runs = Arc::new(AtomicUsize::new(0));

    let first = idem
        .run(&req, |_| async {
            Err::<StoredResponse, _>(Failure::nothing_happened("card network down"))
        })
        .await;
    assert!(matches!(first, Err(RunError::Released(_))), "{first:?}");
    let since = Instant::now();
    let held = free_again_after(&idem, &req, &store, &runs, since, Duration::from_secs(5)).await;
    assert_eq!(store.failing_releases.load(Ordering::SeqCst), 0);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the retry did not run");
    assert!(held < LEASE / 4, "the key was held {held:?}");
}

/// C16: a release that landed but lost its answer, tried again and fenced out (nothing left
/// under the token), is reported released, never `lease_lost`: the key went back.
#[tokio::test]
async fn c16_a_release_whose_answer_was_lost_is_reported_released() {
    let store = Arc::new(Faulty {
        unanswered_releases: AtomicUsize::new(1),
        ..Faulty::default()
    });
    let spent = Spent::default();
    let idem = engine(&store, &spent);
    let req = request(&idem, "release-unanswered");
    let first = idem
        .run(&req, |_| async {
            Err::<StoredResponse, _>(Failure::nothing_happened("card network down"))
        })
        .await;
    assert!(matches!(first, Err(RunError::Released(_))), "{first:?}");
    tokio::time::timeout(Duration::from_secs(5), idem.drain())
        .await
        .expect("the release ends");
    assert_eq!(store.unanswered_releases.load(Ordering::SeqCst), 0);
    let ends: Vec<_> = [EventKind::Released, EventKind::LeaseLost]
        .into_iter()
        .map(|kind| spent.seen(kind).count())
        .collect();
    assert_eq!(ends, [1, 0], "released, lease lost");
}
