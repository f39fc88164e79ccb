//! The knobs of the protocol: lease, retention, body limit, in-flight wait, stored headers.

use crate::error::{Error, Field};
use crate::response::{is_always_stored, is_never_stored, StoredResponse};
use std::time::Duration;

/// The protocol's settings.
///
/// ```
/// use idem_core::Policy;
/// use std::time::Duration;
/// let policy = Policy::default().lease(Duration::from_secs(30)).store_header("x-request-id");
/// let policy = policy.retention(Duration::from_secs(48 * 3600));
/// assert_eq!(policy.max_body_bytes, 1024 * 1024);
/// policy.validate()?;
/// # Ok::<(), idem_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// How long a reservation holds before another attempt may take it over (C9). Default 60 s.
    pub lease: Duration,
    /// How long a completed response is replayed (C10). Default 24 h.
    pub retention: Duration,
    /// The largest request body accepted (C12). Default 1 MiB.
    pub max_body_bytes: usize,
    /// How long a duplicate of a running request waits for the original's end (C5). `None`
    /// (default): it is answered in flight at once. `Some(max)`: it waits up to `max` plus one
    /// read, holding no connection or thread, then replays, runs if the key was given back, or
    /// is answered in flight. Woken at once in this process, from others by
    /// [`Store::watch`](crate::Store::watch) or reads at a growing interval. Only a waiting
    /// policy announces its ends, so the original's endpoint must use one too.
    ///
    /// ```
    /// let policy = idem_core::Policy::default().wait_in_flight(std::time::Duration::from_secs(2));
    /// assert!(policy.wait_in_flight.is_some() && policy.validate().is_ok());
    /// ```
    pub wait_in_flight: Option<Duration>,
    /// Lower-case names of response headers to store (C7, [`stores_header`](Self::stores_header)).
    /// Default: `etag`, `last-modified`, `cache-control` (a problem's `no-store`, the engine's
    /// stored 500s' included, travels with it on every replay).
    pub stored_headers: Vec<String>,
    /// How many expired records one purge batch deletes at most (C10). Default 1000.
    pub purge_batch: usize,
    /// The store budget of one request (C13), counted across every store step (reservation,
    /// the effect's transaction, completion, retries, rollback); the handler's own time is the
    /// lease's. Spent before the effect: 503; after it: "outcome unknown" (C8) while the
    /// completion keeps trying on its own task. A request may carry its own
    /// ([`Request::with_store_budget`](crate::Request::with_store_budget)). Default 5 s.
    pub store_timeout: Duration,
    /// Statuses of a request refused before it executed (C8): sent, not stored, key released
    /// for a corrected retry. Default [`DEFAULT_REFUSALS`](Self::DEFAULT_REFUSALS).
    pub refusals: Vec<u16>,
    /// How many duplicates may wait at once in this process; the rest are answered in flight.
    /// Default 1024.
    pub max_waiters: usize,
    /// Whether a transactional execution makes one commit per fresh key instead of two (C15),
    /// unless its request says otherwise ([`Request::with_one_commit`](
    /// crate::Request::with_one_commit)). Default `false`. **Only for an effect entirely in the
    /// store's database**: a lost transaction leaves nothing, so a retry would repeat an
    /// outside call (a card network, an email). The store must support it.
    ///
    /// ```
    /// assert!(idem_core::Policy::default().one_commit(true).one_commit);
    /// ```
    pub one_commit: bool,
    /// How long each [`Reconciliation`](crate::trail::Reconciliation) is kept. Default 90 days.
    pub audit_retention: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(60),
            retention: Duration::from_secs(24 * 3600),
            max_body_bytes: Policy::DEFAULT_MAX_BODY_BYTES,
            wait_in_flight: None,
            stored_headers: ["etag", "last-modified", "cache-control"]
                .map(String::from)
                .to_vec(),
            purge_batch: 1000,
            store_timeout: Duration::from_secs(5),
            refusals: Policy::DEFAULT_REFUSALS.to_vec(),
            max_waiters: 1024,
            one_commit: false,
            audit_retention: Duration::from_secs(90 * 24 * 3600),
        }
    }
}

impl Policy {
    /// The default body limit: 1 MiB.
    pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;

    /// The default [`refusals`](Self::refusals). **A handler that answers one of these after
    /// its effect ran** (a 404 after the charge) must return [`Reply::Executed`](
    /// crate::Reply::Executed) or drop the status, else a retry runs the effect again.
    pub const DEFAULT_REFUSALS: [u16; 13] = [
        400, 401, 403, 404, 405, 406, 411, 413, 414, 415, 422, 429, 431,
    ];

    /// Sets the lease.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets [`audit_retention`](Self::audit_retention).
    pub fn audit_retention(mut self, keep: Duration) -> Self {
        self.audit_retention = keep;
        self
    }

    /// Sets the retention.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Sets the body limit.
    pub fn max_body_bytes(mut self, limit: usize) -> Self {
        self.max_body_bytes = limit;
        self
    }

    /// Sets [`wait_in_flight`](Self::wait_in_flight) to `Some(max)`.
    pub fn wait_in_flight(mut self, max: Duration) -> Self {
        self.wait_in_flight = Some(max);
        self
    }

