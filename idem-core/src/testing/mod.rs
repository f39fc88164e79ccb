//! The conformance suite: one `pub async fn` per scenario, run against every store.
//!
//! A store crate implements [`Harness`] (how to get a store on a fresh namespace) and stamps one
//! `#[tokio::test]` per scenario with [`conformance_tests!`](crate::conformance_tests); a SQL
//! store also implements [`TransactionalHarness`] and stamps the transactional scenarios with
//! [`transactional_tests!`](crate::transactional_tests) (`tokio` with the `macros` and
//! `rt-multi-thread` features must be a dev-dependency):
//!
//! ```
//! use idem_core::testing::Harness;
//! use idem_core::{MemoryStore, RecordId};
//!
//! struct Memory;
//!
//! #[idem_core::store::async_trait]
//! impl Harness for Memory {
//!     type Store = MemoryStore;
//!     async fn store(&self) -> MemoryStore {
//!         MemoryStore::new() // a new store is a namespace of its own
//!     }
//!     async fn corrupt_response(&self, store: &MemoryStore, id: &RecordId) {
//!         assert!(store.overwrite_stored_response(id, b"garbage".to_vec()));
//!     }
//!     async fn corrupt_in_progress(&self, _: &MemoryStore, _: &RecordId) -> bool {
//!         false // an in-progress entry has no response field
//!     }
//! }
//!
//! idem_core::conformance_tests!(Memory);
//! # fn main() {}
//! ```
//!
//! **Isolation.** Every scenario asks the harness for its own store, on a namespace no other
//! scenario, test binary or process uses (a table, a schema, a key prefix), so scenarios run in
//! parallel on one server and from several processes at once, and a purge sees only its own
//! records. Leases and retentions are hundreds of milliseconds and the waits are real sleeps,
//! because server stores take time from the server (C11).
//!
//! **One list.** The scenarios are listed once, in `scenario_list!`; a unit test checks that
//! every `pub async fn` of the scenario files is on it, so none can silently never run.

mod change_feed;
mod elsewhere;
mod heartbeat;
mod read_first;
mod replay_cache;
mod scenarios;
mod transact;
mod transactional;
mod waiting;

pub use change_feed::*;
pub use elsewhere::Elsewhere;
pub use heartbeat::*;
pub use read_first::*;
pub use replay_cache::*;
pub use scenarios::*;
pub use transact::*;
pub use transactional::*;
pub use waiting::*;

/// Sets `lease`'s local deadline (the engine's estimate of when it ends, by the monotonic
/// clock) to `at`: a lease past it gets one attempt at each completion, no retry. For tests of
/// code outside idem-core that watch the engine's retries (its metrics, its events).
pub fn set_local_deadline(lease: &mut crate::Lease, at: std::time::Instant) {
    lease.set_local_deadline(at);
}

use crate::store::{Completion, Deadline, Reservation, Reserved, Store};
use crate::{Error, FencingToken, Fingerprint, IdempotencyKey, Policy, RecordId, Request, Scope};
use std::time::Duration;

/// How the suite gets stores of one backend.
#[crate::store::async_trait]
pub trait Harness: Send + Sync + 'static {
    /// The store under test.
    type Store: Store + 'static;

    /// A store on a namespace that no other call of `store` returns (a new table or schema, a
    /// new key prefix, a new `MemoryStore`); several stores may share a server and a pool.
    async fn store(&self) -> Self::Store;

    /// Overwrites the stored response of the completed record `id` with bytes that do not
    /// decode (for C12).
    async fn corrupt_response(&self, store: &Self::Store, id: &RecordId);

    /// Writes response bytes into the **in-progress** record of `id` (a state no store writes:
    /// a hand edit, a bug of another release), behind the store's back; returns false only for
    /// a store whose records cannot hold that state at all (the memory store's types).
    async fn corrupt_in_progress(&self, store: &Self::Store, id: &RecordId) -> bool;
}

