//! Completed answers kept in process memory: a replay answered with no store round trip.

use crate::answer::Answer;
use crate::fingerprint::Fingerprint;
use crate::request::Request;
use crate::response::StoredResponse;
use crate::scope::RecordId;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What an entry costs beside its response's bytes: the key, the fingerprint, the bookkeeping,
/// the cache's slot; and each header's own.
const ENTRY_OVERHEAD: u64 = 256;
const HEADER_OVERHEAD: u64 = 48;

/// How recently a store call must have succeeded, at the store's current generation, for the
/// cache to answer: a store that went away and came back (a restart, a failover) is seen by
/// the next call, which a cache answering alone would never make.
const CONFIRMED_WITHIN: Duration = Duration::from_secs(1);

/// An opt-in cache of completed answers in front of the store, given to one engine by
/// [`IdempotencyBuilder::replay_cache`](crate::IdempotencyBuilder::replay_cache) (its clones
/// share it): a retry of a completed request is answered from process memory (C7), another
/// body under its key with 422 (C3), each reported as a [`Replayed`](crate::EventKind::Replayed)
/// or [`Mismatch`](crate::EventKind::Mismatch) event of [`Operation::Cache`](crate::Operation::Cache)
/// (C16).
///
/// - **Filled** by completed records a reservation read (a replay) and by completions this
///   engine wrote; never by a record in doubt (docs/state-machine.md, "Records in doubt"). A
///   completed record read for another body (a mismatch, whose response the store does not
///   send) is kept without its response: it answers other bodies, and its own is read once.
/// - **Kept** until the record's retention ends by the store's clock (the time it has left
///   when read, counted from before the read), less [`skew`](Self::skew), and at most
///   [`max_age`](Self::max_age); bounded by entries and bytes, least used first out.
/// - **Answering** only while a reservation step succeeded in the last second at the store's
///   current [`generation`](crate::Store::generation), and **emptied** when that moves (a new
///   connection, a new server behind it, a failover that may have lost the last commits); a
///   store without one caches nothing.
///
/// ```
/// use idem_core::{Idempotency, MemoryStore, ReplayCache};
/// use std::time::Duration;
/// let cache = ReplayCache::new(10_000, 64 << 20).max_age(Duration::from_secs(30));
/// let idem = Idempotency::builder(MemoryStore::new()).replay_cache(cache).build()?;
/// # Ok::<(), idem_core::Error>(())
/// ```
pub struct ReplayCache {
    shared: Arc<Shared>,
    max_age: Duration,
    skew: Duration,
}

struct Shared {
    entries: quick_cache::sync::Cache<[u8; 32], Arc<Entry>, Weight>,
    /// The store generation the entries were read at.
    generation: AtomicU64,
    /// The last store call that succeeded: its generation, and when (`since(born)`, 0 for
    /// never), written when first then generation, read the other way round; atomics, so a hit
    /// takes no lock.
    confirmed_generation: AtomicU64,
    confirmed_at: AtomicU64,
    /// What `confirmed_at` counts from.
    born: Instant,
}

impl Shared {
    /// Nanoseconds from `born` to `at`, one more (0 stays "never").
    fn since(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.born).as_nanos())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }
}

#[derive(Debug)]
struct Entry {
    fingerprint: Fingerprint,
    /// `None`: read for another body, whose answer is a mismatch.
    response: Option<StoredResponse>,
    until: Instant,
    generation: u64,
}

/// Each entry weighs its bytes, and at least a share of the byte bound such that no more than
/// the entry bound fit: one weight bounds both.
#[derive(Debug, Clone)]
struct Weight {
    least: u64,
}

impl quick_cache::Weighter<[u8; 32], Arc<Entry>> for Weight {
    fn weight(&self, _key: &[u8; 32], entry: &Arc<Entry>) -> u64 {
        let response = entry.response.as_ref().map_or(ENTRY_OVERHEAD, bytes);
        self.least.max(response)
    }
}

