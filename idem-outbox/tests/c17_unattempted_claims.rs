//! C12 + C17: claims that send nothing (their endpoint cannot be read): given back, due again
//! after the poll interval, never in a tight loop; a row that will never be readable ends dead,
//! reported once, never pending forever.

mod support;

use std::time::{Duration, Instant};

use idem_outbox::DeliveryState;
use support::*;

/// C12 + C17: on SQLite an endpoint's `timeout_ms` holding text (a row written by hand, a bad
/// migration) is undecodable, not the database failing for a moment: its delivery ends dead
/// (`Undecodable`), as one with a bad `schedule_ms` does, never claimed and given back on every
/// pass (a decoding error once read as a store error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_sqlite_an_endpoint_column_of_the_wrong_type_ends_dead_not_given_back_forever() {
    let dir = tempfile::tempdir().expect("a directory");
    let receiver = Receiver::start().await;
    let (store, outbox, id) = sqlite_with_one_message(dir.path(), "broken", &receiver.url()).await;
    store
        .try_call(|db| {
            db.execute(
                "UPDATE idem_outbox_endpoints SET timeout_ms = 'two seconds' WHERE name = 'broken'",
                [],
            )
        })
        .await
        .expect("corrupted");
    let dispatcher = outbox.dispatcher().allow_loopback(true);
    let mut taken = Vec::new();
    for _ in 0..20 {
        taken.push(dispatcher.dispatch_due().await.expect("dispatched"));
        if outbox.deliveries(&id).await.expect("read")[0].state != DeliveryState::Pending {
            break;
        }
    }
    let delivery = outbox.deliveries(&id).await.expect("read").remove(0);
    assert_eq!(
        delivery.state,
        DeliveryState::Dead,
        "after {} claims ({taken:?}) the delivery is {delivery:?}: given back each time, \
         never attempted ({} requests), never ended",
        taken.len(),
        receiver.received().len()
    );
}

/// C17 + docs/outbox.md ("a database that does not answer is an error (logged, the claim ...
/// tried again later), never a hang"): while the database cannot answer the endpoint's read
/// (its `secrets` column renamed by a migration under way: `Misconfigured`, not the row's
/// fault, so never dead), each claim is given back and the delivery is due again only after
/// the poll interval: a handful of claims a second, not the thousands of a pass that counted
/// a claim given back as work and looped at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_a_claim_given_back_is_not_reclaimed_in_a_hot_loop() {
    use idem_postgres::sqlx;
    let (_url, store, outbox, _receiver) = pg_with_endpoint("merchant", 3).await;
    let id = enqueue(&store, &outbox, "merchant", 0).await;
    for statement in [
        "CREATE TABLE claims_seen (at timestamptz NOT NULL DEFAULT clock_timestamp())",
        "CREATE FUNCTION count_claims() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           IF NEW.claim_token IS NOT NULL AND NEW.claim_token IS DISTINCT FROM OLD.claim_token \
           THEN INSERT INTO claims_seen DEFAULT VALUES; END IF; RETURN NEW; END $$",
        "CREATE TRIGGER count_claims AFTER UPDATE ON idem_outbox_deliveries \
           FOR EACH ROW EXECUTE FUNCTION count_claims()",
        // The endpoint cannot be read for now; the claim (name, enabled) still works.
        "ALTER TABLE idem_outbox_endpoints RENAME COLUMN secrets TO secrets_migrating",
    ] {
        sqlx::raw_sql(statement)
            .execute(store.pool())
            .await
            .expect("set up");
    }
    let dispatching = outbox
        .dispatcher()
        .allow_loopback(true)
        .poll_interval(Duration::from_secs(1))
        .start()
        .expect("started");
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    dispatching.stop().await;
    let elapsed = started.elapsed();
    let claims: i64 = sqlx::query_scalar("SELECT count(*) FROM claims_seen")
        .fetch_one(store.pool())
        .await
        .expect("counted");
    let delivery = outbox.deliveries(&id).await.expect("read").remove(0);
    // A transient failure must not kill it (this holds).
    assert_eq!(delivery.state, DeliveryState::Pending, "{delivery:?}");
    assert!(
        claims <= 10,
        "{claims} claims of one undeliverable-for-now delivery in {elapsed:?} (poll interval \
         1 s): the dispatcher re-claims a claim it gave back with no pause"
    );
}

/// C17 ("a delivery whose schedule runs out is marked dead, never dropped", "reported"): a
/// delivery ended dead without an attempt (its endpoint deleted: `DeadReason::NoEndpoint`)
/// whose statement landed but whose answer was lost (the dispatcher's deadline ran out first)
/// is still reported dead, once: the dispatcher checks such ends before its next claims, as
/// `record` checks a lost answer with `landed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_a_dead_end_whose_answer_was_lost_is_still_reported() {
    lost_dead_end_is_reported(false).await;
}

