//! The leases this process holds: a duplicate is answered in flight (or mismatch) from memory
//! (C5), and never takes over a live execution, even past its lease.

use crate::answer::Answer;
use crate::changes::Wakeups;
use crate::fingerprint::Fingerprint;
use crate::lease::Lease;
use crate::request::Request;
use crate::scope::RecordId;
use crate::token::FencingToken;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

/// The `Retry-After` of an in-flight answer whose holder is past its lease.
const PAST_LEASE_RETRY_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug, Default, Clone)]
pub(crate) struct Live(Arc<Registry>);

/// Locks `mutex`, whose data stays valid after a panic.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The live executions of one store, by record, and the duplicates waiting for them.
#[derive(Debug, Default)]
struct Registry {
    held: Mutex<HashMap<RecordId, Holder>>,
    /// The executions whose heartbeat waits while their effect's transaction is open.
    paused: Mutex<HashSet<FencingToken>>,
    /// The records being reserved now ([`process_gate`](crate::store::Capabilities::process_gate)).
    claims: Mutex<HashMap<RecordId, Claims>>,
    wakeups: Arc<Wakeups>,
    /// Whether the store's change feed was started (`Some`), and whether there is one.
    feed: OnceLock<bool>,
}

#[derive(Debug, Clone, Copy)]
struct Holder {
    fingerprint: Fingerprint,
    token: FencingToken,
    deadline: Option<Instant>,
    /// A renewal found the lease taken: the execution goes on, its duplicates go to the store.
    lost: bool,
}

/// Who is reserving one record in this process.
#[derive(Debug, Default)]
struct Claims {
    /// Reservations of either kind that may commit on their own (two commits), or reads.
    shared: usize,
    /// A one-commit execution (C15) and its fingerprint: nobody else may reach the store.
    exclusive: Option<Fingerprint>,
}

/// A claim on a record, given back when dropped.
#[derive(Debug)]
pub(crate) struct Claim {
    live: Live,
    id: RecordId,
    exclusive: bool,
}

/// Holds a lease in the registry until dropped (the execution ended).
#[derive(Debug)]
pub(crate) struct Held {
    live: Live,
    id: RecordId,
    token: FencingToken,
}

impl Live {
    /// The registry every engine of this process shares over the store with this
    /// [`identity`](crate::Store::identity); a registry of its own without one.
    pub(crate) fn of_store(identity: Option<usize>) -> Live {
        static SHARED: OnceLock<Mutex<HashMap<usize, Weak<Registry>>>> = OnceLock::new();
        let Some(identity) = identity else {
            return Live::default();
        };
        let mut shared = lock(SHARED.get_or_init(Mutex::default));
        // Registries whose engines are all gone are forgotten as others are made.
        shared.retain(|_, registry| registry.strong_count() > 0);
        if let Some(registry) = shared.get(&identity).and_then(Weak::upgrade) {
            return Live(registry);
        }
        let live = Live::default();
        shared.insert(identity, Arc::downgrade(&live.0));
        live
    }

    /// The answer to `request` if this process runs an execution of its record now.
    pub(crate) fn answer(&self, request: &Request, lease: Duration) -> Option<Answer> {
        let map = lock(&self.0.held);
        let holder = map.get(request.id()).filter(|holder| !holder.lost)?;
        if !request.accepts(&holder.fingerprint) {
            return Some(Answer::Mismatch);
        }
        let left = holder
            .deadline
            .map_or(lease, |d| d.saturating_duration_since(Instant::now()));
        let retry_after = if left.is_zero() {
            PAST_LEASE_RETRY_AFTER
        } else {
            left.min(lease)
        };
        Some(Answer::InFlight { retry_after })
    }

    /// Claims `request`'s record before the store: `exclusive` for one commit (C15). Any claim
    /// meeting an exclusive one, or an exclusive one meeting any: in flight (mismatch for
    /// another fingerprint).
    pub(crate) fn claim(&self, request: &Request, exclusive: bool) -> Result<Claim, Answer> {
        let in_flight = Answer::InFlight {
            retry_after: PAST_LEASE_RETRY_AFTER,
        };
        let mut claims = lock(&self.0.claims);
        let claims = claims.entry(request.id().clone()).or_default();
        match (claims.exclusive, exclusive) {
            (Some(held), _) if !request.accepts(&held) => return Err(Answer::Mismatch),
            (Some(_), _) => return Err(in_flight),
            (None, true) if claims.shared > 0 => return Err(in_flight),
            (None, true) => claims.exclusive = Some(*request.fingerprint()),
            (None, false) => claims.shared += 1,
        }
        Ok(Claim {
            live: self.clone(),
            id: request.id().clone(),
            exclusive,
        })
    }

