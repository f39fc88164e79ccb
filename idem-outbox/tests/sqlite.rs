//! The outbox on SQLite: enqueued in the effect's transaction, delivered by a dispatcher of
//! the same process, woken by the enqueue.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_core::{Idempotency, Outcome, RunError, StoredResponse};
use idem_outbox::{
    DeadReason, DeliveryState, Endpoint, Message, OutboxError, OutboxEvent, OutboxEventKind,
    SqliteOutbox,
};
use idem_sqlite::rusqlite::TransactionBehavior;
use idem_sqlite::{SqliteIdempotency, SqliteStore};
use support::*;

struct Shop {
    _dir: tempfile::TempDir,
    store: SqliteStore,
    outbox: SqliteOutbox,
}

async fn shop() -> Shop {
    let dir = tempfile::tempdir().expect("a directory");
    let store = SqliteStore::open(dir.path().join("shop.db"))
        .await
        .expect("a store");
    store
        .try_call(|db| {
            db.execute_batch("CREATE TABLE charges (id INTEGER PRIMARY KEY, cents INTEGER)")
        })
        .await
        .expect("a table");
    let outbox = SqliteOutbox::open(&store).await.expect("an outbox");
    Shop {
        _dir: dir,
        store,
        outbox,
    }
}

/// Enqueues one message to `endpoint` in a transaction of its own on the store's writer.
async fn enqueue(shop: &Shop, endpoint: &str, n: u32) -> idem_outbox::MessageId {
    let outbox = shop.outbox.clone();
    let endpoint = endpoint.to_owned();
    shop.store
        .call(move |db| {
            let tx = db
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(idem_sqlite::store_error)?;
            let message = Message::json(&serde_json::json!({"type": "charge.succeeded", "n": n}))?
                .to(&endpoint);
            let id = outbox.enqueue(&tx, &message)?;
            tx.commit().map_err(idem_sqlite::store_error)?;
            Ok::<_, OutboxError>(id)
        })
        .await
        .expect("the writer")
        .expect("enqueued")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_rolled_back_effect_sends_nothing_and_committed_one_is_delivered() {
    let shop = shop().await;
    let receiver = Receiver::start().await;
    shop.outbox
        .register(&endpoint(
            "merchant",
            &receiver.url(),
            quick(3, Duration::from_millis(50)),
        ))
        .await
        .expect("registered");
    let dispatching = shop
        .outbox
        .dispatcher()
        .allow_loopback(true)
        .poll_interval(Duration::from_millis(50))
        .start()
        .expect("started");
    let idem = Idempotency::new(shop.store.clone());

    // The effect fails after enqueueing: its transaction rolls back, the message with it.
    let sender = shop.outbox.clone();
    let request = idem
        .request("acct_1", "POST", "/charges")
        .key(Some("k-1"))
        .body(b"{}")
        .build()
        .expect("a request");
    let failed = idem
        .run_in_transaction(&request, move |tx, _lease| {
            tx.execute("INSERT INTO charges (cents) VALUES (500)", [])
                .map_err(|e| e.to_string())?;
            sender
                .enqueue(
                    tx,
                    &Message::bytes("text/plain", "rolled back").to("merchant"),
                )
                .map_err(|e| e.to_string())?;
            Err::<StoredResponse, String>("card declined by the network".into())
        })
        .await;
    assert!(matches!(failed, Err(RunError::Released(_))), "{failed:?}");

    // The effect commits: its message is delivered, signed, with its id.
    let sender = shop.outbox.clone();
    let request = idem
        .request("acct_1", "POST", "/charges")
        .key(Some("k-2"))
        .body(b"{}")
        .build()
        .expect("a request");
    let committed_id = Arc::new(Mutex::new(None));
    let keep = Arc::clone(&committed_id);
    let outcome = idem
        .run_in_transaction(&request, move |tx, _lease| {
            tx.execute("INSERT INTO charges (cents) VALUES (700)", [])
                .map_err(|e| e.to_string())?;
            let id = sender
                .enqueue(
                    tx,
                    &Message::bytes("text/plain", "committed").to("merchant"),
                )
                .map_err(|e| e.to_string())?;
            *keep.lock().map_err(|e| e.to_string())? = Some(id);
            Ok::<_, String>(StoredResponse::new(201, "charged"))
        })
        .await;
    assert!(matches!(outcome, Ok(Outcome::Executed(_))), "{outcome:?}");
    assert!(receiver.wait_for(1, Duration::from_secs(5)).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let received = receiver.received();
    assert_eq!(received.len(), 1, "only the committed message is sent");
    let id = committed_id.lock().expect("id").clone().expect("an id");
    assert_eq!(received[0].id, id.as_str());
    assert_eq!(received[0].body, b"committed");
    assert!(received[0].verified);
    let deliveries = shop.outbox.deliveries(&id).await.expect("deliveries");
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0].state, DeliveryState::Delivered);
    let counts = shop.outbox.counts().await.expect("counts");
    assert_eq!((counts.pending, counts.delayed, counts.dead), (0, 0, 0));
    dispatching.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_receiver_500_then_200_gets_the_same_id_signed_afresh() {
    let shop = shop().await;
    let receiver = Receiver::start().await;
    receiver.plan(|p| p.statuses.extend([500, 503]));
    let endpoint = Endpoint::new("merchant", &receiver.url(), [SECRET, OLD_SECRET])
        .expect("an endpoint")
        .schedule(quick(3, Duration::from_millis(100)));
    shop.outbox.register(&endpoint).await.expect("registered");
    let dispatching = shop
        .outbox
        .dispatcher()
        .allow_loopback(true)
        .start()
        .expect("started");
    let id = enqueue(&shop, "merchant", 1).await;
    assert!(receiver.wait_for(3, Duration::from_secs(5)).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    dispatching.stop().await;

    let received = receiver.received();
    assert_eq!(received.len(), 3);
    assert!(received
        .iter()
        .all(|r| r.id == id.as_str() && r.verified && r.signatures == 2));
    assert!(received.iter().all(|r| r
        .headers
        .iter()
        .any(|(n, v)| n == "content-type" && v == "application/json")));
    // Retries waited for the schedule.
    assert!(received[1].at - received[0].at >= Duration::from_millis(90));
    let delivery = &shop.outbox.deliveries(&id).await.expect("deliveries")[0];
    assert_eq!(
        (delivery.state, delivery.attempts, delivery.last_status),
        (DeliveryState::Delivered, 3, Some(200))
    );
    let attempts = shop.outbox.attempts(delivery.id).await.expect("attempts");
    let statuses: Vec<_> = attempts.iter().map(|a| a.status).collect();
    assert_eq!(statuses, [Some(500), Some(503), Some(200)]);
    assert_eq!(attempts[2].response, br#"{"received":true}"#);
    assert_eq!(receiver.effects().get(id.as_str()), Some(&1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_exhausted_schedule_is_dead_kept_and_reported() {
    let shop = shop().await;
    let receiver = Receiver::start().await;
    receiver.plan(|p| p.statuses.extend([500, 500, 500, 500]));
    shop.outbox
        .register(&endpoint(
            "merchant",
            &receiver.url(),
            quick(2, Duration::from_millis(30)),
        ))
        .await
        .expect("registered");
    let events: Arc<Mutex<Vec<OutboxEvent>>> = Arc::default();
    let seen = Arc::clone(&events);
    let dispatching = shop
        .outbox
        .dispatcher()
        .allow_loopback(true)
        .poll_interval(Duration::from_millis(20))
        .on_event(move |event| seen.lock().expect("events").push(event.clone()))
        .start()
        .expect("started");
    let id = enqueue(&shop, "merchant", 1).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while shop.outbox.counts().await.expect("counts").dead == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    dispatching.stop().await;
    assert_eq!(receiver.received().len(), 3);
    let delivery = &shop.outbox.deliveries(&id).await.expect("deliveries")[0];
    assert_eq!(delivery.state, DeliveryState::Dead);
    assert_eq!(
        shop.outbox
            .attempts(delivery.id)
            .await
            .expect("attempts")
            .len(),
        3
    );
    let kinds: Vec<_> = events
        .lock()
        .expect("events")
        .iter()
        .map(|e| e.kind.clone())
        .collect();
    assert_eq!(
        kinds.last(),
        Some(&OutboxEventKind::Dead(DeadReason::Exhausted))
    );
    assert_eq!(shop.outbox.counts().await.expect("counts").dead, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_gone_and_abort_message_stop_at_once() {
    let shop = shop().await;
    let gone = Receiver::start().await;
    gone.plan(|p| p.statuses.push_back(410));
    let abort = Receiver::start().await;
    abort.plan(|p| {
        p.statuses.push_back(500);
        p.extra_headers.push(("webhook-delivery", "abort-message"));
    });
    for (name, receiver) in [("gone", &gone), ("abort", &abort)] {
        shop.outbox
            .register(&endpoint(
                name,
                &receiver.url(),
                quick(5, Duration::from_millis(20)),
            ))
            .await
            .expect("registered");
    }
    let dispatcher = shop.outbox.dispatcher().allow_loopback(true);
    let first = enqueue(&shop, "gone", 1).await;
    let second = enqueue(&shop, "abort", 2).await;
    assert_eq!(dispatcher.dispatch_due().await.expect("dispatched"), 2);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(dispatcher.dispatch_due().await.expect("dispatched"), 0);
    assert_eq!((gone.received().len(), abort.received().len()), (1, 1));
    for id in [first, second] {
        let delivery = &shop.outbox.deliveries(&id).await.expect("deliveries")[0];
        assert_eq!(
            (delivery.state, delivery.attempts),
            (DeliveryState::Dead, 1)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_first_attempt_starts_within_100ms_p50_on_an_idle_dispatcher() {
    let shop = shop().await;
    let receiver = Receiver::start().await;
    shop.outbox
        .register(&endpoint(
            "merchant",
            &receiver.url(),
            quick(3, Duration::from_millis(50)),
        ))
        .await
        .expect("registered");
    // A slow poll: only the wake-up can be this fast.
    let dispatching = shop
        .outbox
        .dispatcher()
        .allow_loopback(true)
        .poll_interval(Duration::from_secs(5))
        .start()
        .expect("started");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut latencies = Vec::new();
    for n in 0..20 {
        let committed = Instant::now();
        enqueue(&shop, "merchant", n).await;
        assert!(
            receiver
                .wait_for(n as usize + 1, Duration::from_secs(5))
                .await
        );
        let arrived = receiver.received()[n as usize].at;
        latencies.push(arrived.saturating_duration_since(committed));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    dispatching.stop().await;
    let median = p50(latencies.clone());
    eprintln!("sqlite: latency from commit to first attempt: p50 {median:?}, all {latencies:?}");
    assert!(median < Duration::from_millis(100), "{median:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c14_a_transaction_of_another_database_or_an_unknown_endpoint_writes_nothing() {
    let shop = shop().await;
    shop.outbox
        .register(&endpoint(
            "merchant",
            "http://127.0.0.1:9/hooks",
            quick(1, Duration::from_millis(10)),
        ))
        .await
        .expect("registered");
    let other = tempfile::tempdir().expect("a directory");
    let mut foreign =
        idem_sqlite::rusqlite::Connection::open(other.path().join("other.db")).expect("a database");
    let tx = foreign.transaction().expect("a transaction");
    let refused = shop
        .outbox
        .enqueue(&tx, &Message::bytes("text/plain", "x").to("merchant"));
    assert!(
        matches!(refused, Err(OutboxError::NotInEffectTransaction(_))),
        "{refused:?}"
    );
    drop(tx);

    let outbox = shop.outbox.clone();
    let results = shop
        .store
        .call(move |db| {
            let tx = db.transaction().expect("a transaction");
            let unknown = outbox.enqueue(
                &tx,
                &Message::bytes("text/plain", "x")
                    .to("merchant")
                    .to("nobody"),
            );
            let big = outbox.enqueue(
                &tx,
                &Message::bytes("a/b", vec![0u8; 256 * 1024 + 1]).to("merchant"),
            );
            let none = outbox.enqueue(&tx, &Message::bytes("a/b", "x"));
            let _ = tx.commit();
            (unknown, big, none)
        })
        .await
        .expect("the writer");
    assert!(
        matches!(results.0, Err(OutboxError::UnknownEndpoint(_))),
        "{:?}",
        results.0
    );
    assert!(matches!(
        results.1,
        Err(OutboxError::PayloadTooLarge { limit: 262_144, .. })
    ));
    assert!(matches!(results.2, Err(OutboxError::NoEndpoint)));
    let counts = shop.outbox.counts().await.expect("counts");
    assert_eq!((counts.pending, counts.delayed, counts.dead), (0, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_loopback_is_refused_unless_allowed() {
    let shop = shop().await;
    let receiver = Receiver::start().await;
    let by_name = receiver.url().replace("127.0.0.1", "localhost");
    shop.outbox
        .register(&endpoint(
            "literal",
            &receiver.url(),
            quick(1, Duration::from_secs(60)),
        ))
        .await
        .expect("registered");
    shop.outbox
        .register(&endpoint(
            "named",
            &by_name,
            quick(1, Duration::from_secs(60)),
        ))
        .await
        .expect("registered");
    let a = enqueue(&shop, "literal", 1).await;
    let b = enqueue(&shop, "named", 2).await;
    shop.outbox
        .dispatcher()
        .dispatch_due()
        .await
        .expect("dispatched");
    assert!(receiver.received().is_empty());
    for id in [a, b] {
        let delivery = &shop.outbox.deliveries(&id).await.expect("deliveries")[0];
        assert_eq!(
            (delivery.state, delivery.last_status),
            (DeliveryState::Pending, None)
        );
        assert!(delivery.last_error.is_some(), "{delivery:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_operators_list_retry_replay_and_purge_with_the_same_id() {
    let shop = shop().await;
    let receiver = Receiver::start().await;
    receiver.plan(|p| p.statuses.extend([500]));
    shop.outbox
        .register(&endpoint(
            "merchant",
            &receiver.url(),
            quick(0, Duration::from_millis(10)),
        ))
        .await
        .expect("registered");
    let dispatcher = shop.outbox.dispatcher().allow_loopback(true);
    let id = enqueue(&shop, "merchant", 1).await;
    assert!(shop
        .outbox
        .oldest_pending_age()
        .await
        .expect("age")
        .is_some());
    dispatcher.dispatch_due().await.expect("dispatched");
    assert_eq!(shop.outbox.oldest_pending_age().await.expect("age"), None);
    let dead = shop
        .outbox
        .list(DeliveryState::Dead, 10)
        .await
        .expect("listed");
    assert_eq!((dead.len(), &dead[0].message_id), (1, &id));

    // Retry: a fresh schedule, the same id, delivered this time.
    assert_eq!(shop.outbox.retry(&id).await.expect("retried"), 1);
    assert_eq!(
        shop.outbox.retry(&id).await.expect("retried"),
        0,
        "no longer dead"
    );
    dispatcher.dispatch_due().await.expect("dispatched");
    // Replay of a delivered message: one more attempt, same id; the receiver deduplicates.
    assert_eq!(shop.outbox.replay(&id).await.expect("replayed"), 1);
    dispatcher.dispatch_due().await.expect("dispatched");
    let received = receiver.received();
    assert_eq!(received.len(), 3);
    assert!(received.iter().all(|r| r.id == id.as_str()));
    assert_eq!(receiver.effects().get(id.as_str()), Some(&1));
    let delivery = &shop.outbox.deliveries(&id).await.expect("deliveries")[0];
    assert_eq!(delivery.state, DeliveryState::Delivered);
    let attempts = shop.outbox.attempts(delivery.id).await.expect("attempts");
    assert_eq!(
        attempts.iter().map(|a| a.status).collect::<Vec<_>>(),
        [Some(500), Some(200), Some(200)]
    );

    // Kept for its retention, then purged with its attempts.
    let keep = idem_outbox::Retention::default();
    assert_eq!(shop.outbox.purge(keep, 100).await.expect("purged"), 0);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let now = idem_outbox::Retention {
        delivered: Duration::ZERO,
        dead: Duration::from_secs(3600),
    };
    assert_eq!(shop.outbox.purge(now, 100).await.expect("purged"), 1);
    assert!(shop
        .outbox
        .deliveries(&id)
        .await
        .expect("deliveries")
        .is_empty());
    assert!(shop
        .outbox
        .attempts(delivery.id)
        .await
        .expect("attempts")
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_an_endpoint_failing_for_too_long_is_disabled_and_its_deliveries_wait() {
    let shop = shop().await;
    let addr = free_addr().await;
    shop.outbox
        .register(&endpoint(
            "merchant",
            &format!("http://{addr}/hooks"),
            quick(10, Duration::from_millis(1)),
        ))
        .await
        .expect("registered");
    let dispatcher = shop
        .outbox
        .dispatcher()
        .allow_loopback(true)
        .disable_after(Duration::from_millis(30));
    let id = enqueue(&shop, "merchant", 1).await;
    dispatcher.dispatch_due().await.expect("dispatched");
    assert!(shop
        .outbox
        .endpoint("merchant")
        .await
        .expect("read")
        .expect("there")
        .is_enabled());
    tokio::time::sleep(Duration::from_millis(40)).await;
    dispatcher.dispatch_due().await.expect("dispatched");
    let endpoint = shop
        .outbox
        .endpoint("merchant")
        .await
        .expect("read")
        .expect("there");
    assert!(
        !endpoint.is_enabled(),
        "disabled after failing for longer than allowed"
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(
        dispatcher.dispatch_due().await.expect("dispatched"),
        0,
        "its deliveries wait"
    );
    let delivery = &shop.outbox.deliveries(&id).await.expect("deliveries")[0];
    assert_eq!(
        (delivery.state, delivery.attempts),
        (DeliveryState::Pending, 2)
    );
    // Enabled again (registered anew), its deliveries go on.
    let receiver = Receiver::start_on(addr).await;
    shop.outbox
        .register(&endpoint.enabled(true))
        .await
        .expect("registered");
    assert_eq!(dispatcher.dispatch_due().await.expect("dispatched"), 1);
    assert_eq!(receiver.effects().get(id.as_str()), Some(&1));
}

/// An endpoint disabled while its delivery waits a long retry delay, then registered enabled
/// again: the delivery is due at once, as on PostgreSQL, not after the rest of its delay
/// (hours by the default schedule).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_a_reenabled_endpoints_delivery_waiting_a_retry_is_due_at_once() {
    let shop = shop().await;
    let addr = free_addr().await;
    let schedule = idem_outbox::Schedule::new([Duration::from_secs(3600)])
        .and_then(|s| s.jitter(0.0))
        .expect("a schedule");
    shop.outbox
        .register(&endpoint(
            "merchant",
            &format!("http://{addr}/hooks"),
            schedule,
        ))
        .await
        .expect("registered");
    let dispatcher = shop
        .outbox
        .dispatcher()
        .allow_loopback(true)
        .disable_after(Duration::ZERO);
    let id = enqueue(&shop, "merchant", 1).await;
    // The receiver is down: the attempt fails, the next is an hour away, and the endpoint is
    // disabled.
    assert_eq!(dispatcher.dispatch_due().await.expect("dispatched"), 1);
    let endpoint = shop
        .outbox
        .endpoint("merchant")
        .await
        .expect("read")
        .expect("there");
    assert!(!endpoint.is_enabled(), "disabled after its failure");

    let receiver = Receiver::start_on(addr).await;
    shop.outbox
        .register(&endpoint.enabled(true))
        .await
        .expect("registered");
    assert_eq!(
        dispatcher.dispatch_due().await.expect("dispatched"),
        1,
        "due at once when registered enabled again"
    );
    assert_eq!(receiver.effects().get(id.as_str()), Some(&1));
    let delivery = &shop.outbox.deliveries(&id).await.expect("deliveries")[0];
    assert_eq!(
        (delivery.state, delivery.attempts),
        (DeliveryState::Delivered, 2)
    );
}

/// C12 + C17: a claimed delivery whose row cannot be decoded, and one whose endpoint's row
/// cannot be, end dead with the error, reported, never attempted; the delivery claimed with
/// them is delivered by the same claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_undecodable_rows_end_dead_and_hold_up_nothing() {
    let shop = shop().await;
    let receiver = Receiver::start().await;
    for name in ["merchant", "broken"] {
        shop.outbox
            .register(&endpoint(
                name,
                &receiver.url(),
                quick(3, Duration::from_millis(50)),
            ))
            .await
            .expect("registered");
    }
    let bad_row = enqueue(&shop, "merchant", 1).await;
    let bad_endpoint = enqueue(&shop, "broken", 2).await;
    let good = enqueue(&shop, "merchant", 3).await;
    let bad = bad_row.as_str().to_owned();
    shop.store
        .try_call(move |db| {
            db.execute(
                "UPDATE idem_outbox_deliveries SET headers = 'not json' WHERE message_id = ?1",
                [bad],
            )?;
            db.execute(
                "UPDATE idem_outbox_endpoints SET schedule_ms = 'junk' WHERE name = 'broken'",
                [],
            )
        })
        .await
        .expect("corrupted");
    let events: Arc<Mutex<Vec<OutboxEvent>>> = Arc::default();
    let seen = Arc::clone(&events);
    let dispatcher = shop
        .outbox
        .dispatcher()
        .allow_loopback(true)
        .on_event(move |event| seen.lock().expect("events").push(event.clone()));
    assert_eq!(dispatcher.dispatch_due().await.expect("dispatched"), 3);
    let state = |id: &idem_outbox::MessageId| {
        let outbox = shop.outbox.clone();
        let id = id.clone();
        async move { outbox.deliveries(&id).await.expect("read").remove(0) }
    };
    assert_eq!(state(&good).await.state, DeliveryState::Delivered);
    for (id, reason) in [
        (&bad_row, DeadReason::Undecodable),
        (&bad_endpoint, DeadReason::Undecodable),
    ] {
        let delivery = state(id).await;
        assert_eq!(delivery.state, DeliveryState::Dead, "{delivery:?}");
        assert!(delivery.last_error.is_some(), "{delivery:?}");
        // No attempt was made: none is counted against the schedule.
        assert_eq!(delivery.attempts, 0, "{delivery:?}");
        let reported = events
            .lock()
            .expect("events")
            .iter()
            .any(|e| &e.message_id == id && e.kind == OutboxEventKind::Dead(reason));
        assert!(reported, "{:?}", events.lock().expect("events"));
    }
    assert_eq!(receiver.received().len(), 1);
}

/// C17: the deliveries of an endpoint whose row was deleted by hand end dead with a reason
/// (never attempted, never pending forever); the other endpoints' messages keep flowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_deliveries_of_a_deleted_endpoint_end_dead() {
    let shop = shop().await;
    let receiver = Receiver::start().await;
    for name in ["retired", "merchant"] {
        shop.outbox
            .register(&endpoint(
                name,
                &receiver.url(),
                quick(3, Duration::from_millis(50)),
            ))
            .await
            .expect("registered");
    }
    let retired = enqueue(&shop, "retired", 1).await;
    shop.store
        .try_call(|db| {
            db.execute(
                "DELETE FROM idem_outbox_endpoints WHERE name = 'retired'",
                [],
            )
        })
        .await
        .expect("deleted");
    let merchant = enqueue(&shop, "merchant", 2).await;
    let dispatcher = shop.outbox.dispatcher().allow_loopback(true);
    assert_eq!(dispatcher.dispatch_due().await.expect("dispatched"), 2);
    let read = |id| shop.outbox.deliveries(id);
    let gone = read(&retired).await.expect("read").remove(0);
    assert_eq!(gone.state, DeliveryState::Dead, "{gone:?}");
    assert!(gone
        .last_error
        .is_some_and(|e| e.contains("not registered")));
    let delivered = read(&merchant).await.expect("read").remove(0);
    assert_eq!(delivered.state, DeliveryState::Delivered);
    assert_eq!(receiver.received().len(), 1);
}
