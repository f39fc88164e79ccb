//! A release that landed and lost its answer is reported released (C16), whichever way the
//! answer was lost: a dropped connection, or a timeout that spent the request's budget.

mod support;

use idem_core::{
    Event, EventKind, Failure, Idempotency, Observer, Policy, RunError, StoredResponse,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use support::Faulty;

#[derive(Clone, Default)]
struct Kinds(Arc<Mutex<Vec<EventKind>>>);

impl Observer for Kinds {
    fn observe(&self, event: &Event<'_>) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(event.kind());
    }
}

impl Kinds {
    fn count(&self, kind: EventKind) -> usize {
        let seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        seen.iter().filter(|k| **k == kind).count()
    }
}

/// C16: a release that landed, then timed out waiting for its answer (a blackholed reply, the
/// most common way an answer is lost), spends the request's budget. It was sent all the same:
/// the retry on its own task, fenced out because the record is gone, is that release's, and is
/// reported released, never `lease_lost`.
#[tokio::test]
async fn c16_a_release_that_landed_and_timed_out_is_reported_released() {
    let store = Arc::new(Faulty {
        blackholed_releases: AtomicUsize::new(1),
        ..Faulty::default()
    });
    let kinds = Kinds::default();
    let idem = Idempotency::builder(Arc::clone(&store))
        .policy(
            Policy::default()
                .lease(Duration::from_secs(20))
                .store_timeout(Duration::from_millis(300)),
        )
        .without_tracing()
        .observer(kinds.clone())
        .build()
        .expect("policy");
    let req = idem
        .request("acct", "POST", "/charges")
        .key(Some("release-blackholed"))
        .body(b"{}")
        .build()
        .expect("valid");
    let first = idem
        .run(&req, |_| async {
            Err::<StoredResponse, _>(Failure::nothing_happened("card network down"))
        })
        .await;
    assert!(matches!(first, Err(RunError::Released(_))), "{first:?}");
    tokio::time::timeout(Duration::from_secs(5), idem.drain())
        .await
        .expect("the release ends");
    assert_eq!(store.blackholed_releases.load(Ordering::SeqCst), 0);
    let ends = [EventKind::Released, EventKind::LeaseLost].map(|kind| kinds.count(kind));
    assert_eq!(
        ends,
        [1, 0],
        "released, lease lost: a release sent and timed out (the request's budget spent by \
         it) was taken for one never sent (`sent = !budget.is_spent()` after the attempt), \
         so the fenced retry was reported as a lost lease"
    );
}
