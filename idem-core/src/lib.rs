//! # idem-core
//!
//! The framework-free heart of idem: make API requests idempotent, so that a client may retry
//! a payment as often as its network forces it to and the effect happens once, and the client
//! always sees the same answer.
//!
//! - Types with their rules: [`IdempotencyKey`] (C1), [`Scope`] and [`RecordId`] (C2),
//!   [`Fingerprint`] and [`canonical_json`] (C3), [`StoredResponse`] (C7), [`Policy`],
//!   [`Clock`] (C11), [`FencingToken`] (C6).
//! - The pure state machine: [`decide`] and [`check_fence`].
//! - The [`Store`] trait backends implement, with [`MemoryStore`] as the reference.
//! - The engine [`Idempotency`] that applications call, guard style or closure style.
//! - With feature `testing`: the conformance suite every store runs ([`testing`]).
//!
//! ```
//! use idem_core::{Begin, Idempotency, MemoryStore, StoredResponse};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), idem_core::Error> {
//! let idem = Idempotency::new(MemoryStore::new());
//! let request = idem.request("acct_42", "POST", "/v1/refunds").key(Some("r-1")).body(b"{}").build()?;
//! match idem.begin(&request).await? {
//!     Begin::Acquired(lease) => {
//!         // ... perform the effect ...
//!         let sent = idem.complete(lease, StoredResponse::new(201, "refunded")).await?;
//!         assert_eq!(sent.status, 201);
//!     }
//!     Begin::Replay(stored) => { /* send `stored` with Idempotent-Replayed: true */ }
//!     Begin::InFlight { retry_after } => { /* 409 + Retry-After */ }
//!     Begin::Mismatch => { /* 422 */ }
//! }
//! # Ok(())
//! # }
//! ```

mod begin;
mod clock;
mod codec;
mod decision;
mod engine;
mod error;
mod fingerprint;
mod json;
mod key;
mod memory;
mod outcome;
mod policy;
mod record;
mod request;
mod response;
mod scope;
mod store;
mod token;

#[cfg(feature = "testing")]
pub mod testing;

pub use begin::{Begin, Lease};
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use decision::{check_fence, decide, Acquire, Decision};
pub use engine::{Context, Idempotency};
pub use error::{Error, Field};
pub use fingerprint::{Fingerprint, FingerprintBuilder};
pub use json::canonical_json;
pub use key::IdempotencyKey;
pub use memory::MemoryStore;
pub use outcome::{retry_after_secs, Outcome, RunError};
pub use policy::{InFlightAnswer, Policy};
pub use record::{Record, RecordState};
pub use request::{Request, RequestBuilder};
pub use response::{is_never_stored, StoredResponse};
pub use scope::{RecordId, Scope};
pub use store::Store;
pub use token::FencingToken;

/// Re-exported so that stores implement [`Store`] with the same macro version.
pub use async_trait::async_trait;
