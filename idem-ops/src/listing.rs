//! Records listed for operators: in-progress records older than an age (the orphans a crash
//! left, a handler that hangs), and one consumer's completed records (for support).
//!
//! A listing is read-only, bounded ([`ListQuery::MAX_LIMIT`] records a call) and paginated: a
//! [`Page`] carries the [`Cursor`] of the next page, `None` at the end. It never carries a
//! stored body (a completed record shows its status); [`Store::lookup`](idem_core::Store::lookup)
//! reads one record whole.

use crate::provenance::{Noted, Provenance};
use crate::Holder;
use idem_core::store::{Doubt, Record};
use idem_core::{Error, Field, IdempotencyKey, RecordId, Scope, Timestamp};
use std::fmt;
use std::time::Duration;

/// Which records to list, how many, and from where.
///
/// ```
/// use idem_ops::{ListQuery, Selection};
/// use std::time::Duration;
/// let stuck = ListQuery::in_progress(Duration::from_secs(300)).limit(50);
/// assert_eq!(stuck.selection(), &Selection::InProgress { older_than: Duration::from_secs(300) });
/// let support = ListQuery::completed("acct_42")?.route("POST /v1/charges")?;
/// assert_eq!(support.limit_value(), ListQuery::DEFAULT_LIMIT);
/// assert!(ListQuery::completed("").is_err());
/// # Ok::<(), idem_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    selection: Selection,
    limit: usize,
    after: Option<Cursor>,
}

/// The records a [`ListQuery`] selects.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Selection {
    /// In-progress records reserved at least `older_than` ago by the store's clock, whether
    /// their lease still holds (a slow or hung handler) or has passed (an orphan awaiting a
    /// takeover or the purge). Oldest first: by reservation time, then consumer, route, key.
    /// A record written before the store kept reservation times has none: it counts as
    /// reserved at the epoch (1970), so it comes first and is older than any age up to then.
    InProgress {
        /// The least age listed.
        older_than: Duration,
    },
    /// The live completed records of one consumer (expired ones behave as absent, C10), on one
    /// route or all, by route then key.
    Completed {
        /// Whose records.
        consumer: String,
        /// Only this route, if set.
        route: Option<String>,
    },
    /// Every record with this idempotency key, under any consumer and route, in any state,
    /// expired or not (what [`Store::lookup`](idem_core::Store::lookup) would read for each), by
    /// consumer then route. Keys are chosen by clients: records of two clients may share one,
    /// and each is still its own record (C2).
    Key {
        /// The key.
        key: String,
    },
    /// The live completed records whose answer is in doubt (C8; docs/state-machine.md,
    /// "Records in doubt"), oldest first like [`InProgress`](Self::InProgress): by reservation
    /// time, then consumer, route, key. With `due`, only those whose next check time has come
    /// by the store's clock (what a reconciler works on).
    InDoubt {
        /// Only the records due for a check.
        due: bool,
    },
}

impl ListQuery {
    /// The most records one call returns.
    pub const MAX_LIMIT: usize = 1000;
    /// The records one call returns unless told otherwise.
    pub const DEFAULT_LIMIT: usize = 100;

    /// In-progress records reserved at least `older_than` ago.
    pub fn in_progress(older_than: Duration) -> Self {
        Self::new(Selection::InProgress { older_than })
    }

    /// The records in doubt, due or not ([`Selection::InDoubt`]).
    ///
    /// ```
    /// use idem_ops::{ListQuery, Selection};
    /// assert_eq!(ListQuery::in_doubt().selection(), &Selection::InDoubt { due: false });
    /// assert_eq!(ListQuery::due_for_reconciliation().selection(), &Selection::InDoubt { due: true });
    /// ```
    pub fn in_doubt() -> Self {
        Self::new(Selection::InDoubt { due: false })
    }

    /// The records in doubt whose next check time has come: a reconciler's work.
    pub fn due_for_reconciliation() -> Self {
        Self::new(Selection::InDoubt { due: true })
    }