fn bytes(response: &StoredResponse) -> u64 {
    let headers: u64 = response
        .headers
        .iter()
        .map(|(name, value)| {
            let size = u64::try_from(name.len() + value.len()).unwrap_or(u64::MAX);
            size.saturating_add(HEADER_OVERHEAD)
        })
        .fold(0, u64::saturating_add);
    let body = u64::try_from(response.body.len()).unwrap_or(u64::MAX);
    body.saturating_add(headers).saturating_add(ENTRY_OVERHEAD)
}

impl ReplayCache {
    /// A cache of at most `max_entries` answers and `max_bytes` bytes (bodies, headers and a
    /// few hundred bytes of overhead each), [`max_age`](Self::max_age) 60 s,
    /// [`skew`](Self::skew) 1 s.
    pub fn new(max_entries: usize, max_bytes: u64) -> Self {
        let max_bytes = max_bytes.max(ENTRY_OVERHEAD);
        // No more entries than the bytes hold: the cache's own slots (its estimate, and the
        // keys of recently evicted entries it remembers) are sized by this number.
        let fit = usize::try_from(max_bytes / ENTRY_OVERHEAD).unwrap_or(usize::MAX);
        let max_entries = max_entries.clamp(1, fit.max(1));
        let count = u64::try_from(max_entries).unwrap_or(u64::MAX);
        let least = (max_bytes / count).max(1);
        Self {
            shared: Arc::new(Shared {
                entries: quick_cache::sync::Cache::with_weighter(
                    max_entries,
                    max_bytes,
                    Weight { least },
                ),
                generation: AtomicU64::new(0),
                confirmed_generation: AtomicU64::new(0),
                confirmed_at: AtomicU64::new(0),
                // A minute back, so that an instant just before the cache was made still
                // counts from it (`since` saturates at `born`).
                born: Instant::now()
                    .checked_sub(Duration::from_secs(60))
                    .unwrap_or_else(Instant::now),
            }),
            max_age: Duration::from_secs(60),
            skew: Duration::from_secs(1),
        }
    }

    /// The longest an answer stays, whatever its retention: the bound on what the store's
    /// generation cannot show (an operator's change made elsewhere, a record deleted by hand,
    /// a failover behind a pooler).
    pub fn max_age(self, max_age: Duration) -> Self {
        Self { max_age, ..self }
    }

    /// How much sooner than its record an entry ends (default 1 s): room for the difference
    /// between the store's clock rate and this process's, and a record's read in transit.
    pub fn skew(self, skew: Duration) -> Self {
        Self { skew, ..self }
    }