/// C12 + C17: the dead end of a lost answer is confirmed by its own delivery's row: another
/// delivery of the same message whose row cannot be decoded (a state written by hand) does not
/// hide it, and it is still reported once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_a_lost_dead_end_is_reported_beside_an_undecodable_delivery() {
    lost_dead_end_is_reported(true).await;
}

/// A message to endpoint `retired`, deleted by hand, and, with `neighbour`, to `kept` too,
/// whose delivery's state is then made undecodable: the dispatcher's dead end of `retired`'s
/// delivery lands after its answer was lost, and it is reported dead once.
async fn lost_dead_end_is_reported(neighbour: bool) {
    use std::sync::{Arc, Mutex};

    use idem_outbox::{OutboxEvent, OutboxEventKind};
    use idem_postgres::sqlx;
    let (_url, store, outbox, receiver) = pg_with_endpoint("retired", 3).await;
    let mut message = idem_outbox::Message::json(&serde_json::json!({"type": "charge.succeeded"}))
        .expect("json")
        .to("retired");
    if neighbour {
        outbox
            .register(&endpoint(
                "kept",
                &receiver.url(),
                quick(3, Duration::from_millis(50)),
            ))
            .await
            .expect("registered");
        message = message.to("kept");
    }
    let mut tx = store.pool().begin().await.expect("a transaction");
    let id = outbox.enqueue(&mut tx, &message).await.expect("enqueued");
    tx.commit().await.expect("committed");
    for statement in [
        "UPDATE idem_outbox_deliveries SET state = 'shelved' WHERE endpoint = 'kept'",
        "DELETE FROM idem_outbox_endpoints WHERE name = 'retired'",
        // A slow moment of the database as the dead end is written: it lands, late.
        "CREATE FUNCTION slow_dead() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           PERFORM pg_sleep(1); RETURN NEW; END $$",
        "CREATE TRIGGER slow_dead AFTER UPDATE ON idem_outbox_deliveries FOR EACH ROW \
           WHEN (NEW.state = 'dead' AND OLD.state <> 'dead') EXECUTE FUNCTION slow_dead()",
    ] {
        sqlx::raw_sql(statement)
            .execute(store.pool())
            .await
            .expect("set up");
    }
    let retired = || async {
        let found: (String, i32) = sqlx::query_as(
            "SELECT state, attempts FROM idem_outbox_deliveries WHERE endpoint = 'retired'",
        )
        .fetch_one(store.pool())
        .await
        .expect("read");
        found
    };
    let events: Arc<Mutex<Vec<OutboxEvent>>> = Arc::default();
    let seen = Arc::clone(&events);
    let dispatcher = outbox
        .dispatcher()
        .allow_loopback(true)
        .lease(Duration::from_millis(500))
        .expect("a lease")
        .store_timeout(Duration::from_millis(300))
        .on_event(move |event| seen.lock().expect("events").push(event.clone()));
    let _ = dispatcher.dispatch_due().await;
    // The statement lands meanwhile; the claim would have run out by now too.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut delivery = retired().await;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _ = dispatcher.dispatch_due().await;
        delivery = retired().await;
        if delivery.0 == "dead" && Instant::now() + Duration::from_secs(3) > deadline {
            break;
        }
    }
    let reported = events
        .lock()
        .expect("events")
        .iter()
        .filter(|e| e.message_id == id && matches!(e.kind, OutboxEventKind::Dead(_)))
        .count();
    assert_eq!(
        (delivery.0.as_str(), reported),
        ("dead", 1),
        "the delivery is {delivery:?}; its dead end was reported {reported} time(s); events: \
         {:?}",
        events.lock().expect("events")
    );
}

/// C12 + C17 ("none is left pending forever"): on SQLite an endpoint whose `enabled` is not
/// what the outbox writes (`'yes'`, by hand) is not definitely disabled: its deliveries are
/// claimed and end dead (undecodable), reported, as on PostgreSQL (`IS NOT FALSE`), never
/// passed over by every claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_sqlite_an_endpoint_enabled_neither_0_nor_1_leaves_no_delivery_pending_forever() {
    let dir = tempfile::tempdir().expect("a directory");
    let receiver = Receiver::start().await;
    let (store, outbox, id) = sqlite_with_one_message(dir.path(), "broken", &receiver.url()).await;
    store
        .try_call(|db| {
            db.execute(
                "UPDATE idem_outbox_endpoints SET enabled = 'yes' WHERE name = 'broken'",
                [],
            )
        })
        .await
        .expect("corrupted");
    let dispatcher = outbox.dispatcher().allow_loopback(true);
    let mut taken = Vec::new();
    for _ in 0..5 {
        taken.push(dispatcher.dispatch_due().await.expect("dispatched"));
    }
    let delivery = outbox.deliveries(&id).await.expect("read").remove(0);
    assert_ne!(
        delivery.state,
        DeliveryState::Pending,
        "claims took {taken:?}; the delivery is {delivery:?}, {} requests",
        receiver.received().len()
    );
}
