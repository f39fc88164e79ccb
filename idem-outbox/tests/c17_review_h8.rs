//! C17 review (h-8): liveness of claims given back. Each test has a database of its own on
//! `IDEM_PG_URL`.

mod support;

use std::time::{Duration, Instant};

use idem_outbox::{DeliveryState, Message};
use support::*;

/// C17 ("every delivery ends delivered or dead"): a database steadily slow to claim (each claim
/// ~450 ms under a 1 s lease: the claim's first three quarters leave ~300 ms, less than half
/// of the 750 ms a fresh claim gives) and a receiver answering 200 at once. Every claim is
/// "too short" (`too_short`), so every claim is given back: the delivery is never attempted,
/// never dead, pending for ever, though an attempt with the ~300 ms left would deliver it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_a_steadily_slow_claim_is_not_given_back_for_ever() {
    use idem_postgres::sqlx;
    let url = fresh_database().await;
    let (store, outbox) = pg_outbox(&url).await;
    let receiver = Receiver::start().await;
    outbox
        .register(&endpoint(
            "merchant",
            &receiver.url(),
            quick(0, Duration::from_millis(50)),
        ))
        .await
        .expect("registered");
    // Only the claim (a new token written) is slow; reads, records and give-backs are not.
    for statement in [
        "CREATE FUNCTION slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN PERFORM pg_sleep(0.45); RETURN NEW; END $$",
        "CREATE TRIGGER slow_claim BEFORE UPDATE ON idem_outbox_deliveries FOR EACH ROW \
         WHEN (NEW.claim_token IS NOT NULL AND NEW.claim_token IS DISTINCT FROM OLD.claim_token) \
         EXECUTE FUNCTION slow_claim()",
    ] {
        sqlx::query(statement)
            .execute(store.pool())
            .await
            .expect("a slow claim");
    }
    let mut tx = store.pool().begin().await.expect("a transaction");
    let message = Message::bytes("application/json", "{}").to("merchant");
    let id = outbox.enqueue(&mut tx, &message).await.expect("enqueued");
    tx.commit().await.expect("committed");
    let dispatcher = outbox
        .dispatcher()
        .allow_loopback(true)
        .poll_interval(Duration::from_millis(20))
        .lease(Duration::from_millis(1000))
        .expect("a lease")
        .store_timeout(Duration::from_secs(3));
    let deadline = Instant::now() + Duration::from_secs(6);
    let mut passes = 0;
    let mut delivery = outbox.deliveries(&id).await.expect("read").remove(0);
    while Instant::now() < deadline && delivery.state == DeliveryState::Pending {
        let _ = dispatcher.dispatch_due().await;
        passes += 1;
        tokio::time::sleep(Duration::from_millis(30)).await;
        delivery = outbox.deliveries(&id).await.expect("read").remove(0);
    }
    assert_eq!(
        delivery.state,
        DeliveryState::Delivered,
        "after {passes} passes, each claim given back: {delivery:?}; received: {}",
        receiver.received().len()
    );
}
