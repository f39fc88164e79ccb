//! The conformance scenarios of what moved beside the engine: the operator reads (inspect,
//! list, stats, provenance) and the reconciliation of records in doubt, one `pub async fn`
//! per scenario, run against every store.
//!
//! A store crate that runs idem-core's suite (`idem_core::testing::Harness`) stamps these
//! scenarios for the same harness with [`operator_tests!`](crate::operator_tests), one
//! `#[tokio::test]` each; its store implements [`Operator`]:
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
//!         MemoryStore::new()
//!     }
//!     async fn corrupt_response(&self, store: &MemoryStore, id: &RecordId) {
//!         assert!(store.overwrite_stored_response(id, b"garbage".to_vec()));
//!     }
//!     async fn corrupt_in_progress(&self, _: &MemoryStore, _: &RecordId) -> bool {
//!         false
//!     }
//! }
//!
//! idem_core::conformance_tests!(Memory);
//! idem_ops::operator_tests!(Memory);
//! # fn main() {}
//! ```
//!
//! The scenarios are listed once, in `operator_scenario_list!`; a unit test checks that every
//! `pub async fn` of the scenario files is on it.

mod holders;
mod listing;
mod provenance;
mod reconcile;

pub use holders::c11_a_takeover_and_a_start_over_record_the_new_holder;
pub use listing::*;
pub use provenance::*;
pub use reconcile::*;

use crate::Operator;
use idem_core::testing::{
    policy, request, request_on, unique_consumer, Harness, LEASE, SHORT_RETENTION,
};

/// A harness of idem-core's suite whose stores have the operator reads: what these scenarios
/// run on. Every such harness is one.
pub trait OperatorHarness: Harness<Store: Operator> {}

impl<H> OperatorHarness for H
where
    H: Harness,
    H::Store: Operator,
{
}

/// The one list of operator scenarios: calls idem-core's `__idem_dispatch!` with `$args` and
/// the names.
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_operator_scenarios {
    ($($args:tt)*) => {
        $crate::__idem_core::__idem_dispatch! { [$($args)*]
            c09_in_progress_records_are_listed_by_age,
            c10_completed_records_are_listed_per_consumer,
            c10_stats_count_records_by_state,
            c11_reservation_time_and_holder_are_recorded_on_reserve_and_takeover,
            c11_completion_time_is_recorded_on_complete,
            c02_lookup_by_key_finds_every_consumer_and_route_bounded,
            c08_doubt_an_unknown_outcome_is_marked_and_listed_oldest_first,
            c08_doubt_settling_stores_the_real_answer_and_the_retry_replays_it,
            c08_doubt_releasing_lets_the_retry_execute_once,
            c08_doubt_still_unknown_backs_off_and_counts_attempts,
            c06_doubt_racing_reconcilers_decide_once,
            c06_doubt_a_decision_about_an_old_execution_cannot_touch_a_new_one,
            c08_doubt_a_pass_settles_and_releases_what_the_reconciler_found,
            c10_doubt_past_its_retention_the_key_is_new_and_not_in_doubt,
            c10_doubt_settling_never_shortens_the_retention,
        }
    };
}

/// Stamps one `#[tokio::test]` per operator scenario for a store, given an expression that
/// yields its [`Harness`] (`tokio` with the `macros` and `rt-multi-thread` features must be a
/// dev-dependency).
#[macro_export]
macro_rules! operator_tests {
    ($harness:expr $(,)?) => {
        $crate::__idem_operator_scenarios!(stamp_in $crate, $harness);
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
        let mut defined = public_fns(include_str!("listing.rs"));
        defined.extend(public_fns(include_str!("provenance.rs")));
        defined.extend(public_fns(include_str!("reconcile.rs")));
        defined.sort_unstable();
        let mut listed = crate::__idem_operator_scenarios!(names).to_vec();
        listed.sort_unstable();
        assert_eq!(defined, listed, "the scenario files and the list differ");
    }
}
