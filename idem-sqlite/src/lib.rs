//! # idem-sqlite
//!
//! The embedded idem store: full, atomic idempotency from a local SQLite file, for a service
//! with no database server. The completion is written **in the same transaction as the
//! business effect**, so a crash, a rollback or a lost lease can never leave an effect without
//! its record or a record without its effect.
//!
//! ```
//! use idem_core::{Begin, Idempotency, StoredResponse};
//! use idem_sqlite::{rusqlite, SqliteStore};
//! type BoxError = Box<dyn std::error::Error + Send + Sync>;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! # let dir = tempfile::tempdir()?;
//! let idem = Idempotency::new(SqliteStore::open(dir.path().join("app.db")).await?);
//! idem.store().try_call(|db| db.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY)")).await?;
//! let request = idem.request("acct_1", "POST", "/orders").key(Some("o-1")).body(b"{}").build()?;
//! if let Begin::Acquired(lease) = idem.begin(&request).await? {
//!     // The business write and the completion in one transaction on the writer, off the
//!     // async executor; an error (a lost lease included) rolled both back.
//!     let completion = idem.complete_transaction(&lease, Box::new(|tx, _lease| {
//!         tx.execute("INSERT INTO orders DEFAULT VALUES", [])?;
//!         Ok::<_, rusqlite::Error>(StoredResponse::new(201, "created"))
//!     })).await?;
//!     idem.committed(&completion);
//!     assert_eq!(completion.response().status, 201);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! The closure style, reservation included, is [`SqliteIdempotency::run_in_transaction`];
//! [`SqliteStore::complete_in`] writes a completion in a transaction of your own.
//!
//! Durability is SQLite's, with WAL and the [`Synchronous`] setting you choose; records live
//! in the table `idem_records` unless configured otherwise (see [`schema_sql`]).
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod builder;
mod claim;
mod commit_watch;
mod config;
mod connection;
mod error;
mod lane;
mod migrate;
mod opened;
mod ops;
mod pool;
mod process_lock;
mod row;
mod sql;
mod store;
mod transactional;
mod unique;

pub use builder::SqliteStoreBuilder;
pub use config::{validate_table_name, Synchronous};
pub use error::{classify, is_transient, store_error};
pub use migrate::{schema_sql, SCHEMA_VERSION};
pub use store::SqliteStore;
pub use transactional::{SqliteEffect, SqliteIdempotency, SqliteTransactional};
pub use unique::{insert_or_fetch, unique_violation};

/// The rusqlite version the store is built with, for your own transactions.
pub use rusqlite;