    /// The completed records of `consumer` (validated like [`Scope`]'s consumer).
    pub fn completed(consumer: &str) -> Result<Self, Error> {
        Scope::check_consumer(consumer)?;
        Ok(Self::new(Selection::Completed {
            consumer: consumer.to_owned(),
            route: None,
        }))
    }

    /// Every record with `key` (validated like an [`IdempotencyKey`]), across consumers and
    /// routes.
    ///
    /// ```
    /// use idem_ops::{ListQuery, Selection};
    /// let q = ListQuery::key("order-42")?;
    /// assert_eq!(q.selection(), &Selection::Key { key: "order-42".into() });
    /// assert!(ListQuery::key("bad key").is_err());
    /// # Ok::<(), idem_core::Error>(())
    /// ```
    pub fn key(key: &str) -> Result<Self, Error> {
        let key = IdempotencyKey::new(key)?;
        Ok(Self::new(Selection::Key {
            key: key.as_str().to_owned(),
        }))
    }

    fn new(selection: Selection) -> Self {
        Self {
            selection,
            limit: Self::DEFAULT_LIMIT,
            after: None,
        }
    }

    /// Only `route` (validated like [`Scope`]'s route); only for completed records.
    pub fn route(mut self, route: &str) -> Result<Self, Error> {
        Scope::check_route(route)?;
        match &mut self.selection {
            Selection::Completed { route: r, .. } => *r = Some(route.to_owned()),
            Selection::InProgress { .. } | Selection::Key { .. } | Selection::InDoubt { .. } => {
                return Err(Error::invalid(
                    Field::Route,
                    "a route filter applies to completed records only",
                ))
            }
        }
        Ok(self)
    }

    /// At most `limit` records, clamped to 1..=[`MAX_LIMIT`](Self::MAX_LIMIT).
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit.clamp(1, Self::MAX_LIMIT);
        self
    }

    /// The page after `cursor` (from [`Page::next`] of the same selection).
    pub fn after(mut self, cursor: Cursor) -> Self {
        self.after = Some(cursor);
        self
    }

    /// What is selected.
    pub fn selection(&self) -> &Selection {
        &self.selection
    }

    /// The most records returned.
    pub fn limit_value(&self) -> usize {
        self.limit
    }

    /// Where the page starts, if not at the beginning.
    pub fn cursor(&self) -> Option<&Cursor> {
        self.after.as_ref()
    }
}

/// One listed record: who it belongs to, when it was reserved, where it is in its life. Never
/// its stored body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The record's (consumer, route, key).
    pub id: RecordId,
    /// When its current reservation was made (a takeover is a new reservation); `None` for a
    /// record written before the store kept it.
    pub reserved_at: Option<Timestamp>,
    /// When its completion landed; `None` in progress, or for a record written before the
    /// store kept it.
    pub completed_at: Option<Timestamp>,
    /// The process that made the current reservation: unknown for a record written before the
    /// store kept it, unreadable where what is stored does not decode.
    pub holder: Noted<Holder>,
    /// In progress or completed, with its deadline.
    pub state: ListedState,
    /// For a completed record whose answer is in doubt, its mark (unreadable where what is
    /// stored does not decode); `None` otherwise.
    pub doubt: Option<Noted<Doubt>>,
    /// For a record in doubt, when it is next due for a check, by the store's clock.
    pub check_at: Option<Timestamp>,
}

/// A listed record's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListedState {
    /// Reserved; an orphan once `lease_until` has passed.
    InProgress {
        /// The lease's deadline.
        lease_until: Timestamp,
    },
    /// Completed with `status`, replayed until `expires_at`.
    Completed {
        /// The stored response's status.
        status: u16,
        /// When the key is new again.
        expires_at: Timestamp,
    },
}

