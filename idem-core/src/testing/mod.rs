//! The conformance suite: one `pub async fn` per scenario, run against every store.
//!
//! A store crate stamps one `#[tokio::test]` per scenario with [`conformance_tests!`](crate::conformance_tests)
//! (`tokio` with the `macros` and `rt-multi-thread` features must be a dev-dependency):
//!
//! ```
//! use idem_core::{MemoryStore, RecordId};
//! use std::sync::Arc;
//!
//! idem_core::conformance_tests! {
//!     store: async { MemoryStore::new() },
//!     corrupt: |store: Arc<MemoryStore>, id: RecordId| async move {
//!         // Overwrite the stored response of `id` with bytes that do not decode.
//!         assert!(store.overwrite_stored_response(&id, b"garbage".to_vec()));
//!     },
//! }
//! # fn main() {}
//! ```
//!
//! Each scenario works on a consumer of its own (random), so scenarios run in parallel on one
//! server. Leases and retentions are hundreds of milliseconds and the waits are real sleeps,
//! because server stores take time from the server (C11). Scenarios that need an expired
//! record to stay in place until they look at it are kept apart from the purge scenario by a
//! process-wide lock.

mod scenarios;

pub use scenarios::*;

use crate::{FencingToken, Fingerprint, IdempotencyKey, Policy, RecordId, Request, Scope};
use std::time::Duration;
use tokio::sync::RwLock;

/// The lease the suite uses.
pub const LEASE: Duration = Duration::from_millis(400);
/// The short retention of the retention and purge scenarios.
pub const SHORT_RETENTION: Duration = Duration::from_millis(300);

/// The suite's policy: [`LEASE`], an hour of retention, a 1 KiB body limit.
pub fn policy() -> Policy {
    Policy::default()
        .lease(LEASE)
        .retention(Duration::from_secs(3600))
        .max_body_bytes(1024)
}

/// A consumer no other scenario (or run) uses.
pub fn unique_consumer(scenario: &str) -> String {
    format!("conf-{scenario}-{}", FencingToken::generate())
}

/// A request of `consumer` on route `POST /charges` with `key` and `body`.
pub fn request(consumer: &str, key: &str, body: &[u8]) -> Request {
    request_on(consumer, "POST /charges", key, body)
}

/// A request on any route.
pub fn request_on(consumer: &str, route: &str, key: &str, body: &[u8]) -> Request {
    let scope = Scope::new(consumer, route).expect("the suite's scopes are valid");
    let key = IdempotencyKey::new(key).expect("the suite's keys are valid");
    let fingerprint = Fingerprint::builder().route(route).body(body).finish();
    Request::new(RecordId::new(scope, key), fingerprint)
}

/// Held for reading by scenarios that let records expire and then look at them; held for
/// writing by the purge scenario, which deletes every expired record of the store.
pub(crate) static EXPIRED_RECORDS: RwLock<()> = RwLock::const_new(());

/// Stamps one `#[tokio::test]` per conformance scenario for a store.
///
/// `store` is a future that yields a fresh store value (one per test); `corrupt` is an async
/// closure `(Arc<Store>, RecordId)` that overwrites the stored response of a completed record
/// with bytes that do not decode (for C12).
#[macro_export]
macro_rules! conformance_tests {
    (store: $store:expr, corrupt: $corrupt:expr $(,)?) => {
        $crate::conformance_tests!(@each $store;
            c01_invalid_key_is_rejected_and_nothing_is_written,
            c02_scopes_are_isolated,
            c02_scope_parts_cannot_collide,
            c03_mismatch_on_completed_runs_nothing_and_keeps_the_record,
            c03_mismatch_beats_in_flight,
            c04_concurrent_same_key_one_effect,
            c04_concurrent_distinct_keys_all_run,
            c05_in_flight_duplicate_is_answered_at_once,
            c06_completion_is_fenced_and_happens_once,
            c07_sequential_replay_same_bytes_no_new_effect,
            c08_handler_error_releases_and_retry_runs_once,
            c08_error_status_response_is_stored_and_replayed,
            c09_orphan_is_taken_over_and_stale_holder_fenced_out,
            c09_concurrent_takeover_has_one_winner,
            c09_late_completion_and_takeover_never_both_win,
            c09_renew_keeps_a_long_handler_lease,
            c10_retention_passed_is_treated_as_new,
            c10_purge_deletes_only_expired_records_in_batches,
            c12_oversized_body_is_rejected_and_nothing_is_written,
        );
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn c12_corrupt_record_is_a_typed_error() {
            let store = ::std::sync::Arc::new($store.await);
            $crate::testing::c12_corrupt_record_is_a_typed_error(store, $corrupt).await;
        }
    };
    (@each $store:expr; $($scenario:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() {
                let store = ::std::sync::Arc::new($store.await);
                $crate::testing::$scenario(store).await;
            }
        )+
    };
}