/// What the transactional scenarios need from a SQL store: the business effect and the
/// completion in one transaction of the store's own database.
#[crate::store::async_trait]
pub trait TransactionalHarness: Harness {
    /// In one transaction: insert one business row for `intent`, then write `completion` with
    /// the store's `complete_in`; then commit if `commit` and `complete_in` succeeded, else roll
    /// back. Returns what `complete_in` (or the commit) returned.
    async fn effect_then_complete(
        &self,
        store: &Self::Store,
        intent: &str,
        completion: Completion,
        commit: bool,
    ) -> Result<(), Error>;

    /// How many business rows exist for `intent` (committed ones).
    async fn business_rows(&self, store: &Self::Store, intent: &str) -> usize;
}

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

/// A JSON request of `consumer` with `key` as sent (`{ "amount": n }`) and the same body in
/// canonical form (`{"amount":n}`), the latter carrying the former's fingerprint as its
/// alternative (C3), as idem-tower's canonical JSON builds it.
pub(crate) fn sent_and_canonical(consumer: &str, key: &str, amount: u32) -> (Request, Request) {
    let sent = request(
        consumer,
        key,
        format!("{{ \"amount\": {amount} }}").as_bytes(),
    );
    let canonical = request(consumer, key, format!("{{\"amount\":{amount}}}").as_bytes())
        .with_alternative_fingerprint(*sent.fingerprint());
    (sent, canonical)
}

/// Writes an in-progress record of `request` due in `lease` that no process holds (as a crashed
/// holder leaves it).
pub(crate) async fn orphan<S: Store + ?Sized>(store: &S, request: &Request, lease: Duration) {
    let reservation = Reservation::new(request, lease);
    let written = store
        .reserve(reservation.claim(), Deadline::default())
        .await
        .expect("reserve");
    assert!(matches!(written, Reserved::Written { .. }), "{written:?}");
}

/// A request on any route.
pub fn request_on(consumer: &str, route: &str, key: &str, body: &[u8]) -> Request {
    let scope = Scope::new(consumer, route).expect("the suite's scopes are valid");
    let key = IdempotencyKey::new(key).expect("the suite's keys are valid");
    let fingerprint = Fingerprint::builder().path(route).body(body).finish();
    Request::from_parts(RecordId::new(scope, key), fingerprint, body.len())
}

/// The one list of conformance scenarios: calls `$callback!` with `$args` and the names.
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_conformance_scenarios {
    ($($args:tt)*) => {
        $crate::__idem_dispatch! { [$($args)*]
            c01_invalid_key_is_rejected_and_nothing_is_written,
            c02_scopes_are_isolated,
            c02_scope_parts_cannot_collide,
            c03_concrete_path_is_part_of_the_fingerprint,
            c03_mismatch_on_completed_runs_nothing_and_keeps_the_record,
            c03_mismatch_beats_in_flight,
            c03_a_record_under_the_alternative_fingerprint_is_replayed_from_one_step,
            c04_concurrent_same_key_one_effect,
            c04_concurrent_distinct_keys_all_run,
            c05_in_flight_duplicate_is_answered_at_once,
            c05_a_waiting_duplicate_gets_the_replay_when_the_original_completes,
            c05_a_wait_ends_in_flight_at_its_bound,
            c05_a_duplicate_of_a_released_original_runs_after_waiting,
            c05_waiters_beyond_the_cap_are_answered_at_once,
            c06_completion_is_fenced_and_happens_once,
            c07_sequential_replay_same_bytes_no_new_effect,
            c07_body_meaning_headers_travel_with_the_body,
            c08_nothing_happened_releases_and_retry_runs_once,
            c08_unknown_outcome_keeps_the_key_and_replays_the_answer,
            c08_error_status_response_is_stored_and_replayed,
            c08_a_refusal_before_execution_releases_the_key_and_the_corrected_retry_runs,
            c08_invalid_response_becomes_a_stored_500,
            c08_dropped_caller_does_not_cancel_the_execution,
            c08_panicking_handler_keeps_the_key,
            c09_orphan_is_taken_over_and_stale_holder_fenced_out,
            c09_concurrent_takeover_has_one_winner,
            c09_an_orphan_under_the_alternative_fingerprint_is_taken_over_under_its_own,
            c09_late_completion_and_takeover_never_both_win,
            c09_renew_keeps_a_long_handler_lease,
            c09_slow_handler_keeps_its_lease_without_renewing,
            c10_retention_passed_is_treated_as_new,
            c10_expired_records_leave_in_bounded_batches,
            c12_oversized_body_is_rejected_and_nothing_is_written,
            c12_engine_enforces_its_body_limit_however_the_request_was_built,
            c12_corrupt_record_is_a_typed_error,
            c12_an_in_progress_record_with_a_response_is_corrupt,
            c16_a_store_step_reports_what_it_found_and_never_loops,
            c16_a_read_reports_the_record_and_writes_nothing,
            c04_a_record_changed_after_the_read_is_decided_again,
            c08_a_record_in_doubt_is_reported_in_doubt,
            c07_the_replay_cache_answers_from_memory_never_a_record_in_doubt,
        }
    };
}