impl ListedState {
    /// The lease's deadline or the retention's end.
    pub fn deadline(&self) -> Timestamp {
        match self {
            ListedState::InProgress { lease_until } => *lease_until,
            ListedState::Completed { expires_at, .. } => *expires_at,
        }
    }
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Page {
    /// The records, in the selection's order. A store that scans (Redis) may return fewer than
    /// the limit, even none, and still have a next page.
    pub records: Vec<Listed>,
    /// Where the next page starts; `None` when the listing is done.
    pub next: Option<Cursor>,
}

impl Page {
    /// The page of a store that pages by position (SQL, memory): `fetched` holds up to
    /// `limit + 1` records of the selection in its order, from the cursor's position; the one
    /// past the limit, if any, only says that a next page exists, which starts after the last
    /// record kept.
    ///
    /// ```
    /// use idem_ops::Page;
    /// assert_eq!(Page::from_fetched(Vec::new(), 10), Page::default());
    /// ```
    pub fn from_fetched(mut fetched: Vec<Listed>, limit: usize) -> Page {
        let more = fetched.len() > limit;
        fetched.truncate(limit);
        let next = more
            .then(|| fetched.last().map(Cursor::after_record))
            .flatten();
        Page {
            records: fetched,
            next,
        }
    }
}

/// Where a listing resumes: an opaque string a store made, safe to print and to pass on a
/// command line. A cursor from another store or selection is refused, or at worst resumes
/// elsewhere; it never changes anything.
///
/// ```
/// use idem_ops::Cursor;
/// let cursor = Cursor::new("s.0.17");
/// assert_eq!(cursor.as_str(), "s.0.17");
/// assert_eq!(cursor.to_string(), "s.0.17");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Cursor(String);

impl Cursor {
    /// A cursor from its text.
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// Its text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The cursor after `record` in a store that pages by position (the SQL stores and the
    /// memory store): the reservation time and the triple, the order of
    /// [`Selection::InProgress`] (a completed listing orders by route and key, a key's listing
    /// by consumer and route, which the same position also carries).
    pub fn after_record(record: &Listed) -> Self {
        let at = record.reserved_at.map_or(0, Timestamp::as_millis);
        let triple = [record.id.consumer(), record.id.route(), record.id.key()].join("\0");
        Self(format!("p.{at}.{}", hex(triple.as_bytes())))
    }

    /// The position [`Cursor::after_record`] wrote, or [`Error::InvalidInput`] for any other
    /// text.
    pub fn position(&self) -> Result<Position, Error> {
        let bad = || Error::invalid(Field::Cursor, "not a cursor of this store");
        let rest = self.0.strip_prefix("p.").ok_or_else(bad)?;
        let (at, triple) = rest.split_once('.').ok_or_else(bad)?;
        let reserved_at = at
            .parse::<u64>()
            .ok()
            .filter(|at| *at <= Position::LATEST)
            .ok_or_else(bad)?;
        let triple = String::from_utf8(unhex(triple).ok_or_else(bad)?).map_err(|_| bad())?;
        let mut parts = triple.split('\0');
        let (Some(consumer), Some(route), Some(key), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let id = RecordId::new(
            Scope::new(consumer, route).map_err(|_| bad())?,
            IdempotencyKey::new(key).map_err(|_| bad())?,
        );
        Ok(Position { reserved_at, id })
    }
}

impl Position {
    /// The latest reservation time a position may carry: the end of year 9999, in milliseconds
    /// (every store's time type holds it; a later one is not a cursor any store made).
    pub const LATEST: u64 = 253_402_300_799_999;
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A decoded position cursor: the listing resumes strictly after this record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The reservation time in milliseconds since the epoch (0 for none).
    pub reserved_at: u64,
    /// The record's triple.
    pub id: RecordId,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        })
        .collect()
}

