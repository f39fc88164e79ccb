//! # idem
//!
//! Idempotent API requests: a client may retry a payment, an order or a webhook as often as its
//! network forces it to; the effect happens once and the client always sees the same answer.
//!
//! This facade re-exports [`idem_core`] (the state machine, the engine, the reference memory
//! store) at its root, and each backend as a module chosen by Cargo feature:
//!
//! | feature | module | store |
//! |---|---|---|
//! | `sqlite` (default) | [`sqlite`] | `SqliteStore`: embedded, completion in the effect's transaction |
//!
//! ```
//! use idem::{Idempotency, MemoryStore, Outcome, StoredResponse};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let idem = Idempotency::new(MemoryStore::new());
//! let request = idem.request("acct_42", "POST", "/v1/charges").key(Some("k-1")).body(b"{}").build()?;
//! let outcome = idem.run(&request, |_ctx| async {
//!     Ok::<_, std::io::Error>(StoredResponse::new(201, "charged"))
//! }).await?;
//! assert!(matches!(outcome, Outcome::Executed(_)));
//! # Ok(())
//! # }
//! ```

pub use idem_core::*;

/// The embedded SQLite store (feature `sqlite`, on by default); see [`idem_sqlite`].
#[cfg(feature = "sqlite")]
pub mod sqlite {
    pub use idem_sqlite::*;
}

/// The README's Rust examples, compiled and run as doctests so they cannot rot.
#[cfg(all(doctest, feature = "sqlite"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
