//! The audit trail's conformance scenarios (the `Audit` contract of
//! [`Audit`]): one `pub async fn` per clause, run against
//! [`MemoryAudit`](crate::MemoryAudit) and every store's audit table, so that the SQL
//! versions are proven to behave as the reference. Each scenario takes a fresh trail.
#![allow(missing_docs)]

use crate::{Audit, AuditEntry, AuditOutcome};
use idem_core::Timestamp;
use std::sync::Arc;

pub fn at(ms: u64) -> Timestamp {
    Timestamp::from_millis(ms)
}

/// Past every time the scenarios use.
pub const END: u64 = 1_000_000;

/// Every entry of `source`.
pub async fn entries(audit: &dyn Audit, source: &str) -> Vec<AuditEntry> {
    audit
        .query(source, at(0), at(END), 1000)
        .await
        .expect("query")
}

/// The one entry of `source`.
pub async fn entry(audit: &dyn Audit, source: &str) -> AuditEntry {
    let mut found = entries(audit, source).await;
    assert_eq!(found.len(), 1, "one entry of {source}: {found:?}");
    found.remove(0)
}

pub fn ids(entries: &[AuditEntry]) -> Vec<&[u8]> {
    entries.iter().map(|e| e.event_id.as_slice()).collect()
}

// The scenarios, one per clause, on any implementation.

pub async fn first_delivery_creates_the_entry_and_later_ones_count(audit: &dyn Audit) {
    audit
        .delivered("stripe", b"evt_1", at(100))
        .await
        .expect("delivered");
    let first = entry(audit, "stripe").await;
    assert_eq!(first.source, "stripe");
    assert_eq!(first.event_id, b"evt_1");
    assert_eq!(
        (first.first_received, first.last_received),
        (at(100), at(100))
    );
    assert_eq!((first.deliveries, first.conflicts), (1, 0));
    assert_eq!(
        (first.outcome, first.processed),
        (AuditOutcome::Received, None)
    );

    audit
        .delivered("stripe", b"evt_1", at(300))
        .await
        .expect("delivered");
    // A delivery timestamped earlier (another process's clock) counts, and moves nothing back.
    audit
        .delivered("stripe", b"evt_1", at(200))
        .await
        .expect("delivered");
    let later = entry(audit, "stripe").await;
    assert_eq!(later.deliveries, 3);
    assert_eq!(
        (later.first_received, later.last_received),
        (at(100), at(300))
    );
    assert_eq!(later.outcome, AuditOutcome::Received);
}

pub async fn settled_processed_is_final_and_failed_does_not_overwrite_it(audit: &dyn Audit) {
    let source = "stripe";
    // No entry, nothing recorded.
    audit
        .settled(source, b"never", AuditOutcome::Processed, at(5))
        .await
        .expect("settled");
    assert!(entries(audit, source).await.is_empty());

    audit
        .delivered(source, b"evt", at(10))
        .await
        .expect("delivered");
    audit
        .settled(source, b"evt", AuditOutcome::Failed, at(20))
        .await
        .expect("settled");
    let failed = entry(audit, source).await;
    assert_eq!(
        (failed.outcome, failed.processed),
        (AuditOutcome::Failed, None)
    );

    audit
        .delivered(source, b"evt", at(30))
        .await
        .expect("delivered");
    audit
        .settled(source, b"evt", AuditOutcome::Processed, at(40))
        .await
        .expect("settled");
    let processed = entry(audit, source).await;
    assert_eq!(
        (processed.outcome, processed.processed),
        (AuditOutcome::Processed, Some(at(40)))
    );

    audit
        .settled(source, b"evt", AuditOutcome::Failed, at(50))
        .await
        .expect("settled");
    audit
        .settled(source, b"evt", AuditOutcome::Processed, at(60))
        .await
        .expect("settled");
    let last = entry(audit, source).await;
    assert_eq!(
        (last.outcome, last.processed, last.deliveries),
        (AuditOutcome::Processed, Some(at(40)), 2)
    );
}

pub async fn conflicts_are_counted_without_changing_the_outcome(audit: &dyn Audit) {
    let source = "stripe";
    audit
        .conflicted(source, b"never", at(5))
        .await
        .expect("conflicted");
    assert!(entries(audit, source).await.is_empty());

    audit
        .delivered(source, b"evt", at(10))
        .await
        .expect("delivered");
    audit
        .conflicted(source, b"evt", at(11))
        .await
        .expect("conflicted");
    audit
        .conflicted(source, b"evt", at(12))
        .await
        .expect("conflicted");
    let received = entry(audit, source).await;
    assert_eq!(
        (received.conflicts, received.deliveries, received.outcome),
        (2, 1, AuditOutcome::Received)
    );

    audit
        .settled(source, b"evt", AuditOutcome::Processed, at(20))
        .await
        .expect("settled");
    audit
        .conflicted(source, b"evt", at(30))
        .await
        .expect("conflicted");
    let processed = entry(audit, source).await;
    assert_eq!(
        (processed.conflicts, processed.outcome, processed.processed),
        (3, AuditOutcome::Processed, Some(at(20)))
    );
    assert_eq!(processed.last_received, at(10));
}