    /// Registers `lease` as held by a live execution of this process.
    pub(crate) fn hold(&self, lease: &Lease) -> Held {
        let holder = Holder {
            fingerprint: *lease.fingerprint(),
            token: lease.token(),
            deadline: lease.local_deadline(),
            lost: false,
        };
        lock(&self.0.held).insert(lease.id().clone(), holder);
        Held {
            live: self.clone(),
            id: lease.id().clone(),
            token: lease.token(),
        }
    }

    /// Registers `lease` as [`hold`](Self::hold) does, unless another execution of this
    /// process holds its record: `None` then, that one left registered (a lease of the past
    /// going on with its completion never displaces the live takeover, C9).
    pub(crate) fn hold_unless_taken(&self, lease: &Lease) -> Option<Held> {
        let mut map = lock(&self.0.held);
        if map
            .get(lease.id())
            .is_some_and(|holder| holder.token != lease.token())
        {
            return None;
        }
        let holder = Holder {
            fingerprint: *lease.fingerprint(),
            token: lease.token(),
            deadline: lease.local_deadline(),
            lost: false,
        };
        map.insert(lease.id().clone(), holder);
        Some(Held {
            live: self.clone(),
            id: lease.id().clone(),
            token: lease.token(),
        })
    }

    /// Moves the registered deadline of `lease` after a renewal.
    pub(crate) fn renewed(&self, lease: &Lease) {
        let mut map = lock(&self.0.held);
        if let Some(holder) = map.get_mut(lease.id()) {
            if holder.token == lease.token() {
                holder.deadline = lease.local_deadline();
            }
        }
    }

    /// Marks `lease` lost (a renewal was fenced out): duplicates of its record go to the store.
    pub(crate) fn lost(&self, lease: &Lease) {
        let mut map = lock(&self.0.held);
        let Some(holder) = map.get_mut(lease.id()) else {
            return;
        };
        if holder.token != lease.token() {
            return;
        }
        holder.lost = true;
        drop(map);
        if self.0.wakeups.waiting() > 0 {
            self.0.wakeups.wake(&lease.id().digest());
        }
    }

    /// Whether a renewal found the lease of the execution holding `token` on `id` taken.
    pub(crate) fn was_lost(&self, id: &RecordId, token: FencingToken) -> bool {
        lock(&self.0.held)
            .get(id)
            .is_some_and(|holder| holder.token == token && holder.lost)
    }

    /// Renewals of `lease` wait until the guard drops (a renewal would fail its transaction).
    pub(crate) fn pause_renewals(&self, lease: &Lease) -> Paused {
        lock(&self.0.paused).insert(lease.token());
        Paused {
            live: self.clone(),
            token: lease.token(),
        }
    }

    /// Whether renewals of the execution holding `token` wait.
    pub(crate) fn renewals_paused(&self, token: FencingToken) -> bool {
        lock(&self.0.paused).contains(&token)
    }

    pub(crate) fn wakeups(&self) -> &Arc<Wakeups> {
        &self.0.wakeups
    }

    /// Whether the store's change feed runs: started by `start` the first time it is asked.
    pub(crate) fn feed(&self, start: impl FnOnce() -> bool) -> bool {
        *self.0.feed.get_or_init(start)
    }
}

/// Renewals of one execution wait while this lives ([`Live::pause_renewals`]).
#[derive(Debug)]
pub(crate) struct Paused {
    live: Live,
    token: FencingToken,
}

impl Drop for Paused {
    fn drop(&mut self) {
        lock(&self.live.0.paused).remove(&self.token);
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let registry = &self.live.0;
        let mut claims = lock(&registry.claims);
        if let Some(claimed) = claims.get_mut(&self.id) {
            if self.exclusive {
                claimed.exclusive = None;
            } else {
                claimed.shared = claimed.shared.saturating_sub(1);
            }
            if claimed.exclusive.is_none() && claimed.shared == 0 {
                claims.remove(&self.id);
            }
        }
        drop(claims);
        if registry.wakeups.waiting() > 0 {
            // Duplicates that met this claim and wait read the record again.
            registry.wakeups.wake(&self.id.digest());
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut map = lock(&self.live.0.held);
        let ended = map.get(&self.id).is_some_and(|h| h.token == self.token);
        if ended {
            map.remove(&self.id);
        }
        drop(map);
        if ended && self.live.0.wakeups.waiting() > 0 {
            // Duplicates of this process waiting for it read its record again.
            self.live.0.wakeups.wake(&self.id.digest());
        }
    }
}
