//! The inbox (docs/inbox.md): each event processed once, whatever the deliveries; verified
//! before anything is recorded; another payload under the same id never processed.

use idem_core::{Idempotency, MemoryStore, Timestamp};
use idem_inbox::{
    Ack, Audit, AuditOutcome, Delivery, Inbox, MemoryAudit, Receipt, SignatureError,
    SignatureScheme,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

fn inbox() -> (Inbox<MemoryStore>, Arc<MemoryAudit>) {
    let audit = Arc::new(MemoryAudit::default());
    let inbox = Inbox::new(Idempotency::new(MemoryStore::new())).with_audit(audit.clone());
    (inbox, audit)
}

fn payload(id: &str, order: u32) -> Vec<u8> {
    format!(r#"{{"id":"{id}","type":"payment_intent.succeeded","order":{order}}}"#).into_bytes()
}

async fn deliver(
    inbox: &Inbox<MemoryStore>,
    id: &[u8],
    body: &[u8],
    runs: &Arc<AtomicUsize>,
) -> Receipt {
    let event = inbox
        .event(&Delivery::trusted("stripe", body), id)
        .expect("an event");
    let runs = Arc::clone(runs);
    inbox
        .receive(&event, move |_ctx| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
            Ok::<_, std::io::Error>(Ack::Done)
        })
        .await
        .expect("the store answers")
}

async fn entries(audit: &MemoryAudit) -> Vec<idem_inbox::AuditEntry> {
    audit
        .query(
            "stripe",
            Timestamp::from_millis(0),
            Timestamp::from_millis(u64::MAX),
            10_000,
        )
        .await
        .expect("query")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c04_a_thousand_deliveries_of_a_hundred_events_process_each_once() {
    let (inbox, audit) = inbox();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for round in 0..10u32 {
        for n in 0..100u32 {
            let (inbox, runs) = (inbox.clone(), Arc::clone(&runs));
            let n = (n * 37 + round * 11) % 100; // every round in another order
            tasks.push(tokio::spawn(async move {
                let id = format!("evt_{n}");
                loop {
                    let receipt = deliver(&inbox, id.as_bytes(), &payload(&id, n), &runs).await;
                    if receipt.is_acknowledged() {
                        return receipt;
                    }
                    assert!(matches!(receipt, Receipt::InProgress { .. }), "{receipt:?}");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }));
        }
    }
    let mut processed = 0;
    for task in tasks {
        if matches!(task.await.expect("a delivery"), Receipt::Processed(_)) {
            processed += 1;
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 100, "each event ran once");
    assert_eq!(processed, 100);
    let entries = entries(&audit).await;
    assert_eq!(entries.len(), 100);
    assert!(entries
        .iter()
        .all(|e| e.outcome == AuditOutcome::Processed && e.processed.is_some()));
    assert!(entries.iter().map(|e| e.deliveries).sum::<u64>() >= 1000);
}

#[tokio::test]
async fn c07_a_duplicate_of_a_processed_event_is_acknowledged_without_running() {
    let (inbox, _) = inbox();
    let runs = Arc::new(AtomicUsize::new(0));
    let first = deliver(&inbox, b"evt_1", &payload("evt_1", 1), &runs).await;
    let again = deliver(&inbox, b"evt_1", &payload("evt_1", 1), &runs).await;
    assert!(matches!(first, Receipt::Processed(_)));
    assert!(matches!(again, Receipt::Duplicate(_)));
    let http = again.to_http();
    assert_eq!(http.status, 200);
    assert_eq!(http.body, first.to_http().body);
    assert_eq!(http.header("idempotent-replayed"), Some(&b"true"[..]));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c05_a_duplicate_while_the_first_runs_is_told_to_come_back() {
    let (inbox, _) = inbox();
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let event = inbox
        .event(&Delivery::trusted("stripe", b"{}"), b"evt_slow")
        .expect("event");
    let first = tokio::spawn({
        let (inbox, event, started, release) = (
            inbox.clone(),
            event.clone(),
            started.clone(),
            release.clone(),
        );
        async move {
            inbox
                .receive(&event, move |_ctx| async move {
                    started.notify_one();
                    release.notified().await;
                    Ok::<_, std::io::Error>(Ack::Done)
                })
                .await
        }
    });
    started.notified().await;
    let busy = inbox
        .receive(&event, |_ctx| async { Ok::<_, std::io::Error>(Ack::Done) })
        .await
        .expect("answer");
    assert!(matches!(busy, Receipt::InProgress { .. }));
    let http = busy.to_http();
    assert_eq!(http.status, 409);
    assert!(http.header("retry-after").is_some());
    release.notify_one();
    assert!(matches!(
        first.await.expect("join").expect("answer"),
        Receipt::Processed(_)
    ));
}

#[tokio::test]
async fn c08_a_failed_or_panicking_handler_leaves_the_event_retryable() {
    let (inbox, audit) = inbox();
    let event = inbox
        .event(&Delivery::trusted("stripe", b"{}"), b"evt_flaky")
        .expect("event");
    let failed = inbox
        .receive(&event, |_ctx| async {
            Err::<Ack, _>("the database is down")
        })
        .await
        .expect("answer");
    assert!(matches!(&failed, Receipt::Failed(e) if e.contains("database")));
    assert_eq!(failed.to_http().status, 500);
    assert_eq!(entries(&audit).await[0].outcome, AuditOutcome::Failed);
    let panicked = inbox
        .receive(&event, |_ctx| async {
            if true {
                panic!("a bug in the handler");
            }
            Ok::<_, std::io::Error>(Ack::Done)
        })
        .await
        .expect("answer");
    assert!(matches!(panicked, Receipt::Failed(_)));
    let retried = inbox
        .receive(&event, |_ctx| async { Ok::<_, std::io::Error>(Ack::Done) })
        .await
        .expect("answer");
    assert!(matches!(retried, Receipt::Processed(_)));
    let entry = &entries(&audit).await[0];
    assert_eq!(
        (entry.deliveries, entry.outcome),
        (3, AuditOutcome::Processed)
    );
}

#[tokio::test]
async fn c03_the_same_id_with_another_payload_is_never_processed_and_is_visible() {
    let (inbox, audit) = inbox();
    let runs = Arc::new(AtomicUsize::new(0));
    deliver(&inbox, b"evt_1", &payload("evt_1", 1), &runs).await;
    let forged = deliver(&inbox, b"evt_1", &payload("evt_1", 666), &runs).await;
    assert_eq!(forged, Receipt::Conflict);
    assert_eq!(forged.to_http().status, 422);
    assert!(!forged.is_acknowledged());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let entry = &entries(&audit).await[0];
    assert_eq!(
        (entry.conflicts, entry.outcome),
        (1, AuditOutcome::Processed)
    );
    // The original still acknowledges as a duplicate.
    let again = deliver(&inbox, b"evt_1", &payload("evt_1", 1), &runs).await;
    assert!(matches!(again, Receipt::Duplicate(_)));
}

#[tokio::test]
async fn c02_sender_ids_of_any_bytes_and_length_never_collide_and_are_kept() {
    let (inbox, audit) = inbox();
    let runs = Arc::new(AtomicUsize::new(0));
    let long = vec![b'x'; 10 * 1024];
    let ids: Vec<Vec<u8>> = vec![
        b"a".to_vec(),
        b"a\0".to_vec(),
        vec![0xff, 0x00, 0xfe],
        long.clone(),
        [long, b"y".to_vec()].concat(),
    ];
    for id in &ids {
        assert!(matches!(
            deliver(&inbox, id, b"{}", &runs).await,
            Receipt::Processed(_)
        ));
    }
    assert_eq!(runs.load(Ordering::SeqCst), ids.len());
    let mut kept: Vec<Vec<u8>> = entries(&audit)
        .await
        .into_iter()
        .map(|e| e.event_id)
        .collect();
    let mut sent = ids.clone();
    kept.sort();
    sent.sort();
    assert_eq!(kept, sent, "the original ids are in the audit trail");
    // Another source with the same id is another event.
    let other = inbox
        .event(&Delivery::trusted("adyen", b"{}"), b"a")
        .expect("event");
    let receipt = inbox
        .receive(&other, |_ctx| async { Ok::<_, std::io::Error>(Ack::Done) })
        .await
        .expect("answer");
    assert!(matches!(receipt, Receipt::Processed(_)));
}

#[tokio::test]
async fn origin_is_verified_before_anything_is_recorded() {
    let scheme = SignatureScheme::new(["whsec_new", "whsec_old"]).expect("secrets");
    let body = br#"{"id":"evt_1"}"#;
    let now = 1_796_000_000;
    let good = scheme.sign(body, now);
    assert!(Delivery::verified(&scheme, "stripe", Some(&good), body, now).is_ok());
    let old_only = SignatureScheme::new(["whsec_old"])
        .expect("secret")
        .sign(body, now);
    assert!(
        Delivery::verified(&scheme, "stripe", Some(&old_only), body, now).is_ok(),
        "rotation"
    );
    let forged = SignatureScheme::new(["whsec_attacker"])
        .expect("secret")
        .sign(body, now);
    assert_eq!(
        Delivery::verified(&scheme, "stripe", Some(&forged), body, now).err(),
        Some(SignatureError::Mismatch)
    );
    assert!(matches!(
        Delivery::verified(&scheme, "stripe", Some(&good), body, now + 301).err(),
        Some(SignatureError::Stale { .. })
    ));
    assert_eq!(
        Delivery::verified(&scheme, "stripe", None, body, now).err(),
        Some(SignatureError::Missing)
    );
}

#[tokio::test]
async fn the_audit_trail_is_queryable_by_time_and_purged_after_its_retention() {
    let (inbox, audit) = inbox();
    let runs = Arc::new(AtomicUsize::new(0));
    deliver(&inbox, b"evt_1", b"{}", &runs).await;
    assert_eq!(entries(&audit).await.len(), 1);
    assert_eq!(
        inbox
            .purge_audit(Duration::from_secs(3600), 100)
            .await
            .expect("purge"),
        0
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        inbox
            .purge_audit(Duration::from_millis(10), 100)
            .await
            .expect("purge"),
        1
    );
    assert!(entries(&audit).await.is_empty());
}
