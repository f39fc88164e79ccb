//! C17 on a slow or silent database: a claim given back never starves its delivery, and a
//! pass stays bounded by its store timeouts. Each test has a database of its own on
//! `IDEM_PG_URL`.

mod support;

use std::time::{Duration, Instant};

use idem_outbox::DeliveryState;
use support::*;

/// C17 ("every delivery ends delivered or dead"): a database steadily slow to claim (each claim
/// ~450 ms under a 1 s lease: the claim's first three quarters leave ~300 ms, less than half
/// of the 750 ms a fresh claim gives) and a receiver answering 200 at once. A claim that short
/// is given back once, not every time: the next one attempts with what it has, and delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_a_steadily_slow_claim_is_not_given_back_for_ever() {
    use idem_postgres::sqlx;
    let (_url, store, outbox, receiver) = pg_with_endpoint("merchant", 0).await;
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
    let id = enqueue(&store, &outbox, "merchant", 0).await;
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

/// C17 ("a database that does not answer is an error, never a hang": each database call is
/// bounded by the store timeout): 16 dead ends (their endpoint deleted by hand) whose give-back
/// statement outlived the store timeout are kept to be confirmed. The database then stops
/// answering (the deliveries table locked). The next pass confirms them within one store
/// timeout in all, then claims: under three store timeouts, never one per kept end (the pass,
/// and `Dispatching::stop` that waits for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_a_pass_on_a_silent_database_is_not_bounded_by_the_kept_dead_ends() {
    use idem_postgres::sqlx::{self, Connection};
    let (url, store, outbox, _receiver) = pg_with_endpoint("retired", 0).await;
    for n in 0..16 {
        enqueue(&store, &outbox, "retired", n).await;
    }
    for statement in [
        "DELETE FROM idem_outbox_endpoints WHERE name = 'retired'",
        "CREATE FUNCTION slow_dead() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN PERFORM pg_sleep(0.05); RETURN NEW; END $$",
        "CREATE TRIGGER slow_dead BEFORE UPDATE ON idem_outbox_deliveries FOR EACH ROW \
         WHEN (NEW.state = 'dead') EXECUTE FUNCTION slow_dead()",
    ] {
        sqlx::query(statement)
            .execute(store.pool())
            .await
            .expect("set up");
    }
    let store_timeout = Duration::from_millis(300);
    let dispatcher = outbox
        .dispatcher()
        .allow_loopback(true)
        .lease(Duration::from_secs(30))
        .expect("a lease")
        .store_timeout(store_timeout);
    // The give-back of the 16 dead ends takes ~800 ms: its answer is lost, the ends kept.
    let first = dispatcher.dispatch_due().await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mut locker = sqlx::PgConnection::connect(&url)
        .await
        .expect("a connection");
    sqlx::query("BEGIN")
        .execute(&mut locker)
        .await
        .expect("begun");
    sqlx::query("LOCK TABLE idem_outbox_deliveries IN ACCESS EXCLUSIVE MODE")
        .execute(&mut locker)
        .await
        .expect("locked");
    let started = Instant::now();
    let second = dispatcher.dispatch_due().await;
    let took = started.elapsed();
    sqlx::query("ROLLBACK")
        .execute(&mut locker)
        .await
        .expect("unlocked");
    assert!(
        took < store_timeout * 3,
        "a pass on a silent database took {took:?} ({:.1} store timeouts); first pass \
         {first:?}, second {second:?}",
        took.as_secs_f64() / store_timeout.as_secs_f64()
    );
}
