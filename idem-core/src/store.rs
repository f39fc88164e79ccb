//! The `Store` trait that every backend implements.

use crate::begin::{Begin, Lease};
use crate::clock::Timestamp;
use crate::error::Error;
use crate::record::Record;
use crate::request::Request;
use crate::response::StoredResponse;
use crate::scope::RecordId;
use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;

/// Where idempotency records live.
///
/// Applications call [`Idempotency`](crate::Idempotency), which calls a store. A store holds
/// records keyed by [`RecordId`] (consumer, route, key: keep them as separate columns or use
/// [`RecordId::digest`]) and applies the core's decisions atomically.
///
/// # Contract
///
/// A store that passes [`testing`](crate::testing)'s conformance suite keeps these rules
/// (DESIGN §2 names them C1..C14):
///
/// 1. **One clock.** Every `now` comes from one authority: the database server's clock for
///    servers, an injectable [`Clock`](crate::Clock) for local stores (C11). Deadlines are
///    exclusive: a record whose deadline is `<= now` has expired.
/// 2. **`reserve` decides atomically.** Read the current record for `request.id` (decode it; a
///    record that does not decode is [`Error::CorruptRecord`], never "absent"), call
///    [`decide`](crate::decide) with it, the request's fingerprint and `now`; its
///    [`next_step`](crate::Decision::next_step) is either the answer (return it, nothing is
///    written) or how to acquire: then write an in-progress record
///    with a fresh [`FencingToken`](crate::FencingToken) (use [`Lease::new`]) and the deadline
///    `now + lease_for`, replacing the old record only if it is still the one the decision
///    saw: it carries [`Acquire::replaces`](crate::Acquire::replaces) and is still expired at
///    `now` (a late completion or a renewal by the old holder keeps the token but moves the
///    deadline, and must not be overwritten). The read and the write are one atomic
///    step (a transaction holding the write lock, or compare-and-set statements that re-read
///    when they lose, or a Lua script...): of N concurrent callers on one id exactly one
///    acquires (C4). A store that runs the decision
///    elsewhere (in SQL or Lua) must give the same answers; the suite checks that it does.
///    `reserve` never waits for a running holder (C5). It returns the decision as a value:
///    [`Begin::Replay`], [`Begin::InFlight`] (`retry_after` = time left on the lease) and
///    [`Begin::Mismatch`] are not errors.
/// 3. **`complete`, `release` and `renew` are fenced** with
///    [`check_fence`](crate::check_fence): they act only if the record still carries the
///    lease's token and is in progress, else [`Error::LeaseLost`] and nothing changes (C6).
///    `complete` stores the response (encode it with [`StoredResponse::encode`]) with the
///    deadline `now + retain_for` (C7, C10); `release` deletes the record (C8); `renew` moves
///    the lease's deadline to `now + lease_for` and returns it (C9).
/// 4. **Expired records behave as absent** (C10) and `purge_expired` deletes at most `limit`
///    of them per call (completed past retention, in progress past the lease), returning how
///    many it deleted, without blocking live traffic for long.
/// 5. **Errors are errors.** A backend failure is [`Error::StoreUnavailable`] (C13), never a
///    made-up outcome; nothing is written when an error is returned before the write.
///
/// A SQL store additionally offers completion inside the caller's transaction, so the effect
/// and the completion commit together (C6); that method is the store's own, not this trait's.
///
/// # Example
///
/// ```
/// use idem_core::{Begin, MemoryStore, Request, Store, StoredResponse};
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_core::Error> {
/// let store = MemoryStore::new();
/// let request = Request::builder("acct_1", "POST", "/charges").key(Some("k1")).body(b"100").build()?;
/// let Begin::Acquired(lease) = store.reserve(&request, Duration::from_secs(60)).await? else {
///     unreachable!("a fresh key is acquired")
/// };
/// store.complete(&lease, &StoredResponse::new(201, "ok"), Duration::from_secs(3600)).await?;
/// let again = store.reserve(&request, Duration::from_secs(60)).await?;
/// assert_eq!(again, Begin::Replay(StoredResponse::new(201, "ok")));
/// # Ok(())
/// # }
/// ```
#[async_trait]
pub trait Store: Send + Sync {
    /// Reserves `request.id` for `lease_for`, or says why not (rule 2).
    async fn reserve(&self, request: &Request, lease_for: Duration) -> Result<Begin, Error>;

    /// Stores `response` and marks the record completed for `retain_for`, if `lease` still holds
    /// (rule 3).
    async fn complete(
        &self,
        lease: &Lease,
        response: &StoredResponse,
        retain_for: Duration,
    ) -> Result<(), Error>;

    /// Deletes the reservation, if `lease` still holds, so that a retry can run (rule 3).
    async fn release(&self, lease: &Lease) -> Result<(), Error>;

    /// Extends the lease to `now + lease_for`, if it still holds; returns the new deadline (rule 3).
    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<Timestamp, Error>;

    /// Deletes at most `limit` expired records; returns how many (rule 4).
    async fn purge_expired(&self, limit: usize) -> Result<usize, Error>;

    /// Reads the record for inspection, expired or not. Does not change anything.
    async fn lookup(&self, id: &RecordId) -> Result<Option<Record>, Error>;
}

#[async_trait]
impl<S: Store + ?Sized> Store for Arc<S> {
    async fn reserve(&self, request: &Request, lease_for: Duration) -> Result<Begin, Error> {
        (**self).reserve(request, lease_for).await
    }
    async fn complete(
        &self,
        lease: &Lease,
        response: &StoredResponse,
        retain_for: Duration,
    ) -> Result<(), Error> {
        (**self).complete(lease, response, retain_for).await
    }
    async fn release(&self, lease: &Lease) -> Result<(), Error> {
        (**self).release(lease).await
    }
    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<Timestamp, Error> {
        (**self).renew(lease, lease_for).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, Error> {
        (**self).purge_expired(limit).await
    }
    async fn lookup(&self, id: &RecordId) -> Result<Option<Record>, Error> {
        (**self).lookup(id).await
    }
}