    /// The same cache, for the engine's own use (its clones, a transactional execution).
    pub(crate) fn share(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            ..*self
        }
    }

    /// A store call succeeded at `generation` just now (a call of an older generation, which
    /// ended after the store moved on, confirms nothing).
    pub(crate) fn confirm(&self, generation: u64) {
        self.confirm_at(generation, Instant::now());
    }

    fn confirm_at(&self, generation: u64, at: Instant) {
        if !self.follow(generation) {
            return;
        }
        let shared = &self.shared;
        shared
            .confirmed_at
            .store(shared.since(at), Ordering::Release);
        shared
            .confirmed_generation
            .store(generation, Ordering::Release);
    }

    /// Whether a store call succeeded at `generation` within [`CONFIRMED_WITHIN`]. A
    /// confirmation racing this read can pair its newer time with this generation only if the
    /// store has moved past it: `follow` has then emptied this generation's entries, and none
    /// is kept for it again, so nothing is answered from it.
    fn confirmed(&self, generation: u64) -> bool {
        let shared = &self.shared;
        if shared.confirmed_generation.load(Ordering::Acquire) != generation {
            return false;
        }
        let at = shared.confirmed_at.load(Ordering::Acquire);
        let window = u64::try_from(CONFIRMED_WITHIN.as_nanos()).unwrap_or(u64::MAX);
        at != 0 && shared.since(Instant::now()).saturating_sub(at) <= window
    }

    /// The answer to `request` from memory, if its record is here: a replay for its own (or its
    /// alternative) fingerprint, if its response is kept, else a mismatch. `generation`: the
    /// store's now.
    pub(crate) fn answer(&self, request: &Request, generation: u64) -> Option<Answer> {
        self.follow(generation);
        if !self.confirmed(generation) {
            return None;
        }
        let key = request.id().digest();
        let entries = &self.shared.entries;
        let entry = entries.get(&key)?;
        if entry.generation != generation || Instant::now() >= entry.until {
            entries.remove(&key);
            return None;
        }
        Some(if request.accepts(&entry.fingerprint) {
            Answer::Replay(entry.response.clone()?)
        } else {
            Answer::Mismatch
        })
    }

    /// Keeps `response`, completed under `fingerprint` for record `id` with `left` of its
    /// retention as of `read_at`, read at store `generation` (both taken before the read);
    /// `None` (read for another body) never replaces the response kept for the same record.
    pub(crate) fn keep(
        &self,
        id: &RecordId,
        fingerprint: Fingerprint,
        response: Option<&StoredResponse>,
        left: Duration,
        read_at: Instant,
        generation: u64,
    ) {
        let Some(left) = left.checked_sub(self.skew) else {
            return;
        };
        let until = read_at + left.min(self.max_age);
        if until <= Instant::now() || !self.follow(generation) {
            return;
        }
        let key = id.digest();
        if response.is_none() {
            let kept = self.shared.entries.get(&key);
            let same = |e: &Entry| e.generation == generation && e.fingerprint == fingerprint;
            if kept.is_some_and(|e| e.response.is_some() && same(&e)) {
                return;
            }
        }
        let entry = Entry {
            fingerprint,
            response: response.cloned(),
            until,
            generation,
        };
        self.shared.entries.insert(key, Arc::new(entry));
    }

    /// Empties the cache when the store's generation moved past the entries'; returns whether
    /// `generation` is the current one (an older one keeps nothing).
    fn follow(&self, generation: u64) -> bool {
        let seen = self
            .shared
            .generation
            .fetch_max(generation, Ordering::AcqRel);
        if seen < generation {
            self.shared.entries.clear();
        }
        seen <= generation
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shared.entries.len()
    }
}

