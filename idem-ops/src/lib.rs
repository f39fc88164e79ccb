//! # idem-ops
//!
//! What runs beside the engine, on tasks of its own: the periodic purge of expired records
//! (C10) and the reconciler of records in doubt (C8; docs/state-machine.md, "Records in
//! doubt"). The engine never needs them; they use it and the store's operator reads
//! ([`Operator`](idem_core::store::Operator)), never the other way.
//!
//! ```
//! use idem_core::reconcile::{Finding, InDoubt};
//! use idem_core::{Failure, Idempotency, MemoryStore, StoredResponse};
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

mod periodic;
mod purge;
mod reconcile;

pub use periodic::Periodic;
pub use purge::purge_every;
pub use reconcile::{
    reconcile_every, reconcile_now, Reconcile, Reconciled, CHECK_DEADLINE, MAX_PER_PASS,
};
