//! The engine's replay cache and the store's health (C13): a store that reconnected may have
//! lost commits, and one that went silent may have; nothing is answered from memory then.

mod support;

use idem_core::{
    Answer, Begin, Event, EventKind, Idempotency, Observer, Operation, Policy, ReplayCache,
    Request, StoredResponse,
};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use support::Faulty;

#[derive(Default)]
struct Sources(Mutex<Vec<Option<Operation>>>);

impl Observer for Sources {
    fn observe(&self, event: &Event<'_>) {
        if event.kind() == EventKind::Replayed {
            let mut seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            seen.push(event.operation());
        }
    }
}

/// An engine with a replay cache over `store`, its store budget 300 ms; `k` completed.
async fn completed(
    store: &Arc<Faulty>,
    sources: &Arc<Sources>,
) -> (Idempotency<Arc<Faulty>>, Request) {
    let idem = Idempotency::builder(Arc::clone(store))
        .policy(Policy::default().store_timeout(Duration::from_millis(300)))
        .replay_cache(ReplayCache::new(100, 1 << 20))
        .observer(Arc::clone(sources))
        .build()
        .expect("an engine");
    let req = idem
        .request("acct", "POST", "/charges")
        .key(Some("k"))
        .body(b"{}")
        .build()
        .expect("a valid request");
    let Begin::Acquired(lease) = idem.begin(&req).await.expect("begin") else {
        panic!("fresh")
    };
    idem.complete(lease, StoredResponse::new(201, "charged"))
        .await
        .expect("complete");
    (idem, req)
}

async fn replay(idem: &Idempotency<Arc<Faulty>>, req: &Request) -> StoredResponse {
    match idem.begin(req).await.expect("begin") {
        Begin::Answered(Answer::Replay(stored)) => stored,
        other => panic!("a replay: {other:?}"),
    }
}

#[tokio::test]
async fn c13_a_store_that_reconnected_answers_itself_until_read_again() {
    let store = Arc::new(Faulty::default());
    let sources = Arc::new(Sources::default());
    let (idem, req) = completed(&store, &sources).await;
    let steps = store.reserves.load(Ordering::SeqCst);
    assert_eq!(replay(&idem, &req).await.body, b"charged");
    assert_eq!(
        store.reserves.load(Ordering::SeqCst),
        steps,
        "no store step"
    );

    store.generation.fetch_add(1, Ordering::SeqCst);
    assert_eq!(replay(&idem, &req).await.body, b"charged");
    assert_eq!(
        store.reserves.load(Ordering::SeqCst),
        steps + 1,
        "the store answered"
    );
    assert_eq!(replay(&idem, &req).await.body, b"charged");
    assert_eq!(
        store.reserves.load(Ordering::SeqCst),
        steps + 1,
        "kept again once read"
    );

    let seen = sources.0.lock().unwrap_or_else(PoisonError::into_inner);
    let cache = Some(Operation::Cache);
    assert_eq!(
        *seen,
        [cache, None, cache],
        "C16: each replay says where it came from"
    );
}

#[tokio::test]
async fn c13_a_store_silent_for_a_second_is_asked_and_its_silence_is_a_503() {
    let store = Arc::new(Faulty::default());
    let sources = Arc::new(Sources::default());
    let (idem, req) = completed(&store, &sources).await;
    store.frozen.store(true, Ordering::SeqCst);
    assert_eq!(
        replay(&idem, &req).await.body,
        b"charged",
        "seen alive just now"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let started = Instant::now();
    let refused = idem
        .begin(&req)
        .await
        .expect_err("the store is asked, and is silent");
    assert!(refused.is_retryable(), "store down (503): {refused:?}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "within the store budget"
    );
    store.frozen.store(false, Ordering::SeqCst);
    assert_eq!(
        replay(&idem, &req).await.body,
        b"charged",
        "the store answers again"
    );
    assert_eq!(replay(&idem, &req).await.body, b"charged");
    let seen = sources.0.lock().unwrap_or_else(PoisonError::into_inner);
    let cache = Some(Operation::Cache);
    assert_eq!(*seen, [cache, None, cache]);
}
