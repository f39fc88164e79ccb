//! For store writers: the [`Store`] trait, its contract and what it takes. Applications use
//! the crate root ([`Idempotency`](crate::Idempotency), [`Request`], [`Begin`], [`Answer`](crate::Answer)).

pub use crate::changes::{digest_from_hex, digest_to_hex, Changes};
pub use crate::clock::{duration_millis, timestamp_millis};
pub use crate::completion::Completion;
pub use crate::deadline::Deadline;
pub use crate::decision::{check_fence, decide, Decision};
pub use crate::doubt::{Doubt, DoubtCause};
pub use crate::heartbeat_thread::on_heartbeat_thread;
pub use crate::lease::Acquire;
pub use crate::lease::Lease;
pub use crate::record::{Record, RecordState};
pub use crate::reservation::{
    BlockingSteps, Claim, Reservation, Reserved, Steps, BUSY_RETRY_AFTER,
};
pub use crate::resolution::Resolution;
pub use crate::trail::{Decided, Reconciliation};
mod transactional;

pub use crate::unique::{existing_row, unresolved_insert_or_fetch};
pub use crate::unwind::CatchUnwind;
/// Re-exported so that stores implement [`Store`] with the same macro version.
pub use async_trait::async_trait;
pub(crate) use transactional::Hooks;
pub use transactional::{Execution, Transactional, TxEnd};

use crate::begin::Begin;
use crate::clock::Timestamp;
use crate::error::Error;
use crate::request::Request;
use crate::scope::RecordId;
use std::sync::Arc;
use std::time::Duration;