pub async fn query_lists_a_source_in_its_time_range_oldest_first_up_to_the_limit(
    audit: &dyn Audit,
) {
    // Written out of time order: the answer is ordered by first delivery, not by writing.
    for (id, ms) in [("e3", 30), ("e1", 10), ("e4", 40), ("e2", 20)] {
        audit
            .delivered("a", id.as_bytes(), at(ms))
            .await
            .expect("delivered");
    }
    audit
        .delivered("b", b"e2", at(20))
        .await
        .expect("delivered");
    audit
        .delivered("b", b"b1", at(25))
        .await
        .expect("delivered");
    audit
        .delivered("a", b"e1", at(35))
        .await
        .expect("delivered"); // a redelivery: still at 10

    let all = audit.query("a", at(0), at(END), 100).await.expect("query");
    assert_eq!(ids(&all), [&b"e1"[..], b"e2", b"e3", b"e4"]);
    assert!(all.iter().all(|e| e.source == "a"));

    // [from, to): 10 and 40 are out.
    let range = audit.query("a", at(20), at(40), 100).await.expect("query");
    assert_eq!(ids(&range), [&b"e2"[..], b"e3"]);
    let from_inclusive = audit.query("a", at(10), at(11), 100).await.expect("query");
    assert_eq!(ids(&from_inclusive), [&b"e1"[..]]);

    let limited = audit.query("a", at(0), at(END), 2).await.expect("query");
    assert_eq!(ids(&limited), [&b"e1"[..], b"e2"]);
    assert!(audit
        .query("a", at(0), at(END), 0)
        .await
        .expect("query")
        .is_empty());
    assert!(audit
        .query("a", at(40), at(40), 10)
        .await
        .expect("query")
        .is_empty());
    assert!(audit
        .query("c", at(0), at(END), 10)
        .await
        .expect("query")
        .is_empty());

    let b = audit.query("b", at(0), at(END), 100).await.expect("query");
    assert_eq!(ids(&b), [&b"e2"[..], b"b1"]);
}

pub async fn purge_deletes_a_bounded_batch_first_received_before_the_time(audit: &dyn Audit) {
    for (source, id, ms) in [
        ("a", "old1", 10),
        ("b", "old2", 20),
        ("a", "old3", 30),
        ("b", "new", 40),
    ] {
        audit
            .delivered(source, id.as_bytes(), at(ms))
            .await
            .expect("delivered");
    }
    // A late redelivery of an old event does not keep it: first_received decides.
    audit
        .delivered("a", b"old3", at(50))
        .await
        .expect("delivered");

    assert_eq!(audit.purge(at(35), 0).await.expect("purge"), 0);
    assert_eq!(audit.purge(at(35), 2).await.expect("purge"), 2);
    assert_eq!(audit.purge(at(35), 10).await.expect("purge"), 1);
    assert_eq!(audit.purge(at(35), 10).await.expect("purge"), 0);
    assert!(entries(audit, "a").await.is_empty());
    assert_eq!(ids(&entries(audit, "b").await), [&b"new"[..]]);

    // `before` is exclusive.
    assert_eq!(audit.purge(at(40), 10).await.expect("purge"), 0);
    assert_eq!(audit.purge(at(41), 10).await.expect("purge"), 1);
    assert!(entries(audit, "b").await.is_empty());
}

/// Ids as senders may send them: NUL, 0xFF, not UTF-8, empty, 10 KiB long.
pub fn odd_ids() -> Vec<Vec<u8>> {
    vec![
        b"\0".to_vec(),
        b"\0\0".to_vec(),
        vec![0xff],
        vec![0xff, 0xfe, 0x00, b'a'],
        b"evt\0tail".to_vec(),
        Vec::new(),
        (0..10 * 1024).map(|i| (i % 251) as u8).collect(),
        (0..10 * 1024).map(|i| (i % 253) as u8).collect(),
    ]
}

pub async fn event_ids_of_any_bytes_round_trip_exactly(audit: &dyn Audit) {
    let sent = odd_ids();
    for (i, id) in (0u64..).zip(&sent) {
        audit
            .delivered("s", id, at(10 + i))
            .await
            .expect("delivered");
        audit
            .delivered("s", id, at(100 + i))
            .await
            .expect("delivered");
        audit
            .settled("s", id, AuditOutcome::Processed, at(200 + i))
            .await
            .expect("settled");
    }
    let found = entries(audit, "s").await;
    assert_eq!(found.len(), sent.len(), "one entry per id, none merged");
    for (i, (entry, id)) in (0u64..).zip(found.iter().zip(&sent)) {
        assert_eq!(&entry.event_id, id, "id #{i} read back as sent");
        assert_eq!(
            (entry.deliveries, entry.outcome, entry.processed),
            (2, AuditOutcome::Processed, Some(at(200 + i)))
        );
    }
}

