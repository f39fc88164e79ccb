//! The inbox's audit trail: every event's source, id, deliveries and outcome, kept for a
//! retention and queryable per source and time range.

#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "postgres")]
pub use postgres::PgAudit;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteAudit;

use async_trait::async_trait;
use idem_core::Error;
use idem_core::Timestamp;
use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

/// The key an audit entry is stored under for `event_id`: its blake3 digest (part of the SQL
/// stores' stored format: every audit table keys its rows by it).
///
/// ```
/// assert_eq!(idem_inbox::event_key(b"evt_1"), *blake3::hash(b"evt_1").as_bytes());
/// ```
pub fn event_key(event_id: &[u8]) -> [u8; 32] {
    *blake3::hash(event_id).as_bytes()
}

/// What became of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AuditOutcome {
    /// Delivered, not processed yet (running, or its last attempt failed and the sender will
    /// deliver it again).
    Received,
    /// Processed once.
    Processed,
    /// The handler failed: nothing was recorded and the next delivery runs it again; or, when
    /// its acknowledgement could not be stored after it ran, a stored 500 that redeliveries get
    /// until the retention passes (docs/inbox.md).
    Failed,
}

impl AuditOutcome {
    /// A stable name: `received`, `processed`, `failed`.
    pub fn as_str(&self) -> &'static str {
        match self {
            AuditOutcome::Received => "received",
            AuditOutcome::Processed => "processed",
            AuditOutcome::Failed => "failed",
        }
    }

    /// The outcome of its stable number (what SQL stores keep).
    pub fn from_code(code: i64) -> Option<Self> {
        match code {
            0 => Some(AuditOutcome::Received),
            1 => Some(AuditOutcome::Processed),
            2 => Some(AuditOutcome::Failed),
            _ => None,
        }
    }

    /// Its stable number.
    pub fn code(&self) -> i64 {
        match self {
            AuditOutcome::Received => 0,
            AuditOutcome::Processed => 1,
            AuditOutcome::Failed => 2,
        }
    }
}

/// One event in the audit trail.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditEntry {
    /// The sender (the inbox's source).
    pub source: String,
    /// The event id exactly as the sender sent it.
    pub event_id: Vec<u8>,
    /// When the first delivery arrived.
    pub first_received: Timestamp,
    /// When the last delivery arrived.
    pub last_received: Timestamp,
    /// When it was processed.
    pub processed: Option<Timestamp>,
    /// How many verified deliveries arrived.
    pub deliveries: u64,
    /// Deliveries with this id and another payload (a sender bug or an attack): never processed.
    pub conflicts: u64,
    /// What became of it.
    pub outcome: AuditOutcome,
}

impl AuditEntry {
    /// The entry of a first delivery of `event_id` from `source` at `at`: one delivery, not
    /// processed yet. Stores fill the other fields from their rows.
    ///
    /// ```
    /// use idem_inbox::{AuditEntry, AuditOutcome};
    /// let entry = AuditEntry::new("stripe", b"evt_1", idem_core::Timestamp::from_millis(5));
    /// assert_eq!((entry.deliveries, entry.outcome), (1, AuditOutcome::Received));
    /// ```
    pub fn new(source: &str, event_id: &[u8], at: Timestamp) -> Self {
        Self {
            source: source.to_owned(),
            event_id: event_id.to_vec(),
            first_received: at,
            last_received: at,
            processed: None,
            deliveries: 1,
            conflicts: 0,
            outcome: AuditOutcome::Received,
        }
    }
}

/// Where the inbox writes its audit trail: one entry per (source, event id). Implemented by
/// [`MemoryAudit`], and on the SQL stores by `SqliteAudit` and `PgAudit` (features `sqlite`
/// and `postgres`: a table beside their records).
///
/// # Contract
/// - [`delivered`](Self::delivered) creates the entry at the first delivery (outcome
///   [`AuditOutcome::Received`]) and counts every delivery;
/// - [`settled`](Self::settled) records an outcome: `Processed` sets the processed time and
///   is final; `Failed` does not overwrite `Processed`;
/// - [`conflicted`](Self::conflicted) counts a delivery with another payload, leaving the
///   outcome;
/// - [`query`](Self::query) lists the entries of a source first received in `[from, to)`,
///   oldest first; [`purge`](Self::purge) deletes those first received before a time.
#[async_trait]
pub trait Audit: Send + Sync + 'static {
    /// A verified delivery of `event_id` from `source` arrived at `at`.
    async fn delivered(&self, source: &str, event_id: &[u8], at: Timestamp) -> Result<(), Error>;

    /// The event's processing ended with `outcome` at `at`.
    async fn settled(
        &self,
        source: &str,
        event_id: &[u8],
        outcome: AuditOutcome,
        at: Timestamp,
    ) -> Result<(), Error>;

    /// A delivery of `event_id` arrived with another payload than the first.
    async fn conflicted(&self, source: &str, event_id: &[u8], at: Timestamp) -> Result<(), Error>;

    /// The entries of `source` first received in `[from, to)`, oldest first, at most `limit`.
    async fn query(
        &self,
        source: &str,
        from: Timestamp,
        to: Timestamp,
        limit: usize,
    ) -> Result<Vec<AuditEntry>, Error>;

    /// Deletes at most `limit` entries first received before `before`; returns how many.
    async fn purge(&self, before: Timestamp, limit: usize) -> Result<usize, Error>;
}

