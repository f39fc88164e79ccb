//! # idem-sqlite
//!
//! The embedded idem store: full, atomic idempotency from a local SQLite file, for a service
//! with no database server. The completion is written **in the same transaction as the
//! business effect**, so a crash, a rollback or a lost lease can never leave an effect without
//! its record or a record without its effect.
//!
//! ```
//! use idem_core::{Begin, Idempotency};
//! use idem_sqlite::{SqliteIdempotency, SqliteStore};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let idem = Idempotency::new(SqliteStore::open(dir.path().join("app.db")).await?);
//! let request = idem.request("acct_1", "POST", "/orders").key(Some("o-1")).body(b"{}").build()?;
//! if let Begin::Acquired(lease) = idem.begin(&request).await? {
//!     let mut db = idem.store().connect()?;
//!     let tx = db.transaction()?;
//!     // ... the business writes, on `tx` ...
//!     let sent = idem.complete_in(&tx, &lease, idem_core::StoredResponse::new(201, "created"))?;
//!     tx.commit()?;
//!     assert_eq!(sent.status, 201);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Durability is SQLite's, with WAL and the [`Synchronous`] setting you choose; records live
//! in the table `idem_records` unless configured otherwise (see [`schema_sql`]).

mod config;
mod migrate;
mod ops;
mod pool;
mod row;
mod sql;
mod store;
mod transactional;

pub use config::{validate_table_name, Synchronous};
pub use migrate::{schema_sql, SCHEMA_VERSION};
pub use store::{SqliteStore, SqliteStoreBuilder};
pub use transactional::SqliteIdempotency;

/// The rusqlite version the store is built with, for your own transactions.
pub use rusqlite;
