//! The operator reads of the reference store, [`MemoryStore`], from what it holds
//! ([`MemoryStore::records`], [`MemoryStore::trail`]).

use crate::holder::Holder;
use crate::listing::{Cursor, Inspected, ListQuery, Listed, ListedState, Page, Selection, Stats};
use crate::operator::Operator;
use crate::provenance::{Noted, Provenance};
use async_trait::async_trait;
use idem_core::store::Deadline;
use idem_core::store::{Doubt, Reconciliation, RecordState};
use idem_core::{Error, MemoryRecord, MemoryStore, RecordId, StoredResponse, Timestamp};

/// Whether `kept` is a live completed record in doubt at `now`.
fn in_doubt(kept: &MemoryRecord, now: Timestamp) -> bool {
    kept.doubt.is_some() && kept.record.is_completed() && kept.record.is_live(now)
}

/// `kept` as a listing shows it (the status only, never the body).
fn listed(kept: &MemoryRecord) -> Result<Listed, Error> {
    Ok(Listed {
        doubt: kept
            .doubt
            .as_ref()
            .map(|(doubt, _)| match Doubt::decode(doubt) {
                Ok(doubt) => Noted::Known(doubt),
                Err(error) => Noted::Unreadable(error.to_string()),
            }),
        check_at: kept.doubt.as_ref().map(|(_, at)| *at),
        id: kept.id.clone(),
        reserved_at: Some(kept.reserved_at),
        completed_at: kept.completed_at,
        holder: Noted::Known(Holder::this_process().clone()),
        state: match &kept.record.state {
            RecordState::InProgress { lease_until } => ListedState::InProgress {
                lease_until: *lease_until,
            },
            RecordState::Completed {
                response,
                expires_at,
            } => ListedState::Completed {
                status: StoredResponse::status_of(response)?,
                expires_at: *expires_at,
            },
        },
    })
}

/// What the memory store knows of who made `kept` and when: everything.
fn provenance(kept: &MemoryRecord) -> Provenance {
    Provenance {
        reserved_at: Some(kept.reserved_at),
        completed_at: kept.completed_at,
        holder: Noted::Known(Holder::this_process().clone()),
    }
}

#[async_trait]
impl Operator for MemoryStore {
    async fn inspect(
        &self,
        id: &RecordId,
        _deadline: Deadline,
    ) -> Result<Option<Inspected>, Error> {
        self.record(id)
            .map(|kept| {
                let provenance = provenance(&kept);
                Ok(Inspected {
                    record: kept
                        .record
                        .try_map_response(|r| StoredResponse::decode(&r))?,
                    provenance,
                    doubt: kept
                        .doubt
                        .as_ref()
                        .map(|(doubt, _)| Doubt::decode(doubt))
                        .transpose()?,
                    check_at: kept.doubt.as_ref().map(|(_, at)| *at),
                })
            })
            .transpose()
    }
    async fn list(&self, query: &ListQuery, _deadline: Deadline) -> Result<Page, Error> {
        let after = query.cursor().map(Cursor::position).transpose()?;
        let records = self.records();
        let now = self.now();
        let by_age = matches!(
            query.selection(),
            Selection::InProgress { .. } | Selection::InDoubt { .. }
        );
        // The selection's order as a sort key, compared with the cursor's position.
        let mut selected: Vec<((u64, &str, &str, &str), &MemoryRecord)> = records
            .iter()
            .filter(|kept| match (query.selection(), &kept.record.state) {
                (Selection::InProgress { older_than }, RecordState::InProgress { .. }) => {
                    kept.reserved_at + *older_than <= now
                }
                (Selection::Completed { consumer, route }, RecordState::Completed { .. }) => {
                    kept.id.consumer() == consumer
                        && route.as_deref().is_none_or(|r| r == kept.id.route())
                        && kept.record.is_live(now)
                }
                (Selection::Key { key }, _) => kept.id.key() == key,
                (Selection::InDoubt { due }, RecordState::Completed { .. }) => {
                    in_doubt(kept, now)
                        && (!due || kept.doubt.as_ref().is_some_and(|(_, at)| *at <= now))
                }
                _ => false,
            })
            .map(|kept| {
                let at = if by_age {
                    kept.reserved_at.as_millis()
                } else {
                    0
                };
                // A key's listing orders by consumer then route: the key is the same in all.
                let id = &kept.id;
                ((at, id.consumer(), id.route(), id.key()), kept)
            })
            .filter(|(order, _)| {
                after.as_ref().is_none_or(|p| {
                    let at = if by_age { p.reserved_at } else { 0 };
                    *order > (at, p.id.consumer(), p.id.route(), p.id.key())
                })
            })
            .collect();
        selected.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let limit = query.limit_value();
        let fetched = selected
            .iter()
            .take(limit.saturating_add(1))
            .map(|(_, kept)| listed(kept))
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(Page::from_fetched(fetched, limit))
    }
    async fn stats(&self, _deadline: Deadline) -> Result<Stats, Error> {
        let records = self.records();
        let now = self.now();
        let mut stats = Stats::at(now);
        for kept in &records {
            let live = kept.record.is_live(now);
            stats.in_doubt += u64::from(in_doubt(kept, now));
            match (kept.record.is_in_progress(), live) {
                (true, true) => stats.in_progress += 1,
                (true, false) => stats.orphaned += 1,
                (false, true) => stats.completed += 1,
                (false, false) => stats.expired += 1,
            }
            if kept.record.is_in_progress() {
                let at = kept.reserved_at;
                stats.oldest_in_progress = Some(stats.oldest_in_progress.map_or(at, |t| t.min(at)));
            }
        }
        Ok(stats)
    }
    async fn reconciliations(
        &self,
        id: &RecordId,
        _deadline: Deadline,
    ) -> Result<Vec<Reconciliation>, Error> {
        let kept = self.trail(id);
        let skip = kept.len().saturating_sub(ListQuery::MAX_LIMIT);
        kept.into_iter()
            .skip(skip)
            .map(|(at, entry)| Reconciliation::decode(at, &entry))
            .collect()
    }
}
