//! Two engines over one store in one process (one per router, say) share their registry of
//! live executions (C9, `Store::identity`): a duplicate reaching the other engine while the
//! first execution's completion is still being written past the lease is answered in flight,
//! never a takeover and a second effect.

use idem_core::store::{Completion, Lease, ListQuery, Page, Record, Stats};
use idem_core::{
    async_trait, Begin, Error, Failure, Idempotency, MemoryStore, Outcome, Policy, RecordId,
    Request, RunError, Store, StoreErrorKind, StoredResponse, Timestamp,
};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A memory store whose completions and renewals fail while `unwritable`.
#[derive(Default)]
struct Unwritable {
    inner: MemoryStore,
    unwritable: AtomicBool,
}

fn down() -> Error {
    Error::store("test", StoreErrorKind::Unavailable, "connection refused")
}

#[async_trait]
impl Store for Unwritable {
    fn identity(&self) -> Option<usize> {
        self.inner.identity()
    }
    async fn reserve(&self, r: &Request, l: Duration) -> Result<Begin, Error> {
        self.inner.reserve(r, l).await
    }
    async fn complete(&self, c: &Completion) -> Result<(), Error> {
        if self.unwritable.load(Ordering::SeqCst) {
            return Err(down());
        }
        self.inner.complete(c).await
    }
    async fn release(&self, l: &Lease) -> Result<(), Error> {
        self.inner.release(l).await
    }
    async fn renew(&self, l: &Lease, d: Duration) -> Result<Timestamp, Error> {
        if self.unwritable.load(Ordering::SeqCst) {
            return Err(down());
        }
        self.inner.renew(l, d).await
    }
    async fn purge_expired(&self, n: usize) -> Result<usize, Error> {
        self.inner.purge_expired(n).await
    }
    async fn lookup(&self, id: &RecordId) -> Result<Option<Record>, Error> {
        self.inner.lookup(id).await
    }
    async fn list(&self, query: &ListQuery) -> Result<Page, Error> {
        self.inner.list(query).await
    }
    async fn stats(&self) -> Result<Stats, Error> {
        self.inner.stats().await
    }
}

#[tokio::test]
async fn c09_a_live_execution_is_never_taken_over_by_another_engine_of_the_process() {
    let store = Arc::new(Unwritable::default());
    let policy = Policy::default().lease(Duration::from_millis(200));
    let api = Idempotency::with_policy(Arc::clone(&store), policy.clone()).expect("policy");
    let admin = Idempotency::with_policy(Arc::clone(&store), policy).expect("policy");
    let request = api
        .request("acct", "POST", "/charges")
        .key(Some("two-engines"))
        .body(b"{}")
        .build()
        .expect("valid");
    let effects = Arc::new(AtomicUsize::new(0));
    let run = |idem: &Idempotency<Arc<Unwritable>>, effects: Arc<AtomicUsize>| {
        let (idem, request, store) = (idem.clone(), request.clone(), Arc::clone(&store));
        async move {
            idem.run(&request, move |_| async move {
                effects.fetch_add(1, Ordering::SeqCst);
                store.unwritable.store(true, Ordering::SeqCst);
                Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged"))
            })
            .await
        }
    };
    let first = run(&api, Arc::clone(&effects)).await;
    assert!(matches!(first, Err(RunError::Incomplete(_))), "{first:?}");
    // The lease passed in the store; the first execution is alive, still completing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let on_api: Result<Outcome, _> = run(&api, Arc::clone(&effects)).await;
    let on_admin: Result<Outcome, _> = run(&admin, Arc::clone(&effects)).await;
    eprintln!("retry on the same engine = {on_api:?}\nretry on the other engine = {on_admin:?}");
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "the process's other engine took its live execution over and ran the effect again"
    );
}
