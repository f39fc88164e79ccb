//! The guard style where the caller's runtime is not the engine's: polled outside any Tokio
//! runtime (an executor of the caller's own), completed on a runtime that stops right after
//! (one made for one call), or with a lease the engine did not take (a store's own
//! reservation). A completion that cannot be stored answers within one store budget (C13),
//! goes on, fenced, past the caller's answer (C8), nothing panics, and the execution ends
//! once, with one end event (C16).

mod support;

use idem_core::store::{Deadline, StoreExt};
use idem_core::{Answer, Begin, Event, EventKind, Idempotency, Observer, Policy, StoredResponse};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};
use support::{request, Faulty};

/// Wakes the thread that polls.
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `future` to its end on this thread, with no Tokio runtime anywhere in sight.
fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        thread::park_timeout(Duration::from_millis(5));
    }
}

/// C8: outside any Tokio runtime, a guard's completion refused for good, its 500 refused too,
/// answers the error without a panic and keeps the key: another process finds it in flight
/// several leases later, then the 500 once the store takes it, never free to run the effect
/// again.
#[test]
fn c08_a_guard_completion_refused_outside_a_runtime_keeps_the_key_without_a_panic() {
    let store = Arc::new(Faulty::default());
    let policy = Policy::default().lease(Duration::from_millis(200));
    let idem = Idempotency::with_policy(Arc::clone(&store), policy.clone()).expect("policy");
    let other = Idempotency::with_policy(Arc::clone(&store), policy).expect("policy");
    let req = request(&idem, "guard-no-runtime");
    let Begin::Acquired(lease) = block_on(idem.begin(&req)).expect("begin") else {
        panic!("a fresh key is acquired");
    };
    store.refusing.store(true, Ordering::SeqCst);
    let completed = catch_unwind(AssertUnwindSafe(|| {
        block_on(idem.complete(lease, StoredResponse::new(201, "charged")))
    }));
    let Ok(completed) = completed else {
        panic!("complete panicked outside a Tokio runtime");
    };
    assert!(completed.is_err(), "{completed:?}");

    // Several leases later, from another process.
    thread::sleep(Duration::from_millis(800));
    let during = block_on(other.begin(&req)).expect("begin");
    assert!(
        matches!(during, Begin::Answered(Answer::InFlight { .. })),
        "the key was free to run again: {during:?}"
    );
    store.refusing.store(false, Ordering::SeqCst);
    thread::sleep(Duration::from_millis(1500));
    let after = block_on(other.begin(&req)).expect("begin");
    assert!(
        matches!(&after, Begin::Answered(Answer::Replay(stored)) if stored.status == 500),
        "{after:?}"
    );
}

/// Counts the end events of executions.
#[derive(Default)]
struct Ends(AtomicUsize);

impl Observer for Ends {
    fn observe(&self, event: &Event<'_>) {
        if matches!(
            event.kind(),
            EventKind::Executed | EventKind::OutcomeUnknown | EventKind::LeaseLost
        ) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// C8: a guard completion that cannot be stored, made on a runtime that is dropped once
/// `complete` answered, keeps the key: another process finds it in flight several leases
/// later, then the stored response once the store takes it, never free to run the effect
/// again; the execution reports one end.
#[test]
fn c08_a_guard_completion_on_a_runtime_that_stops_keeps_the_key() {
    let store = Arc::new(Faulty::default());
    let policy = Policy::default()
        .lease(Duration::from_millis(300))
        .store_timeout(Duration::from_millis(200));
    let ends = Arc::new(Ends::default());
    let idem = Idempotency::builder(Arc::clone(&store))
        .policy(policy.clone())
        .observer(Arc::clone(&ends))
        .build()
        .expect("policy");
    let other = Idempotency::with_policy(Arc::clone(&store), policy).expect("policy");
    let main = tokio::runtime::Runtime::new().expect("runtime");
    let req = request(&idem, "guard-across-runtimes");
    let Begin::Acquired(lease) = main.block_on(idem.begin(&req)).expect("begin") else {
        panic!("a fresh key is acquired");
    };

    store.refusing.store(true, Ordering::SeqCst);
    let completed = {
        // A runtime for this one call, dropped right after it.
        let once = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        once.block_on(idem.complete(lease, StoredResponse::new(201, "charged")))
    };
    assert!(completed.is_err(), "{completed:?}");

    std::thread::sleep(Duration::from_millis(1200));
    let during = main.block_on(other.begin(&req)).expect("begin");
    assert!(
        matches!(during, Begin::Answered(Answer::InFlight { .. })),
        "the key was free to run again: {during:?}"
    );
    store.refusing.store(false, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(2500));
    let after = main.block_on(other.begin(&req)).expect("begin");
    assert!(
        matches!(&after, Begin::Answered(Answer::Replay(_))),
        "{after:?}"
    );
    assert_eq!(ends.0.load(Ordering::SeqCst), 1, "end events");
}

/// C13: `complete` with a lease that carries no request budget and no local deadline, on a
/// store that cannot be written, answers within one store budget (plus a margin for a loaded
/// machine), never waits for the store to come back; the completion still lands once it does.
#[tokio::test]
async fn c13_a_guard_completion_of_a_store_lease_answers_within_one_budget() {
    let budget = Duration::from_millis(300);
    let store = Arc::new(Faulty::default());
    let policy = Policy::default()
        .lease(Duration::from_secs(20))
        .store_timeout(budget);
    let idem = Idempotency::with_policy(Arc::clone(&store), policy).expect("policy");
    let req = request(&idem, "store-lease");
    let reserved = store
        .reservation(&req, Duration::from_secs(20), Deadline::default())
        .await
        .expect("reserved");
    let Begin::Acquired(lease) = reserved else {
        panic!("a fresh key is acquired");
    };
    store.unwritable.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let completed = tokio::time::timeout(
        Duration::from_secs(5),
        idem.complete(lease, StoredResponse::new(201, "charged")),
    )
    .await;
    let took = started.elapsed();
    let Ok(completed) = completed else {
        panic!("complete still waiting after {took:?}");
    };
    assert!(completed.is_err(), "{completed:?}");
    assert!(
        took < budget + Duration::from_millis(700),
        "answered after {took:?}"
    );

    store.unwritable.store(false, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(10), idem.drain())
        .await
        .expect("the continuation lands once the store is writable");
    let again = idem.begin(&req).await.expect("begin");
    assert!(
        matches!(&again, Begin::Answered(idem_core::Answer::Replay(stored)) if stored.status == 201),
        "{again:?}"
    );
}
