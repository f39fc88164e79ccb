//! What a request that waited for its original reports (C5, C16): one `waited` event whose
//! duration is the wait alone (not the execution that may follow it), then its one answer; a
//! caller that goes away while it waits still ends as an answer, in flight.

use idem_core::{
    Event, EventKind, Failure, Idempotency, MemoryStore, Observer, Policy, StoredResponse,
};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Every event's kind and duration.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(EventKind, Duration)>>>);

impl Observer for Seen {
    fn observe(&self, event: &Event<'_>) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((event.kind(), event.elapsed()));
    }
}

impl Seen {
    fn kinds(&self) -> Vec<(EventKind, Duration)> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// An engine whose duplicates wait up to 5 s, reporting to `seen`, and a request to it.
fn engine(seen: &Seen) -> (Idempotency<MemoryStore>, idem_core::Request) {
    let idem = Idempotency::builder(MemoryStore::new())
        .policy(Policy::default().wait_in_flight(Duration::from_secs(5)))
        .without_tracing()
        .observer(seen.clone())
        .build()
        .expect("policy");
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some("k"))
        .body(b"{}")
        .build()
        .expect("valid");
    (idem, request)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c16_the_waited_event_measures_the_wait_not_the_execution_that_follows() {
    let seen = Seen::default();
    let (idem, request) = engine(&seen);
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let original = {
        let (idem, request) = (idem.clone(), request.clone());
        tokio::spawn(async move {
            idem.run(&request, |_| async move {
                let _ = release_rx.await;
                Err::<StoredResponse, _>(Failure::nothing_happened(std::io::Error::other("no")))
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let duplicate = {
        let (idem, request) = (idem.clone(), request.clone());
        tokio::spawn(async move {
            idem.run(&request, |_| async move {
                // The duplicate's own execution takes a second.
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "ran"))
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    release_tx.send(()).expect("the original waits");
    let _ = original.await.expect("the original");
    let ran = duplicate
        .await
        .expect("the duplicate")
        .expect("the duplicate ran");
    assert!(matches!(ran, idem_core::Outcome::Executed(_)), "{ran:?}");
    let events = seen.kinds();
    let waited: Vec<_> = events
        .iter()
        .filter(|(kind, _)| *kind == EventKind::Waited)
        .collect();
    assert_eq!(waited.len(), 1, "{events:?}");
    assert!(
        waited[0].1 < Duration::from_millis(800),
        "the wait was about 100 ms, reported {:?}",
        waited[0].1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c16_a_caller_gone_while_it_waits_ends_in_flight() {
    let seen = Seen::default();
    let (idem, request) = engine(&seen);
    let idem_core::Begin::Acquired(lease) = idem.begin(&request).await.expect("begin") else {
        panic!("a fresh key is acquired");
    };
    let waiter = {
        let (idem, request) = (idem.clone(), request.clone());
        tokio::spawn(async move { idem.begin(&request).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    waiter.abort();
    let _ = waiter.await;
    // The permit is given back (other tests of this binary may be waiting a moment too).
    let mut left = idem_core::waiting_now();
    for _ in 0..300 {
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        left = idem_core::waiting_now();
    }
    assert_eq!(left, 0, "the permit is given back");
    let answers: Vec<_> = seen
        .kinds()
        .into_iter()
        .filter(|(kind, _)| kind.is_answer() || *kind == EventKind::Waited)
        .map(|(kind, _)| kind)
        .collect();
    assert_eq!(
        answers,
        vec![EventKind::Waited, EventKind::InFlight],
        "the abandoned wait is one answer"
    );
    idem.complete(lease, StoredResponse::new(201, "ok"))
        .await
        .expect("complete");
}
