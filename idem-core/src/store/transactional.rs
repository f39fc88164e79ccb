//! What a SQL store adds to run an effect and its completion in one transaction (C6).

use super::Store;
use crate::answer::Answer;
use crate::budget::Budget;
use crate::completion::Completion;
use crate::error::Error;
use crate::event::{Event, Operation};
use crate::lease::Lease;
use crate::record::Record;
use crate::request::Request;
use crate::reservation::{Keep, Reservation};
use crate::response::StoredResponse;
use crate::scope::RecordId;
use crate::store::Deadline;
use async_trait::async_trait;
use std::any::Any;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// A store whose transactions can hold the effect and its completion (C6).
///
/// # Contract
///
/// [`transact`](Self::transact) reserves `request` as [`Store::reserve`] does (C5): answered,
/// it returns the effect unrun; acquired, it calls [`Execution::acquired`] (else the end is
/// refused), runs the effect in a transaction with the fenced write of
/// [`Execution::completion`], commits, and reports the [`TxEnd`]. With
/// [`Execution::one_commit`] (C15) it reserves inside the transaction (all commits once or
/// not at all), and duplicates are still answered at once: the reservation sees the holding
/// transaction (PostgreSQL: an advisory lock), or the store has a
/// [`process_gate`](crate::store::Capabilities::process_gate); else it refuses the mode
/// ([`StoreErrorKind::Misconfigured`](crate::StoreErrorKind::Misconfigured)) before anything
/// runs. It never releases, retries or decides; its store calls go through [`Execution::bounded`].
#[async_trait]
pub trait Transactional: Store {
    /// The effect: a closure given the store's transaction and the lease.
    type Effect<E: Send + 'static>: Send + 'static;

    /// Whether another connection may renew the lease while the effect's transaction is open.
    fn renews_during_transaction(&self) -> bool;

    /// Reserve, then effect, completion and commit in one transaction (see the contract).
    async fn transact<E: Send + 'static>(
        &self,
        request: &Request,
        effect: Self::Effect<E>,
        execution: Execution,
    ) -> Result<TxEnd<E, Self::Effect<E>>, Error>;

    /// The acquired half of [`transact`](Self::transact), for a `lease` the caller holds; `Err`
    /// only when no transaction began.
    async fn complete_in_transaction<E: Send + 'static>(
        &self,
        lease: &Lease,
        effect: Self::Effect<E>,
        execution: Execution,
    ) -> Result<TxEnd<E>, Error>;

    /// Reads the record once no transaction (one-commit ones included, C15) holds it, waiting
    /// at most `wait`: tells a commit in doubt from a rollback. Default: reads at once.
    async fn settled(&self, id: &RecordId, wait: Duration) -> Result<Option<Record>, Error> {
        self.lookup(id, Deadline::after(wait)).await
    }
}

/// How a transactional execution ended; `F`: the effect given back with an answer.
#[must_use]
pub enum TxEnd<E, F = Infallible> {
    /// Answered (not yet screened); the effect is given back.
    Answered(Answer, F),
    /// Committed: the effect happened and its answer is stored.
    Committed(Completion),
    /// The effect returned its error; the transaction rolled back, nothing happened.
    EffectFailed(E),
    /// A store failure before the commit ([`Error::LeaseLost`] included): rolled back.
    RolledBack(Error),
    /// The commit's answer was lost: effect and completion committed together, or neither.
    InDoubt {
        /// The completion the transaction wrote.
        completion: Completion,
        /// What cut the answer off.
        error: Error,
    },
    /// The effect panicked; the transaction rolled back. The panic resumes in the caller.
    Panicked(Box<dyn Any + Send>),
    /// The effect overran the store's deadline, dropped before COMMIT: outside effects unknown.
    /// The key keeps a 500 (C8); the caller gets [`RunError::InDoubt`](crate::RunError::InDoubt).
    Abandoned(Error),
    /// The effect issued its own COMMIT (a misuse): kept as [`Abandoned`](Self::Abandoned).
    CommittedByTheEffect(Error),
}

