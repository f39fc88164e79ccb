//! The engine's replay cache and the store's generation (C13): a store that reconnected may
//! have lost commits, so nothing read before is answered from memory after.

use idem_core::store::{
    async_trait, Acquire, Capabilities, Changes, Claim, Completion, Deadline, Lease, Record,
    Reserved, Resolution,
};
use idem_core::{
    Answer, Begin, Error, Event, EventKind, Idempotency, MemoryStore, Observer, Operation,
    RecordId, ReplayCache, Request, Store, StoredResponse, Timestamp,
};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// A memory store whose generation moves when told, and which counts its reservation steps.
struct Moving {
    inner: MemoryStore,
    generation: AtomicU64,
    steps: AtomicUsize,
}

#[async_trait]
impl Store for Moving {
    async fn reserve(&self, claim: &Claim<'_>, deadline: Deadline) -> Result<Reserved, Error> {
        self.steps.fetch_add(1, Ordering::SeqCst);
        self.inner.reserve(claim, deadline).await
    }
    async fn replace(
        &self,
        claim: &Claim<'_>,
        acquire: Acquire,
        deadline: Deadline,
    ) -> Result<Reserved, Error> {
        self.inner.replace(claim, acquire, deadline).await
    }
    async fn complete(&self, completion: &Completion, deadline: Deadline) -> Result<(), Error> {
        self.inner.complete(completion, deadline).await
    }
    async fn release(&self, lease: &Lease, deadline: Deadline) -> Result<(), Error> {
        self.inner.release(lease, deadline).await
    }
    async fn renew(
        &self,
        lease: &Lease,
        lease_for: Duration,
        deadline: Deadline,
    ) -> Result<Timestamp, Error> {
        self.inner.renew(lease, lease_for, deadline).await
    }
    async fn purge_expired(&self, limit: usize, deadline: Deadline) -> Result<usize, Error> {
        self.inner.purge_expired(limit, deadline).await
    }
    async fn resolve(&self, resolution: &Resolution, deadline: Deadline) -> Result<bool, Error> {
        self.inner.resolve(resolution, deadline).await
    }
    async fn lookup(&self, id: &RecordId, deadline: Deadline) -> Result<Option<Record>, Error> {
        self.inner.lookup(id, deadline).await
    }
    fn generation(&self) -> Option<u64> {
        Some(self.generation.load(Ordering::SeqCst))
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn watch(&self, changes: Changes) -> bool {
        self.inner.watch(changes)
    }
}

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

fn request(key: &str) -> Request {
    Request::builder("acct", "POST", "/charges")
        .key(Some(key))
        .body(b"{}")
        .build()
        .expect("a valid request")
}

#[tokio::test]
async fn c13_a_store_that_reconnected_answers_itself_until_read_again() {
    let store = Arc::new(Moving {
        inner: MemoryStore::new(),
        generation: AtomicU64::new(7),
        steps: AtomicUsize::new(0),
    });
    let sources = Arc::new(Sources::default());
    let idem = Idempotency::builder(Arc::clone(&store))
        .replay_cache(ReplayCache::new(100, 1 << 20))
        .observer(Arc::clone(&sources))
        .build()
        .expect("an engine");
    let req = request("k");
    let Begin::Acquired(lease) = idem.begin(&req).await.expect("begin") else {
        panic!("fresh")
    };
    idem.complete(lease, StoredResponse::new(201, "charged"))
        .await
        .expect("complete");
    let replay = |idem: &Idempotency<Arc<Moving>>| {
        let (idem, req) = (idem.clone(), req.clone());
        async move {
            match idem.begin(&req).await.expect("begin") {
                Begin::Answered(Answer::Replay(stored)) => stored,
                other => panic!("a replay: {other:?}"),
            }
        }
    };
    let steps = store.steps.load(Ordering::SeqCst);
    assert_eq!(replay(&idem).await.body, b"charged");
    assert_eq!(store.steps.load(Ordering::SeqCst), steps, "no store step");

    store.generation.fetch_add(1, Ordering::SeqCst);
    assert_eq!(replay(&idem).await.body, b"charged");
    assert_eq!(
        store.steps.load(Ordering::SeqCst),
        steps + 1,
        "the store answered"
    );
    assert_eq!(replay(&idem).await.body, b"charged");
    assert_eq!(
        store.steps.load(Ordering::SeqCst),
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
