//! The inbox over a SQLite store, with and without its audit trail (`SqliteAudit`), against
//! another connection (another process) holding SQLite's write lock.
#![cfg(feature = "sqlite")]

use idem_core::{Idempotency, Policy, Timestamp};
use idem_inbox::{Ack, Audit, AuditOutcome, Delivery, Inbox, Receipt, SqliteAudit};
use idem_sqlite::rusqlite::Connection;
use idem_sqlite::SqliteStore;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The store budget of these tests.
const BUDGET: Duration = Duration::from_millis(1500);

/// C5, C13: a duplicate of a processed event is answered from a read, which SQLite (WAL)
/// serves while another process holds the write lock: it never waits for that writer, nor is
/// it refused as store-down, audit trail or not. (With the trail, the delivery's audit write
/// came first and waited for the lock for the whole budget: 503.) The trail's writes land once
/// the lock is gone (`Inbox::drain_audit` waits for them): two deliveries, processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c05_a_duplicate_is_answered_while_another_process_holds_the_write_lock() {
    for audited in [false, true] {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(dir.path().join("inbox.db"))
            .await
            .expect("open store");
        let audit = Arc::new(SqliteAudit::open(&store).await.expect("open audit"));
        let policy = Policy::default().store_timeout(BUDGET);
        let mut inbox = Inbox::new(Idempotency::with_policy(store, policy).expect("policy"));
        if audited {
            inbox = inbox.with_audit(audit.clone());
        }
        let body = br#"{"id":"evt_locked"}"#;
        let event = inbox
            .event_json(&Delivery::trusted("stripe", body), b"evt_locked", &[])
            .expect("event");
        let receive = || inbox.receive(&event, |_ctx| async { Ok::<_, std::io::Error>(Ack::Done) });
        let first = receive().await.expect("received");
        assert!(matches!(first, Receipt::Processed(_)), "{first:?}");

        let other = Connection::open(dir.path().join("inbox.db")).expect("other connection");
        other.execute_batch("BEGIN IMMEDIATE").expect("write lock");
        let started = Instant::now();
        let again = receive().await;
        let took = started.elapsed();
        other.execute_batch("ROLLBACK").expect("unlock");
        assert!(
            matches!(again, Ok(Receipt::Duplicate(_))),
            "audited: {audited}: a processed event's duplicate got {again:?} after {took:?}"
        );
        assert!(
            took < BUDGET / 3,
            "audited: {audited}: waited {took:?} for a writer"
        );
        if !audited {
            continue;
        }
        tokio::time::timeout(BUDGET, inbox.drain_audit())
            .await
            .expect("the trail's writes land once the lock is gone");
        let entries = audit
            .query(
                "stripe",
                Timestamp::from_millis(0),
                Timestamp::from_millis(4_102_444_800_000),
                10,
            )
            .await
            .expect("query");
        let [entry] = entries.as_slice() else {
            panic!("{entries:?}")
        };
        assert_eq!(entry.deliveries, 2, "{entry:?}");
        let outcome = entry.outcome;
        assert_eq!(outcome, AuditOutcome::Processed);
    }
}

/// C5: 30 duplicates at once while another process holds the write lock: each is answered
/// from a read at once, and their 60 audit writes, queued on the store's one writer behind
/// the lock, land in order once it is gone: 31 deliveries, processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c05_concurrent_duplicates_under_a_write_lock_are_all_counted() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("inbox.db"))
        .await
        .expect("open store");
    let audit = Arc::new(SqliteAudit::open(&store).await.expect("open audit"));
    let policy = Policy::default().store_timeout(BUDGET);
    let inbox = Inbox::new(Idempotency::with_policy(store, policy).expect("policy"))
        .with_audit(audit.clone());
    let body = br#"{"id":"evt_many"}"#;
    let event = inbox
        .event_json(&Delivery::trusted("stripe", body), b"evt_many", &[])
        .expect("event");
    let first = inbox
        .receive(&event, |_ctx| async { Ok::<_, std::io::Error>(Ack::Done) })
        .await
        .expect("received");
    assert!(matches!(first, Receipt::Processed(_)), "{first:?}");

    let other = Connection::open(dir.path().join("inbox.db")).expect("other connection");
    other.execute_batch("BEGIN IMMEDIATE").expect("write lock");
    let mut tasks = Vec::new();
    for _ in 0..30 {
        let (inbox, event) = (inbox.clone(), event.clone());
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            let r = inbox
                .receive(&event, |_ctx| async { Ok::<_, std::io::Error>(Ack::Done) })
                .await;
            (r, started.elapsed())
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.expect("join"));
    }
    other.execute_batch("ROLLBACK").expect("unlock");
    for (r, took) in &answers {
        assert!(
            matches!(r, Ok(Receipt::Duplicate(_))) && *took < BUDGET / 3,
            "{r:?} after {took:?}"
        );
    }
    tokio::time::timeout(BUDGET * 2, inbox.drain_audit())
        .await
        .expect("drained");
    let entries = audit
        .query(
            "stripe",
            Timestamp::from_millis(0),
            Timestamp::from_millis(4_102_444_800_000),
            10,
        )
        .await
        .expect("query");
    let [entry] = entries.as_slice() else {
        panic!("{entries:?}")
    };
    assert_eq!(entry.deliveries, 31, "{entry:?}");
    assert_eq!(entry.outcome, AuditOutcome::Processed, "{entry:?}");
}
