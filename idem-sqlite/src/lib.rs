//! # idem-sqlite
//!
//! The embedded idem store: full, atomic idempotency from a local SQLite file, for a service
//! with no database server. The completion is written **in the same transaction as the
//! business effect**, so a crash, a rollback or a lost lease can never leave an effect without
//! its record or a record without its effect.
//!
//! ```
//! use idem_core::{Begin, Idempotency, StoredResponse};
//! use idem_sqlite::SqliteStore;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! # let dir = tempfile::tempdir()?;
//! let idem = Idempotency::new(SqliteStore::open(dir.path().join("app.db")).await?);
//! idem.store().try_call(|db| db.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY)")).await?;
//! let request = idem.request("acct_1", "POST", "/orders").key(Some("o-1")).body(b"{}").build()?;
//! if let Begin::Acquired(lease) = idem.begin(&request).await? {
//!     let (engine, completion) = (idem.clone(), idem.completion(&lease, StoredResponse::new(201, "created")));
//!     // The business write and the completion in one transaction, on the blocking pool.
//!     let sent = idem.store().call(move |db| -> Result<StoredResponse, Box<dyn std::error::Error + Send + Sync>> {
//!         let tx = db.transaction()?;
//!         tx.execute("INSERT INTO orders DEFAULT VALUES", [])?;
//!         engine.store().complete_in(&tx, &completion)?; // LeaseLost: roll back
//!         tx.commit()?;
//!         Ok(completion.into_response())
//!     }).await??;
//!     assert_eq!(sent.status, 201);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Durability is SQLite's, with WAL and the [`Synchronous`] setting you choose; records live
//! in the table `idem_records` unless configured otherwise (see [`schema_sql`]).
#![forbid(unsafe_code)]

mod audit;
mod builder;
mod config;
mod connection;
mod error;
mod migrate;
mod ops;
mod pool;
mod row;
mod sql;
mod store;
mod transactional;
mod unique;

pub use audit::SqliteAudit;
pub use builder::SqliteStoreBuilder;
pub use config::{validate_table_name, Synchronous};
pub use idem_core::InsertOrFetch;
pub use migrate::{schema_sql, SCHEMA_VERSION};
pub use store::SqliteStore;
pub use transactional::{SqliteEffect, SqliteIdempotency, SqliteTransactional};
pub use unique::{insert_or_fetch, unique_violation};

/// The rusqlite version the store is built with, for your own transactions.
pub use rusqlite;
