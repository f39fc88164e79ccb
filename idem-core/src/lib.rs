//! The framework-free heart of idem: a client may retry a request as often as its network
//! forces it to; the effect happens once, and the client always sees the same answer. The
//! rules C1..C17 and the state machine are in the repository's docs/state-machine.md.
//!
//! - Types with their rules: [`IdempotencyKey`] (C1), [`Scope`] and [`RecordId`] (C2),
//!   [`Fingerprint`] (C3), [`FencingToken`] (C6), [`StoredResponse`] (C7), [`Clock`] (C11),
//!   [`Policy`]. Bodies are hashed as given; canonical forms are idem-tower's `canonical`.
//! - The engine [`Idempotency`]: closure style ([`Idempotency::run`]) or guard style
//!   ([`Idempotency::begin`]); an answer that ran nothing is an [`Answer`].
//! - The [`Store`] trait and, in [`store`], what implementing it takes; [`MemoryStore`] is the
//!   reference. With feature `testing`: the conformance suite every store runs (`testing`).
//!
//! ```
//! use idem_core::{Begin, Idempotency, MemoryStore, StoredResponse};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
//! let idem = Idempotency::new(MemoryStore::new());
//! let request = idem.request("acct_42", "POST", "/v1/refunds").key(Some("r-1")).body(b"{}").build()?;
//! match idem.begin(&request).await? {
//!     Begin::Acquired(lease) => {
//!         // ... perform the effect ...
//!         let sent = idem.complete(lease, StoredResponse::new(201, "refunded")).await?;
//!         assert_eq!(sent.status, 201);
//!     }
//!     Begin::Answered(_answer) => {} // a replay, in flight, or a mismatch
//! }
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod answer;
mod begin;
mod budget;
mod changes;
mod clock;
mod codec;
mod completion;
mod deadline;
mod decision;
mod doubt;
mod engine;
mod error;
mod event;
mod event_kind;
mod fingerprint;
mod heartbeat_thread;
mod hex;
mod key;
mod lease;
mod memory;
mod outcome;
mod policy;
mod problem;
mod record;
mod replay_cache;
mod request;
mod reservation;
mod resolution;
mod response;
mod scope;
pub mod store;
mod store_call;
mod timeout;
mod token;
mod trail;
mod unique;
mod unwind;
mod wire_key;

#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

pub use answer::Answer;
pub use begin::Begin;
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use completion::Completion;
pub use engine::{waiting_now, Context, Idempotency, IdempotencyBuilder, KeepAlive};
pub use error::{Error, Field, StoreError, StoreErrorKind};
pub use event::{Event, EventKind, Observer, Operation, TracingObserver};
pub use fingerprint::media_type;
pub use fingerprint::{Fingerprint, FingerprintBuilder};
pub use key::IdempotencyKey;
pub use lease::Lease;
pub use memory::{MemoryRecord, MemoryStore};
pub use outcome::{Failure, Outcome, Reply, RunError};
pub use policy::Policy;
pub use replay_cache::ReplayCache;
pub use request::{Request, RequestBuilder};
pub use response::{is_always_stored, is_never_stored, StoredResponse};
pub use scope::{RecordId, Scope};
pub use store::Store;
pub use token::FencingToken;