impl std::fmt::Debug for ReplayCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shared = &self.shared;
        f.debug_struct("ReplayCache")
            .field("entries", &shared.entries.len())
            .field("weight", &shared.entries.weight())
            .field("max_age", &self.max_age)
            .field("skew", &self.skew)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(key: &str, body: &[u8]) -> Request {
        Request::builder("acct", "POST", "/charges")
            .key(Some(key))
            .body(body)
            .build()
            .expect("a valid request")
    }

    fn keep(cache: &ReplayCache, request: &Request, left: Duration, generation: u64) {
        cache.confirm(generation);
        let response = StoredResponse::new(201, "charged");
        let fingerprint = *request.fingerprint();
        cache.keep(
            request.id(),
            fingerprint,
            Some(&response),
            left,
            Instant::now(),
            generation,
        );
    }

    #[test]
    fn c07_a_kept_answer_is_replayed_and_c03_another_body_is_a_mismatch() {
        let cache = ReplayCache::new(10, 1 << 20);
        let first = request("k", b"1");
        keep(&cache, &first, Duration::from_secs(60), 0);
        assert!(matches!(cache.answer(&first, 0), Some(Answer::Replay(r)) if r.body == b"charged"));
        assert_eq!(cache.answer(&request("k", b"2"), 0), Some(Answer::Mismatch));
        assert_eq!(cache.answer(&request("other", b"1"), 0), None);
    }

    #[test]
    fn c03_a_record_read_for_another_body_answers_other_bodies_only() {
        let cache = ReplayCache::new(10, 1 << 20);
        let original = request("k", b"1");
        let (other, own) = (request("k", b"2"), *original.fingerprint());
        let minute = Duration::from_secs(60);
        cache.confirm(0);
        cache.keep(original.id(), own, None, minute, Instant::now(), 0);
        assert_eq!(cache.answer(&other, 0), Some(Answer::Mismatch));
        assert_eq!(
            cache.answer(&original, 0),
            None,
            "its own body: the store's"
        );
        keep(&cache, &original, minute, 0);
        cache.keep(original.id(), own, None, minute, Instant::now(), 0);
        assert!(
            matches!(cache.answer(&original, 0), Some(Answer::Replay(_))),
            "a mismatch read keeps the response kept"
        );
        assert_eq!(cache.answer(&other, 0), Some(Answer::Mismatch));
    }

    #[test]
    fn c10_an_answer_ends_before_its_record_by_the_skew() {
        let cache = ReplayCache::new(10, 1 << 20).skew(Duration::from_millis(100));
        let first = request("k", b"1");
        keep(&cache, &first, Duration::from_millis(80), 0);
        assert_eq!(
            cache.answer(&first, 0),
            None,
            "less left than the skew: not kept"
        );
        keep(&cache, &first, Duration::from_millis(150), 0);
        assert!(cache.answer(&first, 0).is_some());
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(
            cache.answer(&first, 0),
            None,
            "ended 100 ms before its record"
        );
    }

    #[test]
    fn an_answer_ends_at_the_max_age() {
        let cache = ReplayCache::new(10, 1 << 20).max_age(Duration::from_millis(30));
        let first = request("k", b"1");
        keep(&cache, &first, Duration::from_secs(3600), 0);
        assert!(cache.answer(&first, 0).is_some());
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(cache.answer(&first, 0), None);
    }

    #[test]
    fn c13_a_new_store_generation_empties_the_cache_and_an_old_read_keeps_nothing() {
        let cache = ReplayCache::new(10, 1 << 20);
        let (a, b) = (request("a", b"1"), request("b", b"1"));
        keep(&cache, &a, Duration::from_secs(60), 3);
        assert!(cache.answer(&a, 3).is_some());
        assert_eq!(cache.answer(&b, 4), None);
        assert_eq!(
            cache.len(),
            0,
            "the store reconnected: everything read before is gone"
        );
        let response = StoredResponse::new(201, "x");
        let now = Instant::now();
        cache.keep(
            a.id(),
            *a.fingerprint(),
            Some(&response),
            Duration::from_secs(60),
            now,
            3,
        );
        cache.confirm(4);
        assert_eq!(
            cache.answer(&a, 4),
            None,
            "read before the reconnection: not kept"
        );
    }

    #[test]
    fn entries_and_bytes_are_both_bounded() {
        let by_count = ReplayCache::new(4, 1 << 30);
        for i in 0..64 {
            keep(
                &by_count,
                &request(&format!("k{i}"), b"1"),
                Duration::from_secs(60),
                0,
            );
        }
        assert!(by_count.len() <= 4, "{} entries", by_count.len());

        let by_bytes = ReplayCache::new(1_000_000, 64 * 1024);
        by_bytes.confirm(0);
        let big = StoredResponse::new(200, vec![0u8; 10 * 1024]);
        for i in 0..64 {
            let r = request(&format!("k{i}"), b"1");
            let fp = *r.fingerprint();
            by_bytes.keep(
                r.id(),
                fp,
                Some(&big),
                Duration::from_secs(60),
                Instant::now(),
                0,
            );
        }
        assert!(
            by_bytes.len() <= 6,
            "{} entries of 10 KiB in 64 KiB",
            by_bytes.len()
        );
        assert!(by_bytes.shared.entries.weight() <= 64 * 1024);
    }

    #[test]
    fn c13_without_a_recent_store_call_nothing_is_answered() {
        let cache = ReplayCache::new(10, 1 << 20);
        let first = request("k", b"1");
        keep(&cache, &first, Duration::from_secs(60), 0);
        assert!(cache.answer(&first, 0).is_some());
        cache.confirm_at(
            0,
            Instant::now() - CONFIRMED_WITHIN - Duration::from_millis(1),
        );
        assert_eq!(
            cache.answer(&first, 0),
            None,
            "the store unseen for a second"
        );
        cache.confirm(0);
        assert!(
            cache.answer(&first, 0).is_some(),
            "seen again, at the same generation"
        );
    }
}
