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

/// The duplicates delivered at once under the lock.
const DUPLICATES: u64 = 30;

/// C5, C13: duplicates of a processed event are answered from a read, which SQLite (WAL)
/// serves while another process holds the write lock: none waits for that writer, nor is
/// refused as store-down, audit trail or not. (With the trail, the delivery's audit write
/// came first and waited for the lock for the whole budget: 503.) The trail's writes, queued
/// on the store's one writer behind the lock, land in order once it is gone
/// (`Inbox::drain_audit` waits for them): every delivery counted, processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c05_duplicates_are_answered_while_another_process_holds_the_write_lock() {
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
        let first = inbox
            .receive(&event, |_ctx| async { Ok::<_, std::io::Error>(Ack::Done) })
            .await
            .expect("received");
        assert!(matches!(first, Receipt::Processed(_)), "{first:?}");

        let other = Connection::open(dir.path().join("inbox.db")).expect("other connection");
        other.execute_batch("BEGIN IMMEDIATE").expect("write lock");
        let duplicates: Vec<_> = (0..DUPLICATES)
            .map(|_| {
                let (inbox, event) = (inbox.clone(), event.clone());
                tokio::spawn(async move {
                    let started = Instant::now();
                    let again = inbox
                        .receive(&event, |_ctx| async { Ok::<_, std::io::Error>(Ack::Done) })
                        .await;
                    (again, started.elapsed())
                })
            })
            .collect();
        let mut answers = Vec::new();
        for duplicate in duplicates {
            answers.push(duplicate.await.expect("a duplicate"));
        }
        other.execute_batch("ROLLBACK").expect("unlock");
        for (again, took) in &answers {
            assert!(
                matches!(again, Ok(Receipt::Duplicate(_))) && *took < BUDGET / 3,
                "audited: {audited}: {again:?} after {took:?}"
            );
        }
        if !audited {
            continue;
        }
        tokio::time::timeout(BUDGET * 2, inbox.drain_audit())
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
        assert_eq!(entry.deliveries, DUPLICATES + 1, "{entry:?}");
        assert_eq!(entry.outcome, AuditOutcome::Processed, "{entry:?}");
    }
}
