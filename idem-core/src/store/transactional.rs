//! The capability a SQL store adds so that the engine can run an effect and its completion in
//! one of the store's transactions (C6). The protocol around it (admission, detached execution,
//! heartbeat, release, classification of a commit in doubt, events) is the engine's, written
//! once in `Idempotency::transact`; a store implements only its transaction mechanics.

use super::Store;
use crate::answer::Answer;
use crate::completion::Completion;
use crate::error::Error;
use crate::event::{Event, EventKind, Operation};
use crate::lease::Lease;
use crate::record::Record;
use crate::request::Request;
use crate::response::StoredResponse;
use crate::scope::RecordId;
use crate::store::Deadline;
use async_trait::async_trait;
use std::any::Any;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A store whose transactions can hold the effect and its completion (C6).
///
/// # Contract
///
/// [`transact`](Self::transact) reserves `request` for [`Execution::lease_for`] (the same atomic
/// step as [`Store::reserve`], answering duplicates without waiting for a writer, C5), and:
///
/// - when the reservation is answered (replay, in flight, mismatch), returns
///   [`TxEnd::Answered`] without running the effect, and gives the effect back (a
///   duplicate that waits for its original runs it if the original gives the key back, C5);
/// - when it is acquired, calls [`Execution::acquired`] at once (before the effect: that is
///   how the engine learns the lease; an end without it is refused as a misconfigured store),
///   opens a transaction, runs the effect in it, writes [`Execution::completion`] of its response in the
///   same transaction with the fenced completion statement, commits, and says what became of the
///   transaction in a [`TxEnd`]: committed, rolled back (the effect with it), or in doubt (the
///   commit was sent and its answer lost).
///
/// When [`Execution::one_commit`] says so (C15), it opens the transaction first and
/// reserves inside it, so that reservation, effect and completion commit once, together, or
/// not at all. A duplicate must still be answered at once while that transaction runs, never
/// wait on its uncommitted reservation: the store's reservation statement tells that a
/// transaction holds the record (PostgreSQL: an advisory lock taken by every reservation), or
/// the store declares a [`process_gate`](crate::store::Capabilities::process_gate) and the
/// engine keeps duplicates away. A store that can do neither (or was not opened for it)
/// refuses the mode before anything runs, with a [`StoreErrorKind::Misconfigured`](
/// crate::StoreErrorKind::Misconfigured) error.
///
/// It never releases, retries, screens or decides: the engine does, from the [`TxEnd`]. Store
/// calls that it makes on its own connections go through [`Execution::bounded`], so that they
/// have the engine's deadline and emit its events.
#[async_trait]
pub trait Transactional: Store {
    /// The effect as this store runs it inside its transaction (a closure given the store's
    /// transaction and the lease).
    type Effect<E: Send + 'static>: Send + 'static;

    /// Whether the engine may renew the lease from another connection while the effect's
    /// transaction is open (a renewal must neither wait for that transaction nor make it fail).
    fn renews_during_transaction(&self) -> bool;

    /// Reserve, then effect, completion and commit in one transaction (see the contract).
    async fn transact<E: Send + 'static>(
        &self,
        request: &Request,
        effect: Self::Effect<E>,
        execution: Execution,
    ) -> Result<TxEnd<E, Self::Effect<E>>, Error>;

    /// The effect and the completion of `lease`, which the caller already holds (the guard
    /// style: a handler under the HTTP layer), in one transaction: the acquired half of
    /// [`transact`](Self::transact). Opens a transaction, runs the effect in it, writes
    /// [`Execution::completion`] of its response with the fenced completion statement, commits,
    /// and says what became of the transaction. `Err` only when no transaction began (nothing
    /// ran). It never releases or decides: the engine does, from the [`TxEnd`]
    /// (`Idempotency::complete_transaction`).
    async fn complete_in_transaction<E: Send + 'static>(
        &self,
        lease: &Lease,
        effect: Self::Effect<E>,
        execution: Execution,
    ) -> Result<TxEnd<E>, Error>;

    /// Reads the record once no transaction holds it, waiting at most `wait` for one that does:
    /// what tells a commit in doubt from a rolled-back one. That includes a one-commit
    /// transaction (C15) whose reservation nobody else sees yet: "no record" must mean it
    /// rolled back, not that it is still open. The default reads it at once (right for a store
    /// whose commits are never in doubt).
    async fn settled(&self, id: &RecordId, wait: Duration) -> Result<Option<Record>, Error> {
        let _ = wait;
        self.lookup(id, Deadline::default()).await
    }
}