/// The one list of transactional scenarios (SQL stores).
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_transactional_scenarios {
    ($($args:tt)*) => {
        $crate::__idem_dispatch! { [$($args)*]
            tx_c06_effect_and_completion_commit_together,
            tx_c06_rollback_leaves_neither_effect_nor_completion,
            tx_c06_lease_lost_rolls_the_effect_back,
            tx_c04_concurrent_same_key_one_business_row,
            tx_c07_completion_in_transaction_is_filtered,
        }
    };
}

/// The one list of the transactional closure's scenarios, run in both modes.
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_transact_scenarios {
    ($($args:tt)*) => {
        $crate::__idem_dispatch! { [$($args)*]
            txc_c06_executed_then_replayed,
            txc_c06_a_held_lease_completes_in_one_transaction,
            txc_c08_an_effect_error_rolls_back_and_the_retry_runs,
            txc_c08_a_panicking_effect_rolls_back_and_the_retry_runs,
            txc_c05_a_duplicate_is_answered_at_once_while_the_effect_runs,
            txc_c04_concurrent_executions_of_one_key_write_one_row,
            txc_c07_committed_answers_are_replayed_from_memory,
            txc_c03_a_record_under_the_alternative_fingerprint_is_the_request_s,
        }
    };
}

/// The one list of change-feed scenarios (stores with a feed).
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_change_feed_scenarios {
    ($($args:tt)*) => {
        $crate::__idem_dispatch! { [$($args)*]
            c05_a_duplicate_waiting_in_another_process_is_woken_by_the_announcement,
            c13_a_listener_terminated_by_the_server_is_replaced_and_wakes_waiters_again,
            c13_a_listener_whose_server_side_vanished_is_replaced_within_its_ping_deadline,
            c13_an_announcement_lost_while_the_listener_was_gone_still_wakes_its_waiter,
        }
    };
}

/// What is done with a scenario list: `[stamp HARNESS]` stamps one `#[tokio::test]` per
/// scenario (the harness expression is evaluated once per test), `[stamp_feed HARNESS]` the same
/// on two workers (the change feeds'), `[stamp_in CRATE, HARNESS]` the same for the scenarios of
/// another crate's `testing` module (idem-ops'); `[names]` is the list of names.
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_dispatch {
    ([names] $($scenario:ident),+ $(,)?) => {
        &[$(stringify!($scenario)),+]
    };
    ([stamp_feed $harness:expr] $($scenario:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let harness = $harness;
                $crate::testing::$scenario(&harness).await;
            }
        )+
    };
    ([stamp_commits $harness:expr, $one_commit:expr] $($scenario:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() {
                let harness = $harness;
                $crate::testing::$scenario(&harness, $one_commit).await;
            }
        )+
    };
    ([stamp $harness:expr] $($scenario:ident),+ $(,)?) => {
        $crate::__idem_dispatch! { [stamp_in $crate, $harness] $($scenario),+ }
    };
    ([stamp_in $krate:tt, $harness:expr] $($scenario:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() {
                let harness = $harness;
                $krate::testing::$scenario(&harness).await;
            }
        )+
    };
}

