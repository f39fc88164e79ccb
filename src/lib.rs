//! # idem
//!
//! Idempotent API requests: a client may retry a payment, an order or a webhook as often as its
//! network forces it to; the effect happens once and the client always sees the same answer.
//!
//! This facade re-exports [`idem_core`] (the state machine, the engine, the reference memory
//! store) and, by Cargo feature, the backends.
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
