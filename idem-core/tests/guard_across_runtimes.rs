//! A guard lease taken on one Tokio runtime and completed on another that stops right after
//! (a runtime made for one call): the completion's continuation outlives that runtime (C8),
//! and its execution ends once, with one end event (C16).

mod support;

use idem_core::{Answer, Begin, Event, EventKind, Idempotency, Observer, Policy, StoredResponse};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::{request, Faulty};

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
