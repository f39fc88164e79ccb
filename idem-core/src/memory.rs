//! The reference store: in process memory, correct under real concurrency.

use crate::clock::{Clock, SystemClock, Timestamp};
use crate::decision::check_fence;
use crate::error::Error;
use crate::lease::Lease;
use crate::record::{Record, RecordState};
use crate::request::Request;
use crate::resolution::Resolution;
use crate::response::StoredResponse;
use crate::scope::RecordId;
use crate::store::Deadline;
use crate::store::{Acquire, Claim, Completion, Reserved, Store};
use crate::token::FencingToken;
use crate::trail::Decided;
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// The [`Store`] contract's executable specification, in memory: for tests, single-process
/// tools, and the model other stores are checked against. Responses are kept encoded.
///
/// ```
/// use idem_core::{Idempotency, ManualClock, MemoryStore, Timestamp};
/// let clock = ManualClock::new(Timestamp::from_millis(0));
/// let idem = Idempotency::new(MemoryStore::with_clock(clock.clone()));
/// # let _ = idem;
/// ```
#[derive(Debug)]
pub struct MemoryStore {
    records: Mutex<HashMap<RecordId, Entry>>,
    /// Locked after `records` when both are.
    trail: Mutex<Trail>,
    clock: Arc<dyn Clock>,
}

/// One record as a [`MemoryStore`] holds it, for operator reads.
#[derive(Debug, Clone)]
pub struct MemoryRecord {
    /// The record's (consumer, route, key).
    pub id: RecordId,
    /// The record, its response still encoded.
    pub record: Record<Vec<u8>>,
    /// When its current reservation (fresh or a takeover) was made, by the store's clock.
    pub reserved_at: Timestamp,
    /// When its completion landed, by the store's clock; `None` in progress.
    pub completed_at: Option<Timestamp>,
    /// For a record in doubt: its mark, encoded, and when it is next due for a check.
    pub doubt: Option<(Vec<u8>, Timestamp)>,
}

/// Each record's audit entries: (at, the entry as encoded, kept until), oldest first.
type Trail = HashMap<RecordId, Vec<(Timestamp, Vec<u8>, Timestamp)>>;

#[derive(Debug, Clone)]
struct Entry {
    record: Record<Vec<u8>>,
    reserved_at: Timestamp,
    completed_at: Option<Timestamp>,
    doubt: Option<(Vec<u8>, Timestamp)>,
}

impl Entry {
    fn decode(&self) -> Result<Record, Error> {
        self.record
            .as_ref()
            .try_map_response(|r| StoredResponse::decode(r))
    }

    fn shown(&self, id: &RecordId) -> MemoryRecord {
        MemoryRecord {
            id: id.clone(),
            record: self.record.clone(),
            reserved_at: self.reserved_at,
            completed_at: self.completed_at,
            doubt: self.doubt.clone(),
        }
    }

    fn in_doubt(&self, now: Timestamp) -> bool {
        self.doubt.is_some() && self.record.is_completed() && self.record.is_live(now)
    }

    fn complete(&mut self, response: Vec<u8>, expires_at: Timestamp) {
        self.record.state = RecordState::Completed {
            response,
            expires_at,
        };
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }

    /// An empty store reading time from `clock` (a [`ManualClock`](crate::ManualClock) in tests).
    pub fn with_clock(clock: impl Clock + 'static) -> Self {
        Self {
            records: Mutex::new(HashMap::new()),
            trail: Mutex::new(HashMap::new()),
            clock: Arc::new(clock),
        }
    }

    /// How many records are held, expired or not.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The store's `now`, by its clock.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Every record held, expired or not, in no order.
    ///
    /// ```
    /// use idem_core::MemoryStore;
    /// assert!(MemoryStore::new().records().is_empty());
    /// ```
    pub fn records(&self) -> Vec<MemoryRecord> {
        self.lock()
            .iter()
            .map(|(id, entry)| entry.shown(id))
            .collect()
    }

