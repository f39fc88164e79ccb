//! The audit trail's conformance scenarios (`idem_inbox::testing`) on the reference
//! `MemoryAudit`: every store's audit table runs the same (tests/sqlite_audit.rs,
//! tests/postgres_audit.rs) and must read the same.

use idem_inbox::testing::*;
use idem_inbox::MemoryAudit;
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_audit_passes_the_same_scenarios() {
    first_delivery_creates_the_entry_and_later_ones_count(&MemoryAudit::default()).await;
    settled_processed_is_final_and_failed_does_not_overwrite_it(&MemoryAudit::default()).await;
    conflicts_are_counted_without_changing_the_outcome(&MemoryAudit::default()).await;
    query_lists_a_source_in_its_time_range_oldest_first_up_to_the_limit(&MemoryAudit::default())
        .await;
    purge_deletes_a_bounded_batch_first_received_before_the_time(&MemoryAudit::default()).await;
    event_ids_of_any_bytes_round_trip_exactly(&MemoryAudit::default()).await;
    two_sources_with_the_same_event_id_are_separate(&MemoryAudit::default()).await;
    sixteen_concurrent_deliveries_count_exactly_sixteen(vec![Arc::new(MemoryAudit::default())])
        .await;
}
