//! A store seen from another process, for tests that play two processes in one.

use crate::clock::Timestamp;
use crate::error::Error;
use crate::request::Request;
use crate::scope::RecordId;
use crate::store::Deadline;
use crate::store::{
    Acquire, Capabilities, Changes, Claim, Completion, Lease, Record, Reserved, Store,
};
use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;

/// The same records as the store it wraps, as another process sees them: every call goes to
/// that store, but it has no [`identity`](Store::identity), so an engine over it does not share
/// the live executions of the engines over the store itself (C9), as an engine of another
/// process would not.
///
/// ```
/// use idem_core::testing::Elsewhere;
/// use idem_core::{MemoryStore, Store};
/// use std::sync::Arc;
/// let store = Arc::new(MemoryStore::new());
/// assert!(store.identity().is_some());
/// assert!(Elsewhere::new(Arc::clone(&store)).identity().is_none());
/// ```
#[derive(Debug)]
pub struct Elsewhere<S>(Arc<S>, bool);

impl<S> Elsewhere<S> {
    /// `store`, seen from another process.
    pub fn new(store: Arc<S>) -> Self {
        Self(store, false)
    }

    /// `store` behind a wrapper that forwards every method but [`identity`](Store::identity),
    /// its [`process_gate`](Capabilities::process_gate) included: the misconfiguration an
    /// engine must refuse rather than let its claims go unshared.
    pub fn keeping_process_gate(store: Arc<S>) -> Self {
        Self(store, true)
    }
}

#[async_trait]
impl<S: Store + 'static> Store for Elsewhere<S> {
    async fn reserve(&self, claim: &Claim<'_>, deadline: Deadline) -> Result<Reserved, Error> {
        self.0.reserve(claim, deadline).await
    }
    async fn replace(
        &self,
        claim: &Claim<'_>,
        acquire: Acquire,
        deadline: Deadline,
    ) -> Result<Reserved, Error> {
        self.0.replace(claim, acquire, deadline).await
    }
    async fn complete(&self, completion: &Completion, deadline: Deadline) -> Result<(), Error> {
        self.0.complete(completion, deadline).await
    }
    async fn release(&self, lease: &Lease, deadline: Deadline) -> Result<(), Error> {
        self.0.release(lease, deadline).await
    }
    async fn renew(
        &self,
        lease: &Lease,
        lease_for: Duration,
        deadline: Deadline,
    ) -> Result<Timestamp, Error> {
        self.0.renew(lease, lease_for, deadline).await
    }
    async fn purge_expired(&self, limit: usize, deadline: Deadline) -> Result<usize, Error> {
        self.0.purge_expired(limit, deadline).await
    }
    async fn resolve(
        &self,
        resolution: &crate::store::Resolution,
        deadline: Deadline,
    ) -> Result<bool, Error> {
        self.0.resolve(resolution, deadline).await
    }
    async fn lookup(&self, id: &RecordId, deadline: Deadline) -> Result<Option<Record>, Error> {
        self.0.lookup(id, deadline).await
    }
    async fn read(
        &self,
        request: &Request,
        deadline: Deadline,
    ) -> Result<crate::store::Reserved, Error> {
        self.0.read(request, deadline).await
    }
    /// The store's, without its [`process_gate`](Capabilities::process_gate) unless kept:
    /// another process neither shares this one's claims nor claims in them (a store with a
    /// process gate keeps other processes off its table; a test of that opens a second store).
    fn capabilities(&self) -> Capabilities {
        let capabilities = self.0.capabilities();
        capabilities.with_process_gate(capabilities.process_gate && self.1)
    }
    fn announce(&self, id: &RecordId) {
        self.0.announce(id)
    }
    // Another process has a feed of its own on the same server.
    fn watch(&self, changes: Changes) -> bool {
        self.0.watch(changes)
    }
}