    /// The record `id` as held, expired or not.
    pub fn record(&self, id: &RecordId) -> Option<MemoryRecord> {
        self.lock().get(id).map(|entry| entry.shown(id))
    }

    /// The unexpired audit trail of `id`, oldest first, as [`Store::resolve`] wrote it.
    pub fn trail(&self, id: &RecordId) -> Vec<(Timestamp, Vec<u8>)> {
        let now = self.clock.now();
        self.lock_trail()
            .get(id)
            .into_iter()
            .flatten()
            .filter(|(_, _, until)| *until > now)
            .map(|(at, entry, _)| (*at, entry.clone()))
            .collect()
    }

    /// Overwrites a completed record's stored response, to test corrupt records (C12).
    #[cfg(feature = "testing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
    pub fn overwrite_stored_response(&self, id: &RecordId, bytes: Vec<u8>) -> bool {
        match self.lock().get_mut(id).map(|entry| &mut entry.record.state) {
            Some(RecordState::Completed { response, .. }) => {
                *response = bytes;
                true
            }
            _ => false,
        }
    }

    fn reservation(&self, claim: &Claim<'_>, now: Timestamp, until: Timestamp) -> Entry {
        Entry {
            record: Record {
                fingerprint: *claim.fingerprint(),
                token: claim.token(),
                state: RecordState::InProgress { lease_until: until },
            },
            reserved_at: now,
            completed_at: None,
            doubt: None,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<RecordId, Entry>> {
        // Every write is one insert or remove: a poisoned map is still consistent.
        self.records
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock_trail(&self) -> MutexGuard<'_, Trail> {
        // Every write is one push or retain: a poisoned map is still consistent.
        self.trail
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn fenced<T>(
        &self,
        id: &RecordId,
        token: &FencingToken,
        apply: impl FnOnce(&mut Entry, Timestamp) -> T,
    ) -> Result<T, Error> {
        let mut records = self.lock();
        let entry = records.get_mut(id);
        check_fence(entry.as_ref().map(|e| &e.record), token)?;
        let entry = entry.ok_or(Error::LeaseLost)?;
        Ok(apply(entry, self.clock.now()))
    }
}

/// The record of `request` as a step reports it: its response only for the request it can be
/// replayed to, under its own fingerprint or its alternative (C3).
fn found(
    records: &HashMap<RecordId, Entry>,
    request: &Request,
    now: Timestamp,
) -> Result<Option<Reserved>, Error> {
    let Some(entry) = records.get(request.id()) else {
        return Ok(None);
    };
    let same = request.accepts(&entry.record.fingerprint);
    let record = entry
        .record
        .as_ref()
        .try_map_response(|r| Ok::<_, Error>(same.then(|| r.clone())))?;
    let in_doubt = entry.doubt.is_some();
    Ok(Some(Reserved::Found {
        record,
        now,
        in_doubt,
    }))
}

#[async_trait]
impl Store for MemoryStore {
    async fn read(&self, request: &Request, _deadline: Deadline) -> Result<Reserved, Error> {
        let records = self.lock();
        Ok(found(&records, request, self.clock.now())?.unwrap_or(Reserved::Lost))
    }

    fn identity(&self) -> Option<usize> {
        Some(std::ptr::from_ref(&self.records) as usize)
    }

    /// Never reconnects; `None` on a clock of its own (a retention counted by it is not the
    /// process's).
    fn generation(&self) -> Option<u64> {
        self.clock.is_system().then_some(0)
    }

    async fn reserve(&self, claim: &Claim<'_>, _deadline: Deadline) -> Result<Reserved, Error> {
        let mut records = self.lock();
        let now = self.clock.now();
        if let Some(found) = found(&records, claim.request(), now)? {
            return Ok(found);
        }
        let until = now + claim.lease_for();
        records.insert(claim.id().clone(), self.reservation(claim, now, until));
        Ok(Reserved::Written { until })
    }

    async fn replace(
        &self,
        claim: &Claim<'_>,
        acquire: Acquire,
        _deadline: Deadline,
    ) -> Result<Reserved, Error> {
        let mut records = self.lock();
        let now = self.clock.now();
        let Some((previous, completed)) = acquire.replaces() else {
            return Ok(Reserved::Lost);
        };
        // Under the lock: the record is replaced only if it is still the one the decision saw.
        let still = records.get(claim.id()).is_some_and(|entry| {
            let record = &entry.record;
            record.token == previous && record.is_completed() == completed && !record.is_live(now)
        });
        if !still {
            return Ok(Reserved::Lost);
        }
        let until = now + claim.lease_for();
        records.insert(claim.id().clone(), self.reservation(claim, now, until));
        Ok(Reserved::Written { until })
    }

    async fn complete(&self, completion: &Completion, _deadline: Deadline) -> Result<(), Error> {
        let retain_for = completion.retain_for();
        self.fenced(completion.id(), &completion.token(), |entry, now| {
            entry.completed_at = Some(now);
            entry.complete(completion.encoded().to_vec(), now + retain_for);
            entry.doubt = completion.doubt().map(|doubt| (doubt.to_vec(), now));
        })
    }

    async fn release(&self, lease: &Lease, _deadline: Deadline) -> Result<(), Error> {
        let mut records = self.lock();
        check_fence(records.get(lease.id()).map(|e| &e.record), &lease.token())?;
        records.remove(lease.id());
        Ok(())
    }

    async fn renew(
        &self,
        lease: &Lease,
        lease_for: Duration,
        _deadline: Deadline,
    ) -> Result<Timestamp, Error> {
        self.fenced(lease.id(), &lease.token(), |entry, now| {
            let lease_until = now + lease_for;
            entry.record.state = RecordState::InProgress { lease_until };
            lease_until
        })
    }

    async fn purge_expired(&self, limit: usize, _deadline: Deadline) -> Result<usize, Error> {
        let mut records = self.lock();
        let now = self.clock.now();
        let expired: Vec<RecordId> = records
            .iter()
            .filter(|(_, entry)| !entry.record.is_live(now))
            .map(|(id, _)| id.clone())
            .take(limit)
            .collect();
        for id in &expired {
            records.remove(id);
        }
        let mut purged = expired.len();
        drop(records);
        let mut trail = self.lock_trail();
        trail.retain(|_, entries| {
            entries.retain(|(_, _, until)| {
                let keep = *until > now || purged >= limit;
                purged += usize::from(!keep);
                keep
            });
            !entries.is_empty()
        });
        Ok(purged)
    }

    async fn resolve(&self, resolution: &Resolution, _deadline: Deadline) -> Result<bool, Error> {
        let mut records = self.lock();
        let now = self.clock.now();
        let id = resolution.id();
        let Some(entry) = records.get_mut(id) else {
            return Ok(false);
        };
        let marked = entry.doubt.as_ref().map(|(doubt, _)| doubt.as_slice());
        if !entry.in_doubt(now)
            || entry.record.token != resolution.token()
            || marked != Some(resolution.read_doubt())
        {
            return Ok(false);
        }
        match resolution.decided() {
            Decided::Settled { .. } => {
                // Never shorter than the record had left: a settled key never turns new sooner.
                let until = (now + resolution.retain_for()).max(entry.record.deadline());
                entry.complete(resolution.response().to_vec(), until);
                entry.doubt = None;
            }
            Decided::Released => {
                records.remove(id);
            }
            Decided::StillUnknown { retry_after, .. } => {
                entry.doubt = Some((resolution.doubt().to_vec(), now + retry_after));
            }
        }
        let until = now + resolution.keep_entry_for();
        self.lock_trail().entry(id.clone()).or_default().push((
            now,
            resolution.entry().to_vec(),
            until,
        ));
        Ok(true)
    }

    async fn lookup(&self, id: &RecordId, _deadline: Deadline) -> Result<Option<Record>, Error> {
        self.lock().get(id).map(Entry::decode).transpose()
    }
}