/// How a transactional execution ended: answered without running the effect, or what became
/// of the effect's transaction. `F` is the effect given back with an answer: only
/// [`Transactional::transact`] reserves, so only it answers (for
/// [`Transactional::complete_in_transaction`], `F` is [`Infallible`]).
#[must_use]
pub enum TxEnd<E, F = Infallible> {
    /// Answered without running the effect (not yet screened by the engine), which is given
    /// back.
    Answered(Answer, F),
    /// Committed with this completion: the effect happened and its answer is stored.
    Committed(Completion),
    /// The effect returned its error; the transaction rolled back, nothing happened.
    EffectFailed(E),
    /// A store failure before the commit took effect (beginning the transaction, writing the
    /// completion, including [`Error::LeaseLost`], a refused commit): rolled back.
    RolledBack(Error),
    /// The commit was sent and its answer lost: the effect and the completion committed
    /// together, or neither did.
    InDoubt {
        /// The completion the transaction wrote.
        completion: Completion,
        /// What cut the answer off.
        error: Error,
    },
    /// The effect panicked; the transaction rolled back. The panic resumes in the caller.
    Panicked(Box<dyn Any + Send>),
    /// The effect did not reach its completion within the store's deadline and was dropped
    /// before any COMMIT: its transaction rolled back, but what it did outside the database (a
    /// call to a payment provider) is unknown. The key is kept (C8): the engine stores the 500
    /// of an unknown outcome for it, and the caller gets [`RunError::InDoubt`](
    /// crate::RunError::InDoubt).
    Abandoned(Error),
    /// The effect ended the transaction itself with a COMMIT (a misuse the store saw): what it
    /// wrote is committed without its completion, and with one commit the reservation too. It
    /// may have happened, so the key is kept (C8): the engine stores the 500 of an unknown
    /// outcome, and the caller gets [`RunError::InDoubt`](crate::RunError::InDoubt).
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

/// The engine's side of one transactional execution, handed to [`Transactional::transact`].
/// Only the engine makes one.
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
    fn store_timeout(&self) -> Duration;
    fn acquired(&self, lease: Lease) -> (Lease, Box<dyn Any + Send>);
    /// Reports the acquisition (an application's observer runs: it may panic).
    fn report_acquired(&self, lease: &Lease);
    fn completion(&self, lease: &Lease, response: StoredResponse) -> Completion;
    fn emit(&self, event: Event<'_>);
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

    /// Whether this execution makes one commit instead of two (C15). If so, the store opens its
    /// transaction first and reserves inside it, with the statement that keeps duplicates from
    /// waiting on the uncommitted reservation; the engine then gives nothing back by itself
    /// (a rollback leaves nothing to give back).
    pub fn one_commit(&self) -> bool {
        self.inner.hooks.one_commit()
    }

    /// How long the reservation holds (the policy's lease).
    pub fn lease_for(&self) -> Duration {
        self.inner.hooks.lease_for()
    }

    /// The engine's deadline for one store call ([`Policy::store_timeout`](
    /// crate::Policy::store_timeout)): the longest the store may wait for its own resources
    /// (a connection, the writer) before it answers unavailable (C13).
    pub fn store_timeout(&self) -> Duration {
        self.inner.hooks.store_timeout()
    }

    /// Call once the reservation is written, before the effect: the engine registers the live
    /// lease (so that duplicates in this process are answered in flight without the store) and
    /// starts its heartbeat where [`Transactional::renews_during_transaction`]. Returns the
    /// lease to run the effect under.
    pub fn acquired(&self, lease: Lease) -> Lease {
        let (lease, held) = self.inner.hooks.acquired(lease);
        *self
            .inner
            .acquired
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(held);
        // After the lease is registered: an observer that panics here ends an execution the
        // engine knows, and concludes.
        self.inner.hooks.report_acquired(&lease);
        lease
    }

    /// The completion of `lease` with the effect's `response`, as it will be stored and
    /// replayed: headers filtered by the policy, validated, encoded; a response that cannot be
    /// stored becomes a stored 500 (C7, C8).
    pub fn completion(&self, lease: &Lease, response: StoredResponse) -> Completion {
        self.inner.hooks.completion(lease, response)
    }

    /// Runs one store call of `operation` about `id` within the engine's deadline
    /// ([`Policy::store_timeout`](crate::Policy::store_timeout)): `call` gets the [`Deadline`]
    /// to pass to the store; past it, the call is dropped (its connection with it) and the store
    /// is unavailable (C13). Emits the call's event.
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
        let started = Instant::now();
        let deadline = Deadline::after(self.inner.hooks.store_timeout());
        let result = deadline.bound(operation, call(deadline)).await;
        let event = Event::new(EventKind::StoreCall)
            .of(operation)
            .about(id)
            .took(started.elapsed());
        match &result {
            Ok(_) => self.inner.hooks.emit(event),
            Err(error) => self.inner.hooks.emit(event.failed(error)),
        }
        result
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