/// Stamps one `#[tokio::test]` per conformance scenario for a store, given an expression that
/// yields its [`Harness`].
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr $(,)?) => {
        $crate::__idem_conformance_scenarios!(stamp $harness);
    };
}

/// Stamps one `#[tokio::test]` per transactional scenario for a SQL store, given an expression
/// that yields its [`TransactionalHarness`].
#[macro_export]
macro_rules! transactional_tests {
    ($harness:expr $(,)?) => {
        $crate::__idem_transactional_scenarios!(stamp $harness);
    };
}

/// Stamps the transactional closure's scenarios for a SQL store, given an expression that
/// yields its [`TransactHarness`]: once with two commits (module `two_commits`) and once with
/// one (module `one_commit`, C15); `transact_tests!(two_commits: harness)` for a configuration
/// that refuses one commit.
#[macro_export]
macro_rules! transact_tests {
    (two_commits: $harness:expr $(,)?) => {
        mod two_commits {
            #[allow(unused_imports)]
            use super::*;
            $crate::__idem_transact_scenarios!(stamp_commits $harness, false);
        }
    };
    ($harness:expr $(,)?) => {
        mod two_commits {
            #[allow(unused_imports)]
            use super::*;
            $crate::__idem_transact_scenarios!(stamp_commits $harness, false);
        }
        mod one_commit {
            #[allow(unused_imports)]
            use super::*;
            $crate::__idem_transact_scenarios!(stamp_commits $harness, true);
        }
    };
}

/// Stamps one `#[tokio::test]` per change-feed scenario for a store with a feed, given an
/// expression that yields its [`ChangeFeedHarness`].
#[macro_export]
macro_rules! change_feed_tests {
    ($harness:expr $(,)?) => {
        $crate::__idem_change_feed_scenarios!(stamp_feed $harness);
    };
}

#[cfg(test)]
mod tests {
    fn public_fns(source: &str) -> Vec<&str> {
        source
            .lines()
            .filter_map(|line| line.strip_prefix("pub async fn "))
            .filter_map(|rest| rest.split(['<', '(']).next())
            .collect()
    }

    #[test]
    fn every_scenario_is_on_the_one_list() {
        let listed: &[&str] = crate::__idem_conformance_scenarios!(names);
        let tx_listed: &[&str] = crate::__idem_transactional_scenarios!(names);
        let mut defined = public_fns(include_str!("scenarios.rs"));
        defined.extend(public_fns(include_str!("waiting.rs")));
        defined.extend(public_fns(include_str!("read_first.rs")));
        defined.extend(public_fns(include_str!("replay_cache.rs")));
        defined.sort_unstable();
        let mut listed = listed.to_vec();
        listed.sort_unstable();
        assert_eq!(
            defined, listed,
            "scenarios.rs and the conformance list differ"
        );
        let mut tx_defined = public_fns(include_str!("transactional.rs"));
        tx_defined.sort_unstable();
        let mut tx_listed = tx_listed.to_vec();
        tx_listed.sort_unstable();
        assert_eq!(
            tx_defined, tx_listed,
            "transactional.rs and its list differ"
        );
        let mut txc_defined: Vec<&str> = public_fns(include_str!("transact.rs"))
            .into_iter()
            .filter(|name| name.starts_with("txc_"))
            .collect();
        txc_defined.sort_unstable();
        let mut txc_listed = crate::__idem_transact_scenarios!(names).to_vec();
        txc_listed.sort_unstable();
        assert_eq!(txc_defined, txc_listed, "transact.rs and its list differ");
        let mut feed_defined = public_fns(include_str!("change_feed.rs"));
        feed_defined.sort_unstable();
        let mut feed_listed = crate::__idem_change_feed_scenarios!(names).to_vec();
        feed_listed.sort_unstable();
        assert_eq!(
            feed_defined, feed_listed,
            "change_feed.rs and its list differ"
        );
    }
}
