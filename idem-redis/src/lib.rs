//! # idem-redis
//!
//! The fast idem store, on one Redis, a Redis Cluster or Redis under Sentinel.
//!
//! ## Not for money: Redis is not in the same transaction as your effect (C14)
//!
//! The record lives in Redis; your effect lives somewhere else (a database, a payment network,
//! an email provider). Nothing makes the two commit together. If the process dies after the
//! effect and before the completion reaches Redis, the record stays in progress; when its lease
//! passes, the next retry takes it over and **runs the effect again**. Use this store for
//! effects that are harmless to repeat or easy to undo: sending an email or a webhook
//! notification, filling a cache, enqueueing an idempotent job. For charges, orders and
//! anything that moves money, use a store that writes the completion in the effect's own
//! transaction (`idem-postgres`, `idem-sqlite`). Accordingly this store has no `complete_in`.
//!
//! What Redis persistence means for a restart: with no persistence, a restart forgets every
//! record (every key is new again: a retry runs the effect again); with `appendonly yes` and
//! `appendfsync everysec` (Redis's default AOF setting), a crash can lose the last second of
//! reservations and completions; with `appendfsync always`, nothing acknowledged is lost. A
//! failover to a replica can lose what the replica had not received yet (replication is
//! asynchronous): a completion acknowledged to the caller, whose effect then runs again.
//! [`RedisStoreBuilder::wait_for_replica`] narrows that window for completions; it does not
//! close it.
//!
//! ## Layout
//!
//! One key per record: `<prefix>:<hex of the blake3 digest of the length-prefixed (consumer,
//! route, key)>` (default prefix `idem`), so no two triples share a key (C2) and every operation
//! touches one key (a decision about a record in doubt: the record and its audit trail, in one
//! hash slot), which is what a Redis Cluster needs. The value is a hash: `v` (the version of
//! this layout, `1`), `fp` (fingerprint), `tok` (fencing token), `st` (0 in progress, 1
//! completed), `dl` (deadline, ms since the epoch, Redis's clock), `id` (the triple, checked on
//! every read), `at` (when the current reservation was made, fresh or taken over, ms since the
//! epoch, Redis's clock; kept by completion and renewal), `resp` (the stored response), and for
//! an answer in doubt (docs/state-machine.md, "Records in doubt") `dbt` (its mark, as
//! [`Doubt::encode`](idem_core::store::Doubt::encode) writes it) and `dca` (when it is next
//! due for a check, ms since the epoch, Redis's clock). Its TTL
//! is the lease plus a grace period while in progress, the retention once completed; a value
//! that does not decode is an error, never a new execution, and so is one whose state and
//! response disagree (in progress with a response, completed without one), on every read (C12). A record written before `at` was
//! kept has none (the version is still `1`: the field is optional): it lists with no
//! reservation time, and counts as reserved at the epoch, as in the SQL stores. Nor do `dbt` and
//! `dca` change the version: a record without them is not in doubt, and a release that does not
//! know them replays the answer in doubt as it is (its takeovers and start-overs delete them
//! with the record, store rule 6).
//!
//! A record's audit trail, the reconciliation decisions about it, is a list beside it in the
//! same hash slot, `{<record key>}:audit` ([`RedisStore::audit_key_of`]), so a decision and its
//! entry are one script on a Cluster too: each element is `<at>:<kept until>:` (ms, Redis's
//! clock) and the entry as
//! [`Reconciliation::encode`](idem_core::store::Reconciliation::encode) writes it. It keeps
//! the newest 1000 elements and outlives the record; Redis deletes it once its longest-kept
//! entry has passed (an entry past its own time may stay that long: it is no longer read).
//!
//! Every operation is one Lua script (in `idem-redis/lua/`), one round trip, but for the read
//! of [`RedisStoreBuilder::read_first`] (`HMGET` of a record's read header, then `TIME`); the
//! decision is `idem_core`'s, in Rust: the scripts only read, apply a compare-and-set, and
//! write.
//!
//! ## Every call has a deadline (C13)
//!
//! [`RedisStoreBuilder::response_timeout`] (default 2 s) bounds how long a call waits for
//! Redis's answer and [`RedisStoreBuilder::connection_timeout`] (default 2 s) how long
//! (re)connecting may take. A Redis that is down, frozen or unreachable is
//! [`StoreErrorKind::Unavailable`](idem_core::StoreErrorKind::Unavailable) (HTTP 503,
//! retryable) within them, never a hang. Whatever the driver does, no call outlasts one
//! connection timeout plus one response timeout.
//!
//! ## Connections heal (C13)
//!
//! The store's connection is supervised: after three calls fail unavailable close together
//! (a timeout, a lost or refused connection, a cluster that is down), a new connection is
//! opened from scratch in the background (on a Cluster from the seed nodes, the topology read
//! again) and replaces it; callers never wait for it, they go on with the old connection (a
//! 503 within their deadline) until the new one is in place. One rebuild at a time; after
//! each the next waits 100 ms, doubling up to the connection timeout (at most 2 s). This heals
//! what redis-rs does not heal by itself: a connection whose server side is gone without the
//! client hearing of it (only ever a timeout), and a cluster connection that stops
//! reconnecting after a master restart or a resharding under load. Each rebuild is logged at
//! warn on target `idem_redis`. The heartbeat thread's connection is supervised the same way,
//! rebuilt after its first unavailable failure. Every connection has TCP keepalive and, on
//! Linux, a TCP user timeout, so a peer gone silent closes it.
//!
//! ## Sentinel: a failover without a restart (C13)
//!
//! [`RedisStoreBuilder::connect_sentinel`] takes the sentinels' addresses and the master's
//! name. Each connection, rebuilt ones and the change feed's included, asks the sentinels
//! where the master is; a master that died or was demoted (`READONLY`) fails calls
//! unavailable, which rebuilds the connection at the master the sentinels promoted. A task
//! asks a sentinel every second which master it names, and moves a connection that is on
//! another one: a master still running after another was promoted is left within about a
//! second, not when the sentinels demote it.
//!
//! ## A change feed for waiting duplicates (C5)
//!
//! Duplicates that wait for their original
//! ([`Policy::wait_in_flight`](idem_core::Policy::wait_in_flight)) in other processes are woken by
//! its announcement, `PUBLISH <channel> <digest>` through the store's connection, received by
//! each process's feed: a pub/sub connection of its own, which pings itself through the store
//! to find a silent connection, and subscribes again (on a Cluster on the next seed node) with
//! a back-off when it fails; a `PUBLISH` on a Cluster reaches the subscribers of every node.
//! See [`RedisStoreBuilder::channel`] and the settings after it.
//!
//! ## Listing and stats: by scan
//!
//! Redis keeps no index by age or consumer, so [`Operator::list`](idem_ops::Operator::list) scans:
//! `SCAN` with `MATCH <prefix>:*` (glob characters of the prefix escaped) on the one Redis, or
//! on every master of a Cluster in turn, reading each key found with a script that returns its
//! fields and the first bytes of its response (the status), never the body. So a listing comes
//! **in scan order**, not by age or route ([`ListingOrder::Scan`](idem_ops::ListingOrder));
//! each page is **bounded**: at most the limit's records, from a bounded number of scan steps,
//! so a page may be short or even empty before the listing ends (`next` is `None` only at the
//! end); a record present for the whole listing appears at least once, possibly twice. The
//! selection is applied by each node's clock. The cursor names the Cluster master it scans: a
//! listing across a failover or a resharding may have to start again.
//! [`Operator::stats`](idem_ops::Operator::stats) **scans the whole prefix** (every master), in
//! batches of a few hundred keys: its time grows with the number of records, an operator's
//! command, not a health check. Its counts are approximate while records come and go: `SCAN`
//! may return a key twice when the keyspace shrinks during the scan, and records written or
//! expired meanwhile may or may not be counted. Keys under the prefix of another shape (another store whose
//! prefix extends this one's, such as `idem` and `idem:v2`) are not this store's and are
//! skipped; a record of this store that does not decode fails the listing with
//! [`Error::CorruptRecord`](idem_core::Error::CorruptRecord).
//!
//! ```no_run
//! use idem_core::{Failure, Idempotency, StoredResponse};
//! use idem_redis::RedisStore;
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let idem = Idempotency::new(RedisStore::connect("redis://127.0.0.1:6379").await?);
//! let request = idem.request("acct_42", "POST", "/v1/webhooks/deliveries")
//!     .key(Some("evt_1"))
//!     .body(b"{}")
//!     .build()?;
//! let outcome = idem.run(&request, |_ctx| async {
//!     // send the notification (harmless to repeat)
//!     Ok::<_, Failure<std::io::Error>>(StoredResponse::new(202, "sent"))
//! }).await?;
//! # let _ = outcome;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod audit;
mod conn;
mod connections;
mod error;
mod feed;
mod feed_settings;
mod follow;
mod listing;
mod packed;
mod record;
mod resolve;
mod scripts;
mod sentinel;
mod server_identity;
mod store;
mod supervised;
mod tcp;

pub use error::{classify, is_transient};
pub use store::{validate_prefix, RedisStore, RedisStoreBuilder};

/// The redis version the store is built with.
pub use redis;