/// Where idempotency records live, keyed by [`RecordId`] (keep its parts in separate columns,
/// or use [`RecordId::digest`]). [`Idempotency`](crate::Idempotency) calls it.
///
/// # Contract
///
/// The conformance suite (`idem_core::testing`) checks these (C1..C17: docs/state-machine.md):
///
/// 1. **One clock** (C11): every `now` comes from the server, or from an injectable
///    [`Clock`](crate::Clock) for local stores. A record whose deadline is `<= now` has expired.
/// 2. **`reserve` and `replace` are one atomic step each, and never decide or loop** (C4,
///    C16): each reports a [`Reserved`]; the engine ([`Reservation`]) takes the next step.
///    `reserve` inserts an in-progress record carrying [`Claim::token`], due `now + lease_for`,
///    where there is none; else it reports the record, expired or not (one that does not
///    decode is [`Error::CorruptRecord`], never absent), with its response only if it is
///    under the claim's fingerprint or its alternative (C3: the request's, replayed from this
///    step; never a step under the alternative). `replace` writes the same only if the
///    record still carries [`Acquire::replaces`], in the state it says, and is still expired
///    at `now` (a late completion or a renewal moves the deadline). Of N concurrent callers
///    on one id exactly one acquires. Neither step waits for a running holder, nor for another
///    writer of the store (C5). A claim that [expects a fresh key](Claim::expects_fresh) may
///    be given the insert alone: [`Reserved::Lost`] where it wrote nothing.
/// 3. **`complete`, `release` and `renew` are fenced** ([`check_fence`], C6): they act only if
///    the record still carries the token and is in progress, else [`Error::LeaseLost`].
///    `complete` stores [`Completion::encoded`] until `now + retain_for` (C7, C10); `release`
///    deletes the record (C8); `renew` moves the deadline to `now + lease_for` (C9).
/// 4. **Expired records behave as absent** (C10). `purge_expired` deletes at most `limit` of
///    them per call and returns how many, without blocking live traffic for long.
/// 5. **Errors are errors** (C13): a backend failure is [`Error::Store`], never a made-up
///    outcome; an error returned before the write leaves nothing written.
/// 6. **Records in doubt are marked.** `complete` keeps [`Completion::doubt`] beside the
///    answer, or clears any mark when it has none; a takeover or a start over clears it too.
/// 7. **Records in doubt are decided fenced** (docs/state-machine.md, "Records in doubt").
///    `resolve` applies a [`Resolution`] only if the record is completed, live at `now`,
///    carries [`Resolution::token`] and exactly the mark [`Resolution::read_doubt`]: in one
///    atomic step it writes what [`Resolution::decided`] says and keeps [`Resolution::entry`]
///    in the record's audit trail. Otherwise it writes nothing, no entry either: of two
///    deciders that read one mark, one wins. Purging deletes expired audit entries too.
/// 8. **One record can be read.** `lookup` reads one record as stored, expired or not, and
///    writes nothing. Operators' other reads are idem-ops' `Operator` trait, not the engine's.
///
/// A SQL store also writes a [`Completion`] inside the caller's transaction, so the effect and
/// the completion commit together (C6): a method of its own, not of this trait.
///
/// # Example
///
/// ```
/// use idem_core::store::{Deadline, Reservation, Reserved};
/// use idem_core::{Idempotency, MemoryStore, Request, Store};
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
/// let idem = Idempotency::new(MemoryStore::new());
/// let store = idem.store();
/// let request = Request::builder("acct_1", "POST", "/charges").key(Some("k1")).body(b"100").build()?;
/// let reservation = Reservation::new(&request, Duration::from_secs(60));
/// let deadline = Deadline::default();
/// let Reserved::Written { until } = store.reserve(reservation.claim(), deadline).await? else { panic!() };
/// let Reserved::Found { record, .. } = store.reserve(reservation.claim(), deadline).await? else { panic!() };
/// assert_eq!(record.token, reservation.claim().token());
/// assert_eq!(record.deadline(), until);
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Store: Send + Sync {
    /// One reservation step: a fresh record, or the record there is (rule 2).
    async fn reserve(&self, claim: &Claim<'_>, deadline: Deadline) -> Result<Reserved, Error>;

    /// The compare-and-set of a takeover or a start over, as `acquire` says (rule 2).
    async fn replace(
        &self,
        claim: &Claim<'_>,
        acquire: Acquire,
        deadline: Deadline,
    ) -> Result<Reserved, Error>;

    /// Completes the record with the completion's response, fenced (rule 3).
    async fn complete(&self, completion: &Completion, deadline: Deadline) -> Result<(), Error>;

    /// Deletes the reservation, fenced, so that a retry can run (rule 3).
    async fn release(&self, lease: &Lease, deadline: Deadline) -> Result<(), Error>;

    /// Extends the lease, fenced; returns the new deadline (rule 3).
    async fn renew(
        &self,
        lease: &Lease,
        lease_for: Duration,
        deadline: Deadline,
    ) -> Result<Timestamp, Error>;

    /// Deletes at most `limit` expired records; returns how many (rule 4).
    async fn purge_expired(&self, limit: usize, deadline: Deadline) -> Result<usize, Error>;

    /// Applies a decision about a record in doubt, fenced; returns whether it did (rule 7).
    async fn resolve(&self, resolution: &Resolution, deadline: Deadline) -> Result<bool, Error>;

    /// Reads the record as stored (rule 8).
    async fn lookup(&self, id: &RecordId, deadline: Deadline) -> Result<Option<Record>, Error>;

    /// Reads the request's record as [`reserve`](Self::reserve) reports it, writing nothing
    /// and waiting for no writer (rule 8): `Found` (the response as `reserve` fetches it), or
    /// `Lost` when there is none. Asked first where [`Capabilities::read_first`], and by a
    /// [`Capabilities::process_gate`] store's claims. Default: `Lost`.
    async fn read(&self, request: &Request, deadline: Deadline) -> Result<Reserved, Error> {
        let _ = (request, deadline);
        Ok(Reserved::Lost)
    }

    /// A number that moves whenever the store may no longer hold a commit it acknowledged
    /// before: it opened a new connection (a restart, a failover to a standby the last commits
    /// had not reached). The engine's [`ReplayCache`](crate::ReplayCache) is emptied when it
    /// moves. Default `None`: unknown, and nothing is cached.
    fn generation(&self) -> Option<u64> {
        None
    }

    /// What this store does beyond the contract's core (default: [`Capabilities::default`]).
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// One number for a store and its clones: their engines share running executions. Default
    /// `None`.
    fn identity(&self) -> Option<usize> {
        None
    }

    /// Tells waiters in other processes that record `id` was completed or released (C5); only
    /// with [`Capabilities::change_feed`]. Returns at once, sending the [`RecordId::digest`] on a
    /// task of its own (PostgreSQL `NOTIFY`, Redis `PUBLISH`). Default: nothing.
    fn announce(&self, id: &RecordId) {
        let _ = id;
    }

    /// Delivers other processes' [`announce`](Self::announce)ments to `changes` until it
    /// [`is_closed`](Changes::is_closed), across connection faults; returns whether it has a
    /// feed. Called once per store and process, in a Tokio runtime. Default: no feed.
    fn watch(&self, changes: Changes) -> bool {
        let _ = changes;
        false
    }
}

/// What a store declares about itself.
///
/// ```
/// use idem_core::store::Capabilities;
/// assert!(!Capabilities::default().server_ttl);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Capabilities {
    /// Whether the server deletes expired records by itself (C10); else call `purge_expired`.
    pub server_ttl: bool,
    /// Whether [`Store::announce`] tells other processes anything and [`Store::watch`] has a feed.
    pub change_feed: bool,
    /// Whether this process alone writes the records (SQLite opened for one commit, C15): a
    /// reservation first claims its record in this process, and a claim that meets another is
    /// answered by [`Store::read`]. Needs an [`identity`](Store::identity), else refused.
    pub process_gate: bool,
    /// Whether [`Store::read`] costs less than [`Store::reserve`]: while most of an engine's
    /// recent reservations were answers (replays, in flight, mismatches: three in four to
    /// start, three in five to stop), its reservations read first, and write only when the
    /// read answers nothing (a fresh or an expired record).
    pub read_first: bool,
}

