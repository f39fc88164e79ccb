//! # idem
//!
//! Idempotent API requests: a client may retry a payment, an order or a webhook as often as its
//! network forces it to; the effect happens once and the client always sees the same answer.
//!
//! This facade re-exports what applications use of [`idem_core`] at its root (the engine, the
//! request, the answers, the reference memory store), what records and stores are made of as
//! [`store`], the engine's [`events`], and each backend as a module chosen by Cargo feature:
//!
//! | feature | module | store |
//! |---|---|---|
//! | `sqlite` (default) | `sqlite` | `SqliteStore`: embedded, completion in the effect's transaction (`sqlite-system`: the same, linked against the system's libsqlite3) |
//! | `postgres` | `postgres` | `PgStore`: PostgreSQL (sqlx), completion in the effect's transaction |
//! | `redis` | `redis` | `RedisStore`: one Redis or a cluster; not atomic with the effect, for reversible effects |
//!
//! and the HTTP layer: feature `tower` (on by default) gives `idem::tower::IdempotencyLayer` for any tower or
//! hyper service; feature `axum` adds its axum integration (the `Reservation` extractor).
//!
//! ```
//! use idem::{Failure, Idempotency, MemoryStore, Outcome, StoredResponse};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let idem = Idempotency::new(MemoryStore::new());
//! let request = idem.request("acct_42", "POST", "/v1/charges").key(Some("k-1")).body(b"{}").build()?;
//! let outcome = idem.run(&request, |_ctx| async {
//!     Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "charged"))
//! }).await?;
//! assert!(matches!(outcome, Outcome::Executed(_)));
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(doctest)]
mod doctests;

pub use idem_core::{
    media_type, Answer, Begin, Completion, Context, Error, Failure, Idempotency,
    IdempotencyBuilder, IdempotencyKey, KeepAlive, Lease, MemoryStore, Outcome, Policy,
    ReplayCache, Reply, Request, RequestBuilder, RunError, StoredResponse,
};

/// Operations beside the engine ([`idem_ops`]): the operator reads ([`Operator`](idem_ops::Operator):
/// list, stats, inspect, the audit trail), records in doubt and their reconciliation
/// ([`idem_ops::reconcile`], its items re-exported here), the reconciler's and the purge's
/// periodic runs, and the change-feed loop of the server stores ([`idem_ops::feed`]).
pub mod ops {
    pub use idem_ops::reconcile::*;
    pub use idem_ops::*;
}

/// What the engine reports as it runs (C16): events, their observers (tracing's by default, the
/// `metrics` feature's), and the count of duplicates waiting now.
pub mod events {
    pub use idem_core::{waiting_now, Event, EventKind, Observer, Operation, TracingObserver};

    /// Metrics through the `metrics` facade (feature `metrics`): the `Metrics` observer of the
    /// engine's events; see [`idem_metrics`].
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub use idem_metrics as metrics;
}

/// Inbound events (webhooks) processed once when the sender chooses the key: the inbox, its
/// signature check and its audit trail (feature `inbox`); see [`idem_inbox`].
#[cfg(feature = "inbox")]
#[cfg_attr(docsrs, doc(cfg(feature = "inbox")))]
pub use idem_inbox as inbox;

/// Outbound messages an effect sends, enqueued in its transaction and delivered signed with a
/// stable id (feature `outbox`; C17); see [`idem_outbox`].
#[cfg(feature = "outbox")]
#[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
pub use idem_outbox as outbox;

/// What records are made of and what stores take, for store writers and for code generic over
/// a store: the [`Store`](idem_core::Store) trait and its contract, records, tokens,
/// fingerprints, clocks, the store errors; see [`idem_core::store`].
pub mod store {
    pub use idem_core::store::*;
    pub use idem_core::{
        is_always_stored, is_never_stored, Clock, FencingToken, Field, Fingerprint,
        FingerprintBuilder, ManualClock, RecordId, Scope, Store, StoreError, StoreErrorKind,
        SystemClock, Timestamp,
    };
    pub use idem_ops::Holder;
}

/// The embedded SQLite store (feature `sqlite`, on by default); see [`idem_sqlite`].
#[cfg(feature = "sqlite-system")]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "sqlite-system"))))]
pub mod sqlite {
    pub use idem_sqlite::*;
    // The inbox's audit trail beside the store's records (idem-inbox's, with `inbox`).
    #[cfg(feature = "inbox")]
    #[cfg_attr(docsrs, doc(cfg(feature = "inbox")))]
    pub use idem_inbox::SqliteAudit;
}

/// The PostgreSQL store (feature `postgres`); see [`idem_postgres`].
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres {
    pub use idem_postgres::*;
    // The inbox's audit trail beside the store's records (idem-inbox's, with `inbox`).
    #[cfg(feature = "inbox")]
    #[cfg_attr(docsrs, doc(cfg(feature = "inbox")))]
    pub use idem_inbox::PgAudit;
}

/// The Redis store (feature `redis`), for reversible effects only; see [`idem_redis`].
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis {
    pub use idem_redis::*;
}

/// The HTTP layer (feature `tower`; `axum` adds the axum integration, `tonic` the gRPC layer)
/// and its canonical bodies (`canonical::canonical_json`, `canonical::canonical_form`); see
/// [`idem_tower`].
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower {
    pub use idem_tower::*;
}

/// docs/http.md's Rust examples, compiled and run as doctests so they cannot rot.
#[cfg(all(doctest, feature = "axum", feature = "sqlite", feature = "postgres"))]
#[doc = include_str!("../docs/http.md")]
pub struct HttpDocDoctests;

/// The README's Rust examples, compiled and run as doctests so they cannot rot.
#[cfg(all(doctest, feature = "sqlite", feature = "postgres", feature = "axum"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
