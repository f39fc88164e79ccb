//! # idem-ops
//!
//! What sits beside the engine: the operator reads of a store ([`Operator`]: inspect, list,
//! stats, the reconciliation trail), the decisions about records in doubt ([`reconcile`]), the
//! tasks that run on their own (the periodic purge of expired records, C10, and the reconciler
//! of records in doubt, C8; docs/state-machine.md, "Records in doubt"), and the change-feed
//! loop the server stores run for [`Store::watch`](idem_core::Store::watch) ([`feed`]). The
//! engine never needs any of it; the arrows point from here to idem-core, never back.
//!
//! ```
//! use idem_core::{Failure, Idempotency, MemoryStore, StoredResponse};
//! use idem_ops::reconcile::{Finding, InDoubt};
//! use std::time::Duration;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let idem = Idempotency::new(MemoryStore::new());
//! // Expired records leave every minute; records in doubt are checked every 30 s.
//! let purge = idem_ops::purge_every(&idem, Duration::from_secs(60));
//! let reconciler = |case: InDoubt| async move {
//!     // Ask the provider by the key the handler sent it: `case.downstream_key()`.
//!     Finding::not_happened().asked(case.downstream_key())
//! };
//! let reconciling = idem_ops::reconcile_every(&idem, Duration::from_secs(30), reconciler);
//!
//! let request = idem.request("acct_1", "POST", "/charges").key(Some("k1")).body(b"{}").build()?;
//! let _ = idem.run(&request, |_ctx| async {
//!     Err::<StoredResponse, _>(Failure::unknown("the card network timed out"))
//! }).await;
//! // ... or a pass now, as a test or an operator's command would:
//! let report = idem_ops::reconcile_now(&idem, &reconciler).await?;
//! assert_eq!(report.released, 1);
//!
//! reconciling.stop().await;
//! purge.stop().await;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backoff;
pub mod feed;
mod holder;
mod listing;
mod memory;
mod operator;
mod periodic;
mod provenance;
mod purge;
pub mod reconcile;
mod reconciler;

#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

pub use holder::Holder;
pub use listing::{
    Cursor, Inspected, ListQuery, Listed, ListedState, Page, Position, Selection, Stats,
};
pub use operator::{ListingOrder, Operator};
pub use periodic::Periodic;
pub use provenance::{Noted, Provenance};
pub use purge::purge_every;
pub use reconciler::{
    reconcile_every, reconcile_now, Reconcile, Reconciled, CHECK_DEADLINE, MAX_PER_PASS,
};

#[doc(hidden)]
pub use idem_core as __idem_core;
/// For [`feed_report`]'s logs.
#[doc(hidden)]
pub use tracing as __tracing;
