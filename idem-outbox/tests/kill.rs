//! A dispatcher killed (SIGKILL, a real child process) after the receiver got a message and
//! before the attempt was recorded: the receiver gets it again with the same `webhook-id`, and
//! idem-inbox processes it once.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use idem_outbox::{DeliveryState, Message};
use support::*;

/// The dispatcher the parent kills: runs only when the parent starts this test binary with
/// `IDEM_OUTBOX_CHILD_URL`.
#[test]
fn child_dispatcher() {
    let Ok(url) = std::env::var("IDEM_OUTBOX_CHILD_URL") else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let (_store, outbox) = pg_outbox(&url).await;
        let _dispatching = outbox
            .dispatcher()
            .allow_loopback(true)
            .lease(Duration::from_secs(2))
            .expect("a lease")
            .poll_interval(Duration::from_millis(20))
            .start()
            .expect("started");
        println!("child dispatching");
        tokio::time::sleep(Duration::from_secs(60)).await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_killed_dispatcher_the_receiver_gets_the_same_id_again_and_processes_it_once() {
    let url = fresh_database().await;
    let (store, outbox) = pg_outbox(&url).await;
    let receiver = Receiver::start().await;
    // The first delivery is processed, then its answer held past the kill.
    receiver.plan(|p| p.holds.push_back(Duration::from_secs(30)));
    outbox
        .register(&endpoint(
            "merchant",
            &receiver.url(),
            quick(5, Duration::from_millis(100)),
        ))
        .await
        .expect("registered");
    let mut tx = store.pool().begin().await.expect("a transaction");
    let message = Message::json(&serde_json::json!({"type": "charge.succeeded"}))
        .expect("json")
        .to("merchant");
    let id = outbox.enqueue(&mut tx, &message).await.expect("enqueued");
    tx.commit().await.expect("committed");

    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            "child_dispatcher",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("IDEM_OUTBOX_CHILD_URL", &url)
        .stdout(Stdio::null())
        .spawn()
        .expect("a child dispatcher");
    // Processed by the receiver (its answer held): now the child dies before recording.
    let got_it = receiver.wait_for_effects(1, Duration::from_secs(20)).await;
    child.kill().expect("killed");
    let _ = child.wait();
    assert!(got_it, "the child delivered");
    assert_eq!(
        receiver.effects().get(id.as_str()),
        Some(&1),
        "processed by the receiver"
    );
    // Killed before recording: claimed once, no attempt recorded, still pending.
    let delivery = &outbox.deliveries(&id).await.expect("deliveries")[0];
    assert_eq!(
        (delivery.state, delivery.attempts),
        (DeliveryState::Pending, 1)
    );
    assert!(outbox
        .attempts(delivery.id)
        .await
        .expect("attempts")
        .is_empty());

    // Another dispatcher takes the delivery over once the dead one's claim runs out.
    let dispatching = outbox
        .dispatcher()
        .allow_loopback(true)
        .poll_interval(Duration::from_millis(50))
        .start()
        .expect("started");
    assert!(receiver.wait_for(2, Duration::from_secs(10)).await);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while outbox.deliveries(&id).await.expect("deliveries")[0].state != DeliveryState::Delivered
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    dispatching.stop().await;
    let received = receiver.received();
    assert_eq!(received.len(), 2);
    assert!(
        received.iter().all(|r| r.id == id.as_str() && r.verified),
        "the same webhook-id, signed"
    );
    assert_eq!(
        receiver.effects().get(id.as_str()),
        Some(&1),
        "processed once"
    );
    let delivery = &outbox.deliveries(&id).await.expect("deliveries")[0];
    assert_eq!(
        (delivery.state, delivery.attempts),
        (DeliveryState::Delivered, 2)
    );
    let attempts = outbox.attempts(delivery.id).await.expect("attempts");
    assert_eq!(
        attempts
            .iter()
            .map(|a| (a.attempt, a.status))
            .collect::<Vec<_>>(),
        [(2, Some(200))]
    );
    eprintln!(
        "pg kill: messages 1, requests {}, processed by the receiver 1, duplicates processed 0, lost 0",
        received.len()
    );
}