impl Capabilities {
    /// Capabilities with [`server_ttl`](Self::server_ttl).
    pub fn with_server_ttl(mut self, server_ttl: bool) -> Self {
        self.server_ttl = server_ttl;
        self
    }

    /// Capabilities with [`change_feed`](Self::change_feed).
    pub fn with_change_feed(mut self, change_feed: bool) -> Self {
        self.change_feed = change_feed;
        self
    }

    /// Capabilities with [`process_gate`](Self::process_gate).
    pub fn with_process_gate(mut self, process_gate: bool) -> Self {
        self.process_gate = process_gate;
        self
    }

    /// Capabilities with [`read_first`](Self::read_first).
    pub fn with_read_first(mut self, read_first: bool) -> Self {
        self.read_first = read_first;
        self
    }
}

/// Conveniences over any [`Store`], built from its steps.
#[async_trait]
pub trait StoreExt: Store {
    /// A whole reservation ([`Reservation::run`]) without the engine, for tools and tests.
    ///
    /// ```
    /// use idem_core::store::{Deadline, StoreExt};
    /// use idem_core::{Begin, MemoryStore, Request};
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
    /// let store = MemoryStore::new();
    /// let request = Request::builder("acct_1", "POST", "/charges").key(Some("k1")).body(b"1").build()?;
    /// assert!(matches!(store.reservation(&request, Duration::from_secs(60), Deadline::default()).await?, Begin::Acquired(_)));
    /// assert!(matches!(store.reservation(&request, Duration::from_secs(60), Deadline::default()).await?, Begin::Answered(_)));
    /// # Ok(()) }
    /// ```
    async fn reservation(
        &self,
        request: &Request,
        lease_for: Duration,
        deadline: Deadline,
    ) -> Result<Begin, Error> {
        Reservation::new(request, lease_for)
            .run(&mut (self, deadline))
            .await
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

/// A store runs a reservation's steps one call each, each within the deadline.
#[async_trait]
impl<S: Store + ?Sized> Steps for (&S, Deadline) {
    fn reads_first(&self) -> bool {
        self.0.capabilities().read_first
    }
    async fn read(&mut self, claim: &Claim<'_>) -> Result<Reserved, Error> {
        self.0.read(claim.request(), self.1).await
    }
    async fn reserve(&mut self, claim: &Claim<'_>) -> Result<Reserved, Error> {
        self.0.reserve(claim, self.1).await
    }
    async fn replace(&mut self, claim: &Claim<'_>, acquire: Acquire) -> Result<Reserved, Error> {
        self.0.replace(claim, acquire, self.1).await
    }
}

/// Forwards every method of [`Store`] through `Arc<S>`, `Box<S>`, `&S`. The denied
/// `clippy::missing_trait_methods` keeps a new default method from dropping a store's own.
macro_rules! forward_store {
    ($($pointer:ty),+) => {$(
        #[deny(clippy::missing_trait_methods)]
        #[async_trait]
        impl<S: Store + ?Sized> Store for $pointer {
            async fn reserve(&self, claim: &Claim<'_>, deadline: Deadline) -> Result<Reserved, Error> {
                (**self).reserve(claim, deadline).await
            }
            async fn replace(&self, claim: &Claim<'_>, acquire: Acquire, deadline: Deadline) -> Result<Reserved, Error> {
                (**self).replace(claim, acquire, deadline).await
            }
            async fn complete(&self, completion: &Completion, deadline: Deadline) -> Result<(), Error> {
                (**self).complete(completion, deadline).await
            }
            async fn release(&self, lease: &Lease, deadline: Deadline) -> Result<(), Error> {
                (**self).release(lease, deadline).await
            }
            async fn renew(&self, lease: &Lease, lease_for: Duration, deadline: Deadline) -> Result<Timestamp, Error> {
                (**self).renew(lease, lease_for, deadline).await
            }
            async fn purge_expired(&self, limit: usize, deadline: Deadline) -> Result<usize, Error> {
                (**self).purge_expired(limit, deadline).await
            }
            async fn resolve(&self, resolution: &Resolution, deadline: Deadline) -> Result<bool, Error> {
                (**self).resolve(resolution, deadline).await
            }
            async fn lookup(&self, id: &RecordId, deadline: Deadline) -> Result<Option<Record>, Error> {
                (**self).lookup(id, deadline).await
            }
            async fn read(&self, request: &Request, deadline: Deadline) -> Result<Reserved, Error> {
                (**self).read(request, deadline).await
            }
            fn generation(&self) -> Option<u64> {
                (**self).generation()
            }
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            fn identity(&self) -> Option<usize> {
                (**self).identity()
            }
            fn announce(&self, id: &RecordId) {
                (**self).announce(id)
            }
            fn watch(&self, changes: Changes) -> bool {
                (**self).watch(changes)
            }
        }

    )+};
}

forward_store!(Arc<S>, Box<S>, &S);