impl<E, F> TxEnd<E, F> {
    /// The end of an acquired execution, or the answer and the effect given back.
    ///
    /// ```
    /// use idem_core::store::TxEnd;
    /// use idem_core::Answer;
    /// let answered: TxEnd<(), &str> = TxEnd::Answered(Answer::Mismatch, "the effect");
    /// assert!(matches!(answered.acquired(), Err((Answer::Mismatch, "the effect"))));
    /// ```
    pub fn acquired(self) -> Result<TxEnd<E>, (Answer, F)> {
        Ok(match self {
            TxEnd::Answered(answer, effect) => return Err((answer, effect)),
            TxEnd::Committed(completion) => TxEnd::Committed(completion),
            TxEnd::EffectFailed(error) => TxEnd::EffectFailed(error),
            TxEnd::RolledBack(error) => TxEnd::RolledBack(error),
            TxEnd::InDoubt { completion, error } => TxEnd::InDoubt { completion, error },
            TxEnd::Panicked(panic) => TxEnd::Panicked(panic),
            TxEnd::Abandoned(error) => TxEnd::Abandoned(error),
            TxEnd::CommittedByTheEffect(error) => TxEnd::CommittedByTheEffect(error),
        })
    }
}

impl<E, F> fmt::Debug for TxEnd<E, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TxEnd::Answered(answer, _) => f.debug_tuple("Answered").field(answer).finish(),
            TxEnd::Committed(c) => f.debug_tuple("Committed").field(c).finish(),
            TxEnd::EffectFailed(_) => f.write_str("EffectFailed(..)"),
            TxEnd::RolledBack(e) => f.debug_tuple("RolledBack").field(e).finish(),
            TxEnd::InDoubt { error, .. } => {
                f.debug_struct("InDoubt").field("error", error).finish()
            }
            TxEnd::Panicked(_) => f.write_str("Panicked(..)"),
            TxEnd::Abandoned(e) => f.debug_tuple("Abandoned").field(e).finish(),
            TxEnd::CommittedByTheEffect(e) => {
                f.debug_tuple("CommittedByTheEffect").field(e).finish()
            }
        }
    }
}

/// The engine's side of one transactional execution; only the engine makes one.
#[derive(Clone)]
pub struct Execution {
    inner: Arc<Shared<dyn Hooks>>,
}

/// One allocation for the hooks and what `acquired` registered.
struct Shared<H: ?Sized> {
    acquired: Mutex<Option<Box<dyn Any + Send>>>,
    hooks: H,
}

/// What the engine does at the store's call: implemented by the engine.
pub(crate) trait Hooks: Send + Sync {
    fn one_commit(&self) -> bool;
    fn lease_for(&self) -> Duration;
    fn budget(&self) -> &Budget;
    fn acquired(&self, lease: Lease) -> (Lease, Box<dyn Any + Send>);
    /// Reports the acquisition (an application's observer runs: it may panic).
    fn report_acquired(&self, lease: &Lease);
    fn completion(&self, lease: &Lease, response: StoredResponse) -> Completion;
    fn emit(&self, event: Event<'_>);
    /// Where the execution's reservation keeps the replays it reads.
    fn keep(&self) -> Option<Keep>;
    /// Whether the execution's reservation reads first, where its steps can.
    fn reads_first(&self) -> bool;
    /// Whether its first reserve [expects a fresh key](crate::store::Claim::expects_fresh).
    fn expects_fresh(&self) -> bool;
}

impl Execution {
    pub(crate) fn new(hooks: impl Hooks + 'static) -> Self {
        Self {
            inner: Arc::new(Shared {
                acquired: Mutex::new(None),
                hooks,
            }),
        }
    }

    /// Whether this execution makes one commit (C15): then it reserves inside the transaction.
    pub fn one_commit(&self) -> bool {
        self.inner.hooks.one_commit()
    }

    /// How long the reservation holds (the policy's lease).
    pub fn lease_for(&self) -> Duration {
        self.inner.hooks.lease_for()
    }

