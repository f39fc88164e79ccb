//! C17: an attempt made with what is left of a claim a slow database shortened. Each test has
//! a database of its own on `IDEM_PG_URL`.

mod support;

use std::time::{Duration, Instant};

use idem_outbox::DeliveryState;
use support::*;

/// C17 ("a delivery whose schedule runs out is marked dead": the schedule counts attempts
/// made): a slow moment of the database (the claim waits on a lock ~65% of its lease) leaves
/// the claim ~80 ms, far less than the endpoint's timeout (2 s) against a receiver answering
/// 200 within 200 ms. The claim is given back, its attempt returned, and the next claim
/// delivers: the schedule (one attempt) is never spent on an attempt cut short by the
/// database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_a_claim_a_slow_database_shortened_does_not_make_a_doomed_attempt() {
    let url = fresh_database().await;
    let (store, outbox) = pg_outbox(&url).await;
    let receiver = Receiver::start().await;
    receiver.plan(|p| p.hold_every = Duration::from_millis(200));
    outbox
        .register(&endpoint(
            "merchant",
            &receiver.url(),
            quick(0, Duration::from_millis(50)),
        ))
        .await
        .expect("registered");
    let id = enqueue(&store, &outbox, "merchant", 0).await;
    let dispatcher = outbox
        .dispatcher()
        .allow_loopback(true)
        .lease(Duration::from_millis(1000))
        .expect("a lease")
        .store_timeout(Duration::from_secs(3));
    // Past half the lease, short of its three quarters: a few tens of ms are left.
    let slow = dispatch_while_locked(&url, &dispatcher, Duration::from_millis(650)).await;
    let after_slow = outbox.deliveries(&id).await.expect("read").remove(0);
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut delivery = after_slow.clone();
    while Instant::now() < deadline && delivery.state == DeliveryState::Pending {
        let _ = dispatcher.dispatch_due().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        delivery = outbox.deliveries(&id).await.expect("read").remove(0);
    }
    let attempts = outbox.attempts(after_slow.id).await.expect("attempts");
    assert_eq!(
        delivery.state,
        DeliveryState::Delivered,
        "the slow claim ({slow:?}) left {after_slow:?}; at the end {delivery:?}; attempts \
         recorded: {attempts:?}"
    );
}