/// The audit trail in memory (tests, single-process tools; the reference implementation).
///
/// ```
/// use idem_inbox::{Audit, AuditOutcome, MemoryAudit};
/// use idem_core::Timestamp;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_core::Error> {
/// let audit = MemoryAudit::default();
/// audit.delivered("stripe", b"evt_1", Timestamp::from_millis(10)).await?;
/// audit.delivered("stripe", b"evt_1", Timestamp::from_millis(20)).await?;
/// audit.settled("stripe", b"evt_1", AuditOutcome::Processed, Timestamp::from_millis(15)).await?;
/// let entries = audit.query("stripe", Timestamp::from_millis(0), Timestamp::from_millis(100), 10).await?;
/// assert_eq!((entries[0].deliveries, entries[0].outcome), (2, AuditOutcome::Processed));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Default)]
pub struct MemoryAudit {
    entries: Mutex<BTreeMap<(String, Vec<u8>), AuditEntry>>,
}

impl MemoryAudit {
    fn with<T>(&self, f: impl FnOnce(&mut BTreeMap<(String, Vec<u8>), AuditEntry>) -> T) -> T {
        f(&mut self.entries.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

#[async_trait]
impl Audit for MemoryAudit {
    async fn delivered(&self, source: &str, event_id: &[u8], at: Timestamp) -> Result<(), Error> {
        self.with(|entries| {
            let entry = entries
                .entry((source.to_owned(), event_id.to_vec()))
                .or_insert_with(|| AuditEntry {
                    deliveries: 0,
                    ..AuditEntry::new(source, event_id, at)
                });
            entry.deliveries += 1;
            entry.last_received = entry.last_received.max(at);
        });
        Ok(())
    }

    async fn settled(
        &self,
        source: &str,
        event_id: &[u8],
        outcome: AuditOutcome,
        at: Timestamp,
    ) -> Result<(), Error> {
        self.with(|entries| {
            if let Some(entry) = entries.get_mut(&(source.to_owned(), event_id.to_vec())) {
                if entry.outcome != AuditOutcome::Processed {
                    entry.outcome = outcome;
                    if outcome == AuditOutcome::Processed {
                        entry.processed = Some(at);
                    }
                }
            }
        });
        Ok(())
    }

    async fn conflicted(&self, source: &str, event_id: &[u8], _at: Timestamp) -> Result<(), Error> {
        self.with(|entries| {
            if let Some(entry) = entries.get_mut(&(source.to_owned(), event_id.to_vec())) {
                entry.conflicts += 1;
            }
        });
        Ok(())
    }

    async fn query(
        &self,
        source: &str,
        from: Timestamp,
        to: Timestamp,
        limit: usize,
    ) -> Result<Vec<AuditEntry>, Error> {
        let mut found: Vec<AuditEntry> = self.with(|entries| {
            entries
                .values()
                .filter(|e| e.source == source && e.first_received >= from && e.first_received < to)
                .cloned()
                .collect()
        });
        found.sort_by(|a, b| (a.first_received, &a.event_id).cmp(&(b.first_received, &b.event_id)));
        found.truncate(limit);
        Ok(found)
    }

    async fn purge(&self, before: Timestamp, limit: usize) -> Result<usize, Error> {
        Ok(self.with(|entries| {
            let old: Vec<_> = entries
                .iter()
                .filter(|(_, e)| e.first_received < before)
                .map(|(k, _)| k.clone())
                .take(limit)
                .collect();
            for key in &old {
                entries.remove(key);
            }
            old.len()
        }))
    }
}
