//! # idem-postgres
//!
//! The money store: idem on PostgreSQL through sqlx, with the completion written **in the same
//! transaction as the business effect**, one round trip per answer, and every deadline taken
//! from the server's clock.
//!
//! ```no_run
//! use idem_core::{Idempotency, Outcome, StoredResponse};
//! use idem_postgres::{PgIdempotency, PgStore};
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PgStore::connect("postgres://app@localhost/payments").await?;
//! store.migrate().await?; // or run idem_postgres::schema_sql(..) from your own migrations
//! let idem = Idempotency::new(store);
//! let request = idem.request("acct_42", "POST", "/v1/charges")
//!     .key(Some("8e03978e-40d5-43e8-bc93-6894a57f9324"))
//!     .body(br#"{"cents": 2500}"#)
//!     .build()?;
//! let outcome = idem
//!     .run_in_transaction(&request, |tx, _lease| Box::pin(async move {
//!         sqlx::query("INSERT INTO charges (cents) VALUES (2500)").execute(&mut *tx).await?;
//!         Ok::<_, sqlx::Error>(StoredResponse::new(201, r#"{"charged":2500}"#))
//!     }))
//!     .await?;
//! let sent = outcome.response(); // executed or a replay; `None` in flight or for a mismatch
//! # let _ = sent;
//! # Ok(())
//! # }
//! ```
//!
//! An effect that lives entirely in this database may make one commit instead of two (C15):
//! [`PgIdempotency::run_in_transaction`] of a request made
//! [`with_one_commit(true)`](idem_core::Request::with_one_commit) (or of every request, under
//! [`Policy::one_commit`](idem_core::Policy::one_commit)) reserves inside the effect's
//! transaction, so that nothing of the execution exists until it commits.
//!
//! See the repository's docs/stores.md ("PostgreSQL") for the schema, the isolation levels, the
//! round trips of each path, purge, and running behind PgBouncer.
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod announce;
mod beside;
mod broken_effect;
mod config;
mod connections;
mod deadlines;
mod effect_connection;
mod error;
mod feed_settings;
mod follow_pool;
mod gate;
mod hosts;
mod hosts_url;
mod look_beside;
mod migrate;
mod ops;
mod params;
mod row;
mod session;
mod sql;
mod store;
mod transactional;
mod unique;

pub use config::{validate_identifier, validate_table_name, Isolation};
pub use error::{classify, is_transient, store_error};
pub use migrate::{schema_sql, SCHEMA_VERSION};
pub use params::{Param, StatementMode};
pub use store::{PgStore, PgStoreBuilder};
pub use transactional::{EffectFuture, PgEffect, PgIdempotency, PgTransactional};
pub use unique::{insert_or_fetch, unique_violation};

/// The sqlx version the store is built with, for your own transactions.
pub use sqlx;