    /// What is left of the request's [store budget](crate::Policy::store_timeout) for the next
    /// step (a COMMIT, a ROLLBACK). Once spent, drop the transaction and its connection.
    pub fn store_timeout(&self) -> Duration {
        self.inner.hooks.budget().remaining()
    }

    /// Counts `waited` against the request's store budget (C13), for a store whose steps block
    /// a thread of their own, where [`bounded`](Self::bounded) cannot time them (SQLite waiting
    /// for another process's write lock): [`store_timeout`](Self::store_timeout) is then what
    /// is left for the next step, and for the engine's steps after the transaction.
    pub fn charge(&self, waited: Duration) {
        self.inner.hooks.budget().charge(waited);
    }

    /// Call once the reservation is written, before the effect: registers the lease, starts the
    /// heartbeat if [`Transactional::renews_during_transaction`], returns the lease to use.
    pub fn acquired(&self, lease: Lease) -> Lease {
        let (lease, held) = self.inner.hooks.acquired(lease);
        *self
            .inner
            .acquired
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(held);
        // After registration: a panicking observer ends an execution the engine knows.
        self.inner.hooks.report_acquired(&lease);
        lease
    }

    /// The completion of `lease` with `response`, as `Idempotency::completion` makes it (C7, C8).
    pub fn completion(&self, lease: &Lease, response: StoredResponse) -> Completion {
        self.inner.hooks.completion(lease, response)
    }

    /// Runs one store call within the rest of the store budget, charging and reporting it (C13).
    /// The [`Deadline`] `call` gets is enforced by this call, with one timer: pass it to the
    /// store calls `call` awaits, never to a task that outlives it.
    pub async fn bounded<T, F, C>(
        &self,
        operation: Operation,
        id: &RecordId,
        call: C,
    ) -> Result<T, Error>
    where
        C: FnOnce(Deadline) -> F,
        F: Future<Output = Result<T, Error>> + Send,
    {
        let hooks = &self.inner.hooks;
        crate::store_call::spend(hooks.budget(), operation, Some(id), call, |event| {
            hooks.emit(event)
        })
        .await
    }

    /// What [`acquired`](Self::acquired) registered, taken back by the engine.
    pub(crate) fn take_acquired(&self) -> Option<Box<dyn Any + Send>> {
        self.inner
            .acquired
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

impl fmt::Debug for Execution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Execution")
            .field("lease_for", &self.lease_for())
            .finish()
    }
}

impl Reservation<'_> {
    /// This reservation run for `execution` (a [`Transactional`] store's), as the engine
    /// runs its own: reading first or expecting a fresh key as it decides
    /// ([`Capabilities::read_first`](crate::store::Capabilities::read_first),
    /// [`Claim::expects_fresh`](crate::store::Claim::expects_fresh)), and a replay it reads kept
    /// in its [`ReplayCache`](crate::ReplayCache), if it has one.
    pub fn in_execution(self, execution: &Execution) -> Self {
        let hooks = &execution.inner.hooks;
        self.keeping(hooks.keep())
            .reading_first(hooks.reads_first())
            .inserting_first(hooks.expects_fresh())
    }
}

#[async_trait]
impl<S: Transactional + ?Sized> Transactional for Arc<S> {
    type Effect<E: Send + 'static> = S::Effect<E>;

    fn renews_during_transaction(&self) -> bool {
        (**self).renews_during_transaction()
    }

    async fn transact<E: Send + 'static>(
        &self,
        request: &Request,
        effect: Self::Effect<E>,
        execution: Execution,
    ) -> Result<TxEnd<E, Self::Effect<E>>, Error> {
        (**self).transact(request, effect, execution).await
    }

    async fn complete_in_transaction<E: Send + 'static>(
        &self,
        lease: &Lease,
        effect: Self::Effect<E>,
        execution: Execution,
    ) -> Result<TxEnd<E>, Error> {
        (**self)
            .complete_in_transaction(lease, effect, execution)
            .await
    }

    async fn settled(&self, id: &RecordId, wait: Duration) -> Result<Option<Record>, Error> {
        (**self).settled(id, wait).await
    }
}