pub async fn two_sources_with_the_same_event_id_are_separate(audit: &dyn Audit) {
    audit
        .delivered("stripe", b"evt_1", at(10))
        .await
        .expect("delivered");
    audit
        .delivered("stripe", b"evt_1", at(11))
        .await
        .expect("delivered");
    audit
        .delivered("github", b"evt_1", at(20))
        .await
        .expect("delivered");
    // Sources that differ in case or by a prefix are other sources.
    audit
        .delivered("Stripe", b"evt_1", at(30))
        .await
        .expect("delivered");
    audit
        .delivered("stripe2", b"evt_1", at(40))
        .await
        .expect("delivered");
    audit
        .settled("stripe", b"evt_1", AuditOutcome::Processed, at(50))
        .await
        .expect("settled");
    audit
        .conflicted("github", b"evt_1", at(60))
        .await
        .expect("conflicted");

    let stripe = entry(audit, "stripe").await;
    let github = entry(audit, "github").await;
    assert_eq!(
        (stripe.deliveries, stripe.conflicts, stripe.outcome),
        (2, 0, AuditOutcome::Processed)
    );
    assert_eq!(
        (github.deliveries, github.conflicts, github.outcome),
        (1, 1, AuditOutcome::Received)
    );
    assert_eq!(entry(audit, "Stripe").await.deliveries, 1);
    assert_eq!(entry(audit, "stripe2").await.deliveries, 1);
}

/// 16 deliveries of one event at once, spread over `audits`: exactly 16 counted, one entry.
pub async fn sixteen_concurrent_deliveries_count_exactly_sixteen(audits: Vec<Arc<dyn Audit>>) {
    const TASKS: u64 = 16;
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let audit = Arc::clone(&audits[usize::try_from(task).expect("small") % audits.len()]);
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                audit
                    .delivered("stripe", b"evt_burst", at(1_000 + task))
                    .await
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task").expect("delivered");
    }
    let burst = entry(audits[0].as_ref(), "stripe").await;
    assert_eq!(burst.deliveries, TASKS);
    assert_eq!(burst.last_received, at(1_000 + TASKS - 1));
    assert!(burst.first_received >= at(1_000) && burst.first_received < at(1_000 + TASKS));
}

/// A history that touches every operation; what it leaves must read the same everywhere
/// (first deliveries at distinct times: the contract orders entries by time only).
pub async fn mixed_history(audit: &dyn Audit) -> Vec<Vec<AuditEntry>> {
    /// One call of the history.
    enum Op {
        Delivered,
        Settled(AuditOutcome),
        Conflicted,
    }
    use Op::{Conflicted, Delivered, Settled};
    let history: [(&str, &[u8], Op, u64); 15] = [
        ("stripe", b"a", Delivered, 10),
        ("stripe", b"b\0", Delivered, 20),
        ("github", b"a", Delivered, 30),
        ("stripe", &[0xff; 3], Delivered, 40),
        ("stripe", b"d", Delivered, 50),
        ("github", b"e", Delivered, 60),
        ("stripe", b"a", Delivered, 70),
        ("stripe", b"a", Settled(AuditOutcome::Failed), 71),
        ("stripe", b"a", Delivered, 80),
        ("stripe", b"a", Settled(AuditOutcome::Processed), 81),
        ("stripe", b"a", Settled(AuditOutcome::Failed), 82),
        ("stripe", b"b\0", Settled(AuditOutcome::Failed), 83),
        ("github", b"a", Conflicted, 84),
        ("github", b"e", Settled(AuditOutcome::Processed), 85),
        ("nobody", b"z", Settled(AuditOutcome::Processed), 86),
    ];
    for (source, id, op, ms) in history {
        match op {
            Delivered => audit.delivered(source, id, at(ms)).await,
            Settled(outcome) => audit.settled(source, id, outcome, at(ms)).await,
            Conflicted => audit.conflicted(source, id, at(ms)).await,
        }
        .expect("the history applies");
    }
    let mut reads = vec![
        entries(audit, "stripe").await,
        entries(audit, "github").await,
        audit
            .query("stripe", at(20), at(50), 10)
            .await
            .expect("query"),
        audit
            .query("stripe", at(0), at(END), 2)
            .await
            .expect("query"),
    ];
    assert_eq!(audit.purge(at(35), 100).await.expect("purge"), 3);
    reads.push(entries(audit, "stripe").await);
    reads.push(entries(audit, "github").await);
    reads
}
