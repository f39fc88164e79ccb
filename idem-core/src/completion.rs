//! A completion the engine prepared: what a store writes when a request completes.

use crate::budget;
use crate::deadline::Deadline;
use crate::doubt::Doubt;
use crate::error::Error;
use crate::event_kind::Operation;
use crate::fingerprint::Fingerprint;
use crate::lease::Lease;
use crate::response::StoredResponse;
use crate::scope::RecordId;
use crate::token::FencingToken;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A response ready to store for one lease (C6, C7): filtered, validated, encoded. Only
/// [`Idempotency::completion`](crate::Idempotency::completion) makes one; clones share it.
///
/// ```
/// use idem_core::{Begin, Idempotency, MemoryStore, StoredResponse};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
/// let idem = Idempotency::new(MemoryStore::new());
/// let request = idem.request("acct_1", "POST", "/charges").key(Some("k")).body(b"{}").build()?;
/// let Begin::Acquired(lease) = idem.begin(&request).await? else { unreachable!() };
/// let completion = idem.completion(&lease, StoredResponse::new(201, "ok").with_header("Set-Cookie", "s=1"));
/// assert_eq!(completion.response().header("set-cookie"), None); // never stored (C7)
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion(Arc<Parts>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Parts {
    id: RecordId,
    token: FencingToken,
    fingerprint: Fingerprint,
    response: StoredResponse,
    encoded: Vec<u8>,
    retain_for: Duration,
    doubt: Option<Vec<u8>>,
    /// The store budget of the request that took the lease (C13), if the engine took it.
    budget: budget::Shared,
}

impl Completion {
    /// Made by the engine only, from a response that passed `Policy::prepare`.
    pub(crate) fn new(
        lease: &Lease,
        response: StoredResponse,
        encoded: Vec<u8>,
        retain_for: Duration,
    ) -> Self {
        Self(Arc::new(Parts {
            id: lease.id().clone(),
            token: lease.token(),
            fingerprint: *lease.fingerprint(),
            response,
            encoded,
            retain_for,
            doubt: None,
            budget: budget::Shared(lease.budget()),
        }))
    }

    /// The same completion marked in doubt (C8; docs/state-machine.md, "Records in doubt").
    pub(crate) fn in_doubt(self, doubt: &Doubt) -> Self {
        let mut parts = Arc::unwrap_or_clone(self.0);
        let doubt = Doubt {
            token: parts.token,
            ..doubt.clone()
        };
        parts.doubt = Some(doubt.encode());
        Self(Arc::new(parts))
    }

    /// The record to complete.
    pub fn id(&self) -> &RecordId {
        &self.0.id
    }

    /// The token the record must still carry (C6).
    pub fn token(&self) -> FencingToken {
        self.0.token
    }

    /// The fingerprint of the request it answers (C3).
    pub(crate) fn fingerprint(&self) -> Fingerprint {
        self.0.fingerprint
    }

    /// The response as stored: what the first caller sends, and every replay.
    pub fn response(&self) -> &StoredResponse {
        &self.0.response
    }

    /// The response in its stored encoding.
    pub fn encoded(&self) -> &[u8] {
        &self.0.encoded
    }

    /// The [`Doubt::encode`]d mark of an unknown outcome, or `None`. A store writes it with the
    /// completion, due for reconciliation at once (`check_at` = `now`); `None` clears any mark.
    pub fn doubt(&self) -> Option<&[u8]> {
        self.0.doubt.as_deref()
    }

    /// How long the completed record is replayed (C10).
    pub fn retain_for(&self) -> Duration {
        self.0.retain_for
    }

    /// Runs `write`, a store's write of this completion in the caller's transaction
    /// (`complete_in`), within `most` and within what is left of the store budget of the
    /// request that took the lease (C13), and counts the time it waited against that budget:
    /// the steps after it (a release, a retry) get only the rest.
    ///
    /// ```
    /// use idem_core::{Begin, Idempotency, MemoryStore, StoredResponse};
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let request = idem.request("acct_1", "POST", "/charges").key(Some("k")).body(b"{}").build()?;
    /// let Begin::Acquired(lease) = idem.begin(&request).await? else { unreachable!() };
    /// let completion = idem.completion(&lease, StoredResponse::new(201, "ok"));
    /// // A store's `complete_in`: its statement, on the caller's transaction.
    /// let written = completion.bound(Duration::from_secs(5), async { Ok(()) }).await;
    /// assert!(written.is_ok());
    /// # Ok(()) }
    /// ```
    pub async fn bound<T>(
        &self,
        most: Duration,
        write: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let budget = self.0.budget.0.as_deref();
        let left = budget.map_or(most, |budget| budget.remaining().min(most));
        let started = Instant::now();
        let result = Deadline::after(left)
            .bound(Operation::Complete, write)
            .await;
        if let Some(budget) = budget {
            budget.charge(started.elapsed());
        }
        result
    }

    /// The response, to send.
    pub fn into_response(self) -> StoredResponse {
        Arc::try_unwrap(self.0)
            .map(|parts| parts.response)
            .unwrap_or_else(|shared| shared.response.clone())
    }
}
