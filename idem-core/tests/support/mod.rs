//! What the engine's integration tests share: one memory store with the faults they inject.
// Each test binary uses a part of it.
#![allow(dead_code)]

use idem_core::store::Deadline;
use idem_core::store::{async_trait, Acquire, Claim, Completion, Lease, Record, Reserved};
use idem_core::{Error, MemoryStore, RecordId, Store, StoreErrorKind, Timestamp};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// A [`MemoryStore`] that misbehaves on demand. Without `one_process` it has no identity, so
/// two engines over it play two processes sharing a store (each its own live executions).
#[derive(Default)]
pub(crate) struct Faulty {
    pub inner: MemoryStore,
    /// Engines over it are one process's (`Store::identity` forwarded).
    pub one_process: bool,
    /// Every completion and renewal fails (the store cannot be written).
    pub unwritable: AtomicBool,
    /// Every completion is refused for good (a revoked permission, a full disk), while
    /// renewals still land.
    pub refusing: AtomicBool,
    /// While set, a lookup sets `refusing`: the store starts refusing writes right as the
    /// engine reads the record (a permission revoked between two steps).
    pub refuse_from_next_lookup: AtomicBool,
    /// Completions whose encoded form is larger than this take `slow_for` before they land:
    /// a large body on a slow link.
    pub slow_above: Option<usize>,
    pub slow_for: Duration,
    /// How many of the next reservations answer only after `reserve_answer_after`.
    pub slow_reserves: AtomicUsize,
    pub reserve_answer_after: Duration,
    /// How many of the next renewals fail.
    pub failing_renews: AtomicUsize,
    /// How many of the next releases fail (the store refuses the connection).
    pub failing_releases: AtomicUsize,
    /// How many of the next releases land and then lose their answer (a connection dropped).
    pub unanswered_releases: AtomicUsize,
    /// How many of the next releases land and then never answer (a network that swallows the
    /// reply): only the engine's deadline ends the wait.
    pub blackholed_releases: AtomicUsize,
    /// Every call waits while this is set: a frozen server, or a network that swallows
    /// everything (a blackhole). Only the engine's deadline ends the wait.
    pub frozen: AtomicBool,
    /// While set, every lookup fails: the record is in a form this process cannot decode (one
    /// written by another version of the library during a rolling upgrade).
    pub unreadable: AtomicBool,
    /// `Store::generation`: moved by a test as a reconnection would.
    pub generation: AtomicU64,
    /// How many reservation steps reached the store.
    pub reserves: AtomicUsize,
}

/// A store whose writes of more than 10 kB take 400 ms (a large body on a slow link), and two
/// engines over it (two processes) with a 300 ms lease and a 100 ms store timeout: such a
/// completion never fits the store timeout.
pub(crate) fn slow_large_writes() -> (
    std::sync::Arc<Faulty>,
    idem_core::Idempotency<std::sync::Arc<Faulty>>,
    idem_core::Idempotency<std::sync::Arc<Faulty>>,
) {
    use idem_core::{Idempotency, Policy};
    use std::sync::Arc;
    let store = Arc::new(Faulty {
        slow_above: Some(10_000),
        slow_for: Duration::from_millis(400),
        ..Faulty::default()
    });
    let policy = Policy::default()
        .lease(Duration::from_millis(300))
        .store_timeout(Duration::from_millis(100));
    let idem = Idempotency::with_policy(Arc::clone(&store), policy.clone()).expect("policy");
    let other = Idempotency::with_policy(Arc::clone(&store), policy).expect("policy");
    (store, idem, other)
}

/// A store that cannot be reached.
pub(crate) fn down() -> Error {
    Error::store("test", StoreErrorKind::Unavailable, "connection refused")
}

impl Faulty {
    /// Waits while the store is frozen.
    async fn thaw(&self) {
        while self.frozen.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Takes one from `counter` if it is above zero.
fn take(counter: &AtomicUsize) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

#[async_trait]
impl Store for Faulty {
    fn identity(&self) -> Option<usize> {
        self.one_process.then(|| self.inner.identity()).flatten()
    }
    fn generation(&self) -> Option<u64> {
        Some(self.generation.load(Ordering::SeqCst))
    }
    async fn reserve(&self, claim: &Claim<'_>, deadline: Deadline) -> Result<Reserved, Error> {
        self.reserves.fetch_add(1, Ordering::SeqCst);
        self.thaw().await;
        let reserved = self.inner.reserve(claim, deadline).await;
        if take(&self.slow_reserves) {
            tokio::time::sleep(self.reserve_answer_after).await;
        }
        reserved
    }
    async fn replace(
        &self,
        claim: &Claim<'_>,
        acquire: Acquire,
        deadline: Deadline,
    ) -> Result<Reserved, Error> {
        self.thaw().await;
        self.inner.replace(claim, acquire, deadline).await
    }
    async fn complete(&self, c: &Completion, deadline: Deadline) -> Result<(), Error> {
        self.thaw().await;
        if self.unwritable.load(Ordering::SeqCst) {
            return Err(down());
        }
        if self.refusing.load(Ordering::SeqCst) {
            return Err(Error::store(
                "test",
                StoreErrorKind::Misconfigured,
                "permission denied for table idem_records",
            ));
        }
        if self.slow_above.is_some_and(|max| c.encoded().len() > max) {
            tokio::time::sleep(self.slow_for).await;
        }
        self.inner.complete(c, deadline).await
    }
    async fn release(&self, l: &Lease, deadline: Deadline) -> Result<(), Error> {
        self.thaw().await;
        if take(&self.failing_releases) {
            return Err(down());
        }
        let released = self.inner.release(l, deadline).await;
        if released.is_ok() && take(&self.unanswered_releases) {
            return Err(down());
        }
        if released.is_ok() && take(&self.blackholed_releases) {
            std::future::pending::<()>().await;
        }
        released
    }
    async fn renew(&self, l: &Lease, d: Duration, deadline: Deadline) -> Result<Timestamp, Error> {
        if self.unwritable.load(Ordering::SeqCst) || take(&self.failing_renews) {
            return Err(down());
        }
        self.inner.renew(l, d, deadline).await
    }
    async fn purge_expired(&self, n: usize, deadline: Deadline) -> Result<usize, Error> {
        self.inner.purge_expired(n, deadline).await
    }
    async fn lookup(&self, id: &RecordId, deadline: Deadline) -> Result<Option<Record>, Error> {
        self.thaw().await;
        if self.unreadable.load(Ordering::SeqCst) {
            return Err(Error::CorruptRecord("unknown record format version".into()));
        }
        if self.refuse_from_next_lookup.swap(false, Ordering::SeqCst) {
            self.refusing.store(true, Ordering::SeqCst);
        }
        self.inner.lookup(id, deadline).await
    }
    async fn resolve(
        &self,
        r: &idem_core::store::Resolution,
        deadline: Deadline,
    ) -> Result<bool, Error> {
        self.inner.resolve(r, deadline).await
    }
}

/// A request for a report under key `key` (one body for every call of a test).
pub(crate) fn request<S: Store>(idem: &idem_core::Idempotency<S>, key: &str) -> idem_core::Request {
    idem.request("acct", "POST", "/reports")
        .key(Some(key))
        .body(b"{}")
        .build()
        .expect("valid")
}
