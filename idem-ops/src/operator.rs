//! What operators read of a store beyond the protocol: the [`Operator`] trait. The engine
//! never calls it; the reconciler, the `idem` command and the conformance suite's listing
//! scenarios do.

use crate::listing::{Inspected, ListQuery, Page, Stats};
use crate::provenance::Provenance;
use async_trait::async_trait;
use idem_core::store::Deadline;
use idem_core::store::{Reconciliation, Store};
use idem_core::{Error, RecordId};

use std::sync::Arc;

/// What operators need of a store beyond the protocol: one record with who holds it, bounded
/// pages of records, counts by state. Optional: the engine never calls it; the `idem` command,
/// the operator docs (docs/operations.md) and the conformance suite's listing scenarios do.
///
/// # Contract
///
/// None of these methods writes.
///
/// 1. `inspect` reads one record as [`Store::lookup`] does, with its [`Provenance`]: a store
///    records when each reservation (fresh or taken over) was made and which process made it
///    ([`Holder::this_process`](crate::Holder::this_process)), and when each completion landed,
///    by the store's one clock.
/// 2. `list` returns at most [`ListQuery::limit_value`] records of the [`Selection`](crate::Selection) in the
///    order [`listing_order`](Self::listing_order) says, never a body, and a [`Page::next`]
///    cursor while more may follow (a position store makes it with [`Cursor::after_record`](crate::Cursor::after_record)).
/// 3. `stats` counts by state at the store's `now`.
/// 4. `inspect` and `list` give a record in doubt's mark and next check time
///    ([`Inspected::doubt`], [`Listed::doubt`](crate::Listed::doubt)); `reconciliations` returns the audit trail of
///    one (consumer, route, key): its unexpired entries, oldest first, at most the newest
///    [`ListQuery::MAX_LIMIT`], whatever became of the record (a released record's trail
///    stays).
///
/// ```
/// use idem_ops::{ListQuery, Operator};
/// use idem_core::store::Deadline;
/// use idem_core::MemoryStore;
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_core::Error> {
/// let store = MemoryStore::new();
/// let query = ListQuery::in_progress(Duration::ZERO);
/// let page = store.list(&query, Deadline::default()).await?;
/// assert!(page.records.is_empty() && page.next.is_none());
/// assert_eq!(store.stats(Deadline::default()).await?.total(), 0);
/// # Ok(())
/// # }
/// ```
#[async_trait]
pub trait Operator: Store {
    /// Reads the record for inspection, expired or not, with its [`Provenance`]: when its
    /// reservation was made and its completion landed, and which process holds it (rule 1).
    /// Does not change anything. Default: [`Store::lookup`] with an unknown provenance,
    /// right for a store that keeps none.
    async fn inspect(&self, id: &RecordId, deadline: Deadline) -> Result<Option<Inspected>, Error> {
        Ok(self.lookup(id, deadline).await?.map(|record| Inspected {
            record,
            provenance: Provenance::default(),
            doubt: None,
            check_at: None,
        }))
    }

    /// The audit trail of one record: every reconciliation decision kept, oldest first
    /// (rule 4). Does not change anything.
    async fn reconciliations(
        &self,
        id: &RecordId,
        deadline: Deadline,
    ) -> Result<Vec<Reconciliation>, Error>;

    /// Lists records for operators, one bounded page at a time (rule 2). Does not change
    /// anything.
    async fn list(&self, query: &ListQuery, deadline: Deadline) -> Result<Page, Error>;

    /// Counts the records by state at the store's `now` . Reads every record: an
    /// operator's command, not a health check to run every second (rule 3).
    async fn stats(&self, deadline: Deadline) -> Result<Stats, Error>;

    /// In which order [`list`](Self::list) returns a selection (default
    /// [`ListingOrder::Selection`]).
    fn listing_order(&self) -> ListingOrder {
        ListingOrder::Selection
    }
}

/// In which order an [`Operator::list`] returns records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ListingOrder {
    /// The [`Selection`](crate::Selection)'s order across pages, each record once: the store reads an index from
    /// the cursor's position.
    Selection,
    /// The server's scan order (Redis `SCAN`): each call does a bounded amount of work, a page
    /// may hold fewer records than the limit (even none) before the end, and a record present
    /// for the whole listing appears at least once, in any order, possibly twice.
    Scan,
}

/// Forwards every method of [`Operator`] through a pointer to a store: `Arc<S>`, `Box<S>`,
/// `&S` (idem-core forwards [`Store`]'s the same way). `clippy::missing_trait_methods` is
/// denied on each impl, so a method added to the trait with a default cannot be left to the
/// default here (which would silently drop a store's own version of it).
macro_rules! forward_operator {
    ($($pointer:ty),+) => {$(
        #[deny(clippy::missing_trait_methods)]
        #[async_trait]
        impl<S: Operator + ?Sized> Operator for $pointer {
            async fn inspect(&self, id: &RecordId, deadline: Deadline) -> Result<Option<Inspected>, Error> {
                (**self).inspect(id, deadline).await
            }
            async fn list(&self, query: &ListQuery, deadline: Deadline) -> Result<Page, Error> {
                (**self).list(query, deadline).await
            }
            async fn stats(&self, deadline: Deadline) -> Result<Stats, Error> {
                (**self).stats(deadline).await
            }
            async fn reconciliations(&self, id: &RecordId, deadline: Deadline) -> Result<Vec<Reconciliation>, Error> {
                (**self).reconciliations(id, deadline).await
            }
            fn listing_order(&self) -> ListingOrder {
                (**self).listing_order()
            }
        }
    )+};
}

forward_operator!(Arc<S>, Box<S>, &S);