/// How many records a store holds, by state, at the store's `now`: what `idem stats` prints.
/// A SQL store counts in one statement (one snapshot); a scanning store (Redis) counts while
/// records come and go, so its figures are approximate under traffic.
///
/// ```
/// use idem_ops::Stats;
/// let stats = Stats::default();
/// assert_eq!(stats.total(), 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Stats {
    /// The store's clock when it counted (C11).
    pub now: Timestamp,
    /// In progress, lease still holding.
    pub in_progress: u64,
    /// In progress, lease passed: taken over by the next attempt, or deleted by the purge.
    pub orphaned: u64,
    /// Completed and replayed.
    pub completed: u64,
    /// Completed, retention passed, not yet purged (behaves as absent, C10).
    pub expired: u64,
    /// When the oldest in-progress record (live or orphaned) was reserved, if any has a time.
    pub oldest_in_progress: Option<Timestamp>,
    /// Completed and replayed with an answer in doubt (counted in `completed` as well): what a
    /// reconciler or an operator has still to settle.
    pub in_doubt: u64,
}

impl Stats {
    /// No records yet, counted at `now`: a store fills in the counts.
    pub fn at(now: Timestamp) -> Self {
        Self {
            now,
            ..Self::default()
        }
    }

    /// Every record held.
    pub fn total(&self) -> u64 {
        self.in_progress + self.orphaned + self.completed + self.expired
    }
}

/// A record as [`Operator::inspect`](crate::Operator::inspect) reads it: the record whole, and its
/// [`Provenance`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspected {
    /// The record, response decoded.
    pub record: Record,
    /// When and by whom.
    pub provenance: Provenance,
    /// For a completed record whose answer is in doubt, its mark (C8); `None` otherwise.
    pub doubt: Option<Doubt>,
    /// For a record in doubt, when it is next due for a check, by the store's clock.
    pub check_at: Option<Timestamp>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(at: Option<u64>, consumer: &str, route: &str, key: &str) -> Listed {
        Listed {
            id: RecordId::new(
                Scope::new(consumer, route).expect("valid"),
                IdempotencyKey::new(key).expect("valid"),
            ),
            reserved_at: at.map(Timestamp::from_millis),
            completed_at: None,
            holder: Noted::Unknown,
            state: ListedState::InProgress {
                lease_until: Timestamp::from_millis(9),
            },
            doubt: None,
            check_at: None,
        }
    }

    #[test]
    fn position_round_trips_any_valid_triple() {
        for record in [
            listed(
                Some(1_700_000_000_000),
                "acct.1",
                "POST /v1/charges?x=1",
                "k-1",
            ),
            listed(
                None,
                "ünïcode consumer",
                "route with . and spaces",
                "~!@#$%",
            ),
        ] {
            let position = Cursor::after_record(&record).position().expect("decodes");
            assert_eq!(position.id, record.id);
            assert_eq!(
                position.reserved_at,
                record.reserved_at.map_or(0, |t| t.as_millis())
            );
        }
    }

    #[test]
    fn foreign_text_is_not_a_position() {
        let far = format!("p.{}.610050005f00", Position::LATEST + 1);
        for text in [
            "",
            "p.",
            "p.1",
            "p.x.00",
            "p.1.0",
            "p.1.zz",
            "p.1.6100",
            "s.0.1",
            "p.1.616263",
            &far,
        ] {
            assert!(Cursor::new(text).position().is_err(), "{text:?}");
        }
    }

    #[test]
    fn limit_is_clamped_and_route_only_filters_completed() {
        assert_eq!(
            ListQuery::in_progress(Duration::ZERO)
                .limit(0)
                .limit_value(),
            1
        );
        assert_eq!(
            ListQuery::in_progress(Duration::ZERO)
                .limit(1_000_000)
                .limit_value(),
            ListQuery::MAX_LIMIT
        );
        assert!(ListQuery::in_progress(Duration::ZERO)
            .route("POST /x")
            .is_err());
        assert!(ListQuery::completed("a").and_then(|q| q.route("")).is_err());
    }
}