    /// Sets [`max_waiters`](Self::max_waiters).
    pub fn max_waiters(mut self, waiters: usize) -> Self {
        self.max_waiters = waiters;
        self
    }

    /// Sets [`one_commit`](Self::one_commit).
    pub fn one_commit(mut self, one: bool) -> Self {
        self.one_commit = one;
        self
    }

    /// Adds a header to the stored allow-list.
    pub fn store_header(mut self, name: &str) -> Self {
        self.stored_headers.push(name.to_ascii_lowercase());
        self
    }

    /// Sets the purge batch size.
    pub fn purge_batch(mut self, batch: usize) -> Self {
        self.purge_batch = batch;
        self
    }

    /// Sets [`store_timeout`](Self::store_timeout).
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.store_timeout = timeout;
        self
    }

    /// Sets [`refusals`](Self::refusals): the statuses released instead of stored.
    ///
    /// ```
    /// use idem_core::Policy;
    /// // An API whose 404 can follow an effect: stored like any other answer.
    /// let policy = Policy::default().refusals(Policy::DEFAULT_REFUSALS.into_iter().filter(|&s| s != 404));
    /// assert!(policy.is_refusal(400) && !policy.is_refusal(404) && !policy.is_refusal(402));
    /// ```
    pub fn refusals(mut self, statuses: impl IntoIterator<Item = u16>) -> Self {
        self.refusals = statuses.into_iter().collect();
        self
    }

    /// Whether a response with `status` is a refusal ([`refusals`](Self::refusals)).
    pub fn is_refusal(&self, status: u16) -> bool {
        self.refusals.contains(&status)
    }

    /// Whether a header is stored: [`is_always_stored`](crate::is_always_stored) or on the
    /// allow-list, and not [`is_never_stored`](crate::is_never_stored).
    pub fn stores_header(&self, name: &str) -> bool {
        !is_never_stored(name) && self.allows_header(name)
    }

    /// [`stores_header`](Self::stores_header) after [`StoredResponse::retain_headers`]' check.
    pub(crate) fn allows_header(&self, name: &str) -> bool {
        is_always_stored(name)
            || self
                .stored_headers
                .iter()
                .any(|h| h.eq_ignore_ascii_case(name))
    }

    /// The response as stored (C7): the headers [`stores_header`](Self::stores_header) accepts,
    /// names lower-cased; validated (the engine stores a 500 for an invalid one, C8).
    ///
    /// ```
    /// use idem_core::{Policy, StoredResponse};
    /// let gz = StoredResponse::new(200, vec![0x1f, 0x8b]).with_header("Content-Encoding", "gzip");
    /// let gz = gz.with_header("Set-Cookie", "s=1").with_header("X-Trace", "t");
    /// let stored = Policy::default().prepare(gz)?;
    /// assert_eq!(stored.headers, vec![("content-encoding".to_owned(), b"gzip".to_vec())]);
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn prepare(&self, mut response: StoredResponse) -> Result<StoredResponse, Error> {
        response.retain_headers(|name| self.allows_header(name));
        response.validate()?;
        Ok(response)
    }

    /// The longest [`wait_in_flight`](Self::wait_in_flight) accepted: a minute.
    pub const MAX_WAIT: Duration = Duration::from_secs(60);

    /// The longest lease accepted: a day (a longer handler renews its lease).
    pub const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);
    /// The longest retention accepted: ten years.
    pub const MAX_RETENTION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

    /// Checks the bounds: lease and store timeout 1 ms ..= [`MAX_LEASE`](Self::MAX_LEASE),
    /// retention 1 ms (audit retention 1 s) ..= [`MAX_RETENTION`](Self::MAX_RETENTION), wait
    /// 1 ms ..= [`MAX_WAIT`](Self::MAX_WAIT), body limit and purge batch above zero.
    ///
    /// ```
    /// use idem_core::Policy;
    /// use std::time::Duration;
    /// assert!(Policy::default().lease(Duration::MAX).validate().is_err());
    /// assert!(Policy::default().lease(Duration::ZERO).validate().is_err());
    /// assert!(Policy::default().audit_retention(Duration::ZERO).validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), Error> {
        let ms = Duration::from_millis(1);
        let wait = self.wait_in_flight.unwrap_or(ms);
        let reason = if !(ms..=Self::MAX_LEASE).contains(&self.lease) {
            "lease must be between 1 ms and a day"
        } else if !(ms..=Self::MAX_RETENTION).contains(&self.retention) {
            "retention must be between 1 ms and ten years"
        } else if !(Duration::from_secs(1)..=Self::MAX_RETENTION).contains(&self.audit_retention) {
            // An entry kept no time at all would be a decision applied with no trail.
            "audit_retention must be between 1 s and ten years"
        } else if self.max_body_bytes == 0 {
            "max_body_bytes must be above 0"
        } else if self.purge_batch == 0 {
            "purge_batch must be above 0"
        } else if !(ms..=Self::MAX_WAIT).contains(&wait) {
            "the in-flight wait must be between 1 ms and a minute"
        } else if !(ms..=Self::MAX_LEASE).contains(&self.store_timeout) {
            "store_timeout must be between 1 ms and a day"
        } else {
            return Ok(());
        };
        Err(Error::invalid(Field::Config, reason))
    }
}
