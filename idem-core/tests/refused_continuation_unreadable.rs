//! Review of 900e5fd: a refused continuation whose record cannot be read leaves the decision
//! to the heartbeat (`no_longer_held`'s own words); once the heartbeat is told the lease is
//! lost, the continuation ends.

mod support;

use idem_core::{
    Begin, Event, EventKind, Failure, Idempotency, Observer, Policy, Request, RunError,
    StoredResponse,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::Faulty;

fn request(idem: &Idempotency<Arc<Faulty>>, key: &str) -> Request {
    idem.request("acct", "POST", "/reports")
        .key(Some(key))
        .body(b"{}")
        .build()
        .expect("valid")
}

#[derive(Default)]
struct Refusals(AtomicUsize);

impl Observer for Refusals {
    fn observe(&self, event: &Event<'_>) {
        if event.kind() == EventKind::CompletionRefused {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// C8, C9: the store refuses every write before it reads the token, and the record another
/// holder took cannot be decoded by this process (another version's record). The heartbeat is
/// told `LeaseLost` by its renewal; the continuation must end then, not write its 500 once a
/// second for ever with `drain` never returning.
#[tokio::test]
async fn c09_a_refused_continuation_ends_when_the_heartbeat_lost_the_lease_unread() {
    let store = Arc::new(Faulty::default());
    let refusals = Arc::new(Refusals::default());
    let policy = Policy::default().lease(Duration::from_millis(200));
    let idem = Idempotency::builder(Arc::clone(&store))
        .policy(policy.clone())
        .observer(Arc::clone(&refusals))
        .build()
        .expect("policy");
    let other = Idempotency::with_policy(Arc::clone(&store), policy).expect("policy");
    let req = request(&idem, "refused-taken-unreadable");
    let s = Arc::clone(&store);
    let first = idem
        .run(&req, move |_| async move {
            s.refusing.store(true, Ordering::SeqCst);
            Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged"))
        })
        .await;
    assert!(matches!(first, Err(RunError::Incomplete(_))), "{first:?}");

    store.failing_renews.store(usize::MAX / 2, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let taken = other.begin(&req).await.expect("begin");
    assert!(matches!(taken, Begin::Acquired(_)), "{taken:?}");
    // The new holder's record is one this process cannot decode.
    store.unreadable.store(true, Ordering::SeqCst);
    // The heartbeat's next renewal is told the lease is lost.
    store.failing_renews.store(0, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let before = refusals.0.load(Ordering::SeqCst);
    let drained = tokio::time::timeout(Duration::from_secs(4), idem.drain()).await;
    let during = refusals.0.load(Ordering::SeqCst) - before;
    assert!(
        drained.is_ok(),
        "the heartbeat was told LeaseLost, but the continuation only ends on a lookup it \
         cannot make: {during} refusals in 4 s, and drain never returns"
    );
}
