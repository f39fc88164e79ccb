//! The guard style polled outside any Tokio runtime (an executor of the caller's own): a
//! completion that cannot be stored goes on, fenced, past the caller's answer, as on a runtime
//! (C8), and nothing panics.

mod support;

use idem_core::{Answer, Begin, Idempotency, Policy, StoredResponse};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Duration;
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
