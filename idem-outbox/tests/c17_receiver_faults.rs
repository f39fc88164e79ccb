//! The outbox against receivers that misbehave at the TCP level (a raw socket, not axum): an
//! answer whose body never ends, a receiver that accepts and never answers. Each test has a
//! database of its own on `IDEM_PG_URL`.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_outbox::{DeliveryState, Message};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One connection the raw receiver accepted: when, and when the dispatcher closed it (`None`:
/// still open).
#[derive(Debug, Clone, Copy)]
struct Conn {
    accepted: Instant,
    /// When the answer was written, if it was.
    answered: Option<Instant>,
    closed: Option<Instant>,
}

/// A raw HTTP/1.1 receiver on a loopback port: for each request it writes `answer` (nothing
/// when empty) and keeps the connection open, reading until the client closes it.
async fn raw_receiver(answer: &'static [u8]) -> (String, Arc<Mutex<Vec<Conn>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let addr = listener.local_addr().expect("an address");
    let conns: Arc<Mutex<Vec<Conn>>> = Arc::default();
    let log = Arc::clone(&conns);
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let index = {
                let mut log = log.lock().expect("log");
                log.push(Conn {
                    accepted: Instant::now(),
                    answered: None,
                    closed: None,
                });
                log.len() - 1
            };
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let mut seen = Vec::new();
                let mut answered = false;
                loop {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            seen.extend_from_slice(&buf[..n]);
                            let head_done = seen.windows(4).any(|w| w == b"\r\n\r\n");
                            if head_done && !answered && !answer.is_empty() {
                                answered = true;
                                let _ = socket.write_all(answer).await;
                                let _ = socket.flush().await;
                                log.lock().expect("log")[index].answered = Some(Instant::now());
                            }
                        }
                    }
                }
                log.lock().expect("log")[index].closed = Some(Instant::now());
            });
        }
    });
    (format!("http://{addr}/hooks"), conns)
}

/// C17: "A 2xx delivers". A receiver answers `200 OK` at once (within 50 ms of the
/// connection), but its response body does not end within the attempt's timeout (a streamed
/// or stalled body, a proxy that buffers): every message is recorded delivered with its 200,
/// never as a timeout without a status, delivered again or dead. The deadline that ends the
/// body read once raced another that dropped the status: a race of microseconds per attempt,
/// so 400 messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_a_2xx_whose_body_stalls_is_delivered_not_retried_into_dead() {
    let url = fresh_database().await;
    let (store, outbox) = pg_outbox(&url).await;
    // 200, a body announced as 1000 bytes of which 2 come, the connection kept open.
    let (receiver, conns) =
        raw_receiver(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\nok").await;
    outbox
        .register(
            &idem_outbox::Endpoint::new("merchant", &receiver, [SECRET])
                .expect("an endpoint")
                .timeout(Duration::from_millis(300))
                .expect("a timeout")
                .schedule(quick(1, Duration::from_millis(50))),
        )
        .await
        .expect("registered");
    let mut ids = Vec::new();
    for _ in 0..400 {
        ids.push(enqueue(&store, &outbox, "merchant", 0).await);
    }
    // Claims of 16: each attempt reads the 200, then waits out its timeout on the body.
    let dispatcher = outbox.dispatcher().allow_loopback(true);
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if dispatcher.dispatch_due().await.expect("dispatched") == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if dispatcher.dispatch_due().await.expect("dispatched") == 0 {
                break;
            }
        }
    }
    // Attempts answered 200 by the receiver within 50 ms of connecting (a quarter-second
    // before their 300 ms timeout) but recorded without a status.
    let conns = conns.lock().expect("log").clone();
    let quick_answers = conns
        .iter()
        .filter(|c| {
            c.answered
                .is_some_and(|a| a - c.accepted < Duration::from_millis(50))
        })
        .count();
    let mut wrong = Vec::new();
    for id in &ids {
        let delivery = outbox.deliveries(id).await.expect("read").remove(0);
        let attempts = outbox.attempts(delivery.id).await.expect("attempts");
        if delivery.state != DeliveryState::Delivered || attempts.len() != 1 {
            wrong.push((
                delivery.state,
                attempts
                    .iter()
                    .map(|a| (a.status, a.error.clone()))
                    .collect::<Vec<_>>(),
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} messages, {} requests, {quick_answers} of them answered 200 within 50 ms; \
         deliveries not delivered on their first attempt (state, attempts' (status, error)): \
         {wrong:?}",
        ids.len(),
        conns.len(),
    );
    assert_eq!(
        quick_answers,
        conns.len(),
        "the receiver kept up: {conns:?}"
    );
}

/// C17: "an attempt's timeout is shorter than the claim, so two dispatchers never deliver one
/// message at the same moment". A receiver that accepts and never answers, an endpoint timeout
/// far longer than the claim, two dispatchers: the receiver never has two connections of the
/// message open at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_a_receiver_that_never_answers_never_sees_two_attempts_at_once() {
    let url = fresh_database().await;
    let (store, outbox) = pg_outbox(&url).await;
    let (receiver, conns) = raw_receiver(b"").await;
    outbox
        .register(
            &idem_outbox::Endpoint::new("merchant", &receiver, [SECRET])
                .expect("an endpoint")
                .timeout(Duration::from_secs(60))
                .expect("a timeout")
                .schedule(quick(20, Duration::from_millis(1))),
        )
        .await
        .expect("registered");
    let _id = enqueue(&store, &outbox, "merchant", 0).await;
    let start = || {
        outbox
            .dispatcher()
            .allow_loopback(true)
            .lease(Duration::from_millis(400))
            .expect("a lease")
            .poll_interval(Duration::from_millis(5))
            .start()
            .expect("started")
    };
    let (a, b) = (start(), start());
    tokio::time::sleep(Duration::from_secs(4)).await;
    a.stop().await;
    b.stop().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let conns = conns.lock().expect("log").clone();
    assert!(conns.len() >= 3, "attempts: {conns:?}");
    for (i, x) in conns.iter().enumerate() {
        for y in &conns[i + 1..] {
            let x_end = x.closed.expect("closed");
            assert!(
                y.accepted >= x_end,
                "an attempt arrived {:?} before the previous one's connection closed: {conns:?}",
                x_end - y.accepted
            );
        }
    }
}

/// C17 under connection faults: while two dispatchers deliver, every backend of the outbox's
/// database is terminated over and over (`pg_terminate_backend`: claims, records, the LISTEN
/// connection cut mid-statement). Every message is still delivered and recorded delivered,
/// processed once by the receiver, never two attempts of one message at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_backends_terminated_while_dispatching_lose_nothing_and_never_overlap() {
    use idem_postgres::sqlx::{self, Connection};
    let url = fresh_database().await;
    let (store, outbox) = pg_outbox(&url).await;
    let receiver = Receiver::start().await;
    receiver.plan(|p| p.hold_every = Duration::from_millis(30));
    outbox
        .register(&endpoint(
            "merchant",
            &receiver.url(),
            quick(40, Duration::from_millis(50)),
        ))
        .await
        .expect("registered");
    let mut ids = Vec::new();
    for _ in 0..60 {
        ids.push(enqueue(&store, &outbox, "merchant", 0).await);
    }
    let killing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let kills = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let killer = {
        let (url, killing, kills) = (url.clone(), Arc::clone(&killing), Arc::clone(&kills));
        tokio::spawn(async move {
            let mut conn = sqlx::PgConnection::connect(&url)
                .await
                .expect("a connection");
            while killing.load(std::sync::atomic::Ordering::SeqCst) {
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid()",
                )
                .fetch_one(&mut conn)
                .await
                .expect("terminated");
                kills.fetch_add(
                    usize::try_from(n).unwrap_or(0),
                    std::sync::atomic::Ordering::SeqCst,
                );
                tokio::time::sleep(Duration::from_millis(37)).await;
            }
        })
    };
    let start = || {
        outbox
            .dispatcher()
            .allow_loopback(true)
            .batch(4)
            .lease(Duration::from_millis(800))
            .expect("a lease")
            .store_timeout(Duration::from_millis(500))
            .poll_interval(Duration::from_millis(20))
            .start()
            .expect("started")
    };
    let (a, b) = (start(), start());
    tokio::time::sleep(Duration::from_secs(6)).await;
    killing.store(false, std::sync::atomic::Ordering::SeqCst);
    killer.await.expect("the killer");
    // The faults end: everything left is delivered within a few leases.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut states = Vec::new();
    while Instant::now() < deadline {
        states.clear();
        for id in &ids {
            states.push(outbox.deliveries(id).await.expect("read").remove(0));
        }
        if states.iter().all(|d| d.state != DeliveryState::Pending) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    a.stop().await;
    b.stop().await;
    let not_delivered: Vec<_> = states
        .iter()
        .filter(|d| d.state != DeliveryState::Delivered)
        .collect();
    let effects = receiver.effects();
    eprintln!(
        "terminated backends {}, requests {}, processed {}",
        kills.load(std::sync::atomic::Ordering::SeqCst),
        receiver.received().len(),
        effects.len()
    );
    assert!(not_delivered.is_empty(), "not delivered: {not_delivered:?}");
    assert_eq!(effects.len(), ids.len(), "every message processed");
    assert!(effects.values().all(|n| *n == 1), "each processed once");
    assert_eq!(
        receiver.overlaps(),
        0,
        "two attempts of one message at once"
    );
}

/// C12 + C17: one delivery whose stored row cannot be decoded (its headers column is not the
/// JSON the outbox writes: a hand edit, another writer, a format of another version), claimed
/// with healthy ones: the healthy ones are delivered at once, and the bad one ends dead with
/// its error, never failing the whole claim every lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_one_undecodable_delivery_does_not_hold_up_the_others_claimed_with_it() {
    use idem_postgres::sqlx;
    let (_url, store, outbox, receiver) = pg_with_endpoint("merchant", 3).await;
    let bad = enqueue(&store, &outbox, "merchant", 0).await;
    sqlx::query("UPDATE idem_outbox_deliveries SET headers = 'not json' WHERE message_id = $1")
        .bind(bad.as_str())
        .execute(store.pool())
        .await
        .expect("corrupted");
    let mut good = Vec::new();
    for _ in 0..3 {
        good.push(enqueue(&store, &outbox, "merchant", 0).await);
    }
    let dispatcher = outbox.dispatcher().allow_loopback(true);
    let claimed = dispatcher.dispatch_due().await;
    let mut states = Vec::new();
    for id in &good {
        let d = outbox.deliveries(id).await.expect("read").remove(0);
        states.push((d.state, d.attempts));
    }
    assert!(
        states
            .iter()
            .all(|(state, _)| *state == DeliveryState::Delivered),
        "one claim over one bad row and three good ones: {claimed:?}; the good ones are \
         (state, attempts counted) {states:?}, the receiver got {} requests",
        receiver.received().len()
    );
}

/// C17: "delivery is at least once ... on a retry schedule; a delivery whose schedule runs
/// out is marked dead". A slow database (here: the claim waits 850 ms of its 1 s lease on a
/// lock, within the dispatcher's store deadline) leaves a claim too little time to send: the
/// claim gives its attempt back, so the schedule (two attempts) counts attempts made, and the
/// second real attempt, answered 200, delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_a_claim_that_made_no_attempt_does_not_use_up_the_schedule() {
    let url = fresh_database().await;
    let (store, outbox) = pg_outbox(&url).await;
    let receiver = Receiver::start().await;
    // The first request fails, the second would be processed.
    receiver.plan(|p| p.statuses.extend([500, 200]));
    outbox
        .register(&endpoint(
            "merchant",
            &receiver.url(),
            quick(1, Duration::from_millis(50)),
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
    // A slow moment of the database: the claim waits on a lock most of its lease, 850 ms
    // (past three quarters of it).
    let slow = dispatch_while_locked(&url, &dispatcher, Duration::from_millis(850)).await;
    let after_slow = outbox.deliveries(&id).await.expect("read").remove(0);
    let requests_then = receiver.received().len();
    // The database is well again: the dispatcher works through the schedule.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut delivery = after_slow.clone();
    while Instant::now() < deadline && delivery.state == DeliveryState::Pending {
        let _ = dispatcher.dispatch_due().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        delivery = outbox.deliveries(&id).await.expect("read").remove(0);
    }
    let requests = receiver.received().len();
    assert_eq!(
        (delivery.state, requests),
        (DeliveryState::Delivered, 2),
        "a schedule of two attempts; the slow claim ({slow:?}) sent {requests_then} request(s) \
         and left {} attempt(s) counted; in all the receiver got {requests} request(s); the \
         delivery is {:?} with {} attempts counted",
        after_slow.attempts,
        delivery.state,
        delivery.attempts
    );
}

/// C17 ("delivery is at least once"): the outbox has no call to retire an endpoint, so an
/// operator deletes its row by hand, a batch of its deliveries still due and oldest. They end
/// dead (no endpoint), and every other endpoint's messages are still delivered: they once
/// filled every claim, and nothing else was delivered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_deliveries_of_a_deleted_endpoint_do_not_stall_every_other_delivery() {
    use idem_postgres::sqlx;
    let url = fresh_database().await;
    let (store, outbox) = pg_outbox(&url).await;
    let receiver = Receiver::start().await;
    for name in ["retired", "merchant"] {
        outbox
            .register(&endpoint(
                name,
                &receiver.url(),
                quick(3, Duration::from_millis(50)),
            ))
            .await
            .expect("registered");
    }
    for _ in 0..16 {
        let mut tx = store.pool().begin().await.expect("a transaction");
        let message = Message::bytes("application/json", "{}").to("retired");
        outbox.enqueue(&mut tx, &message).await.expect("enqueued");
        tx.commit().await.expect("committed");
    }
    sqlx::query("DELETE FROM idem_outbox_endpoints WHERE name = 'retired'")
        .execute(store.pool())
        .await
        .expect("deleted");
    let id = enqueue(&store, &outbox, "merchant", 0).await;
    let dispatcher = outbox.dispatcher().allow_loopback(true);
    let mut taken = Vec::new();
    for _ in 0..3 {
        taken.push(dispatcher.dispatch_due().await.expect("dispatched"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let delivery = outbox.deliveries(&id).await.expect("read").remove(0);
    assert_eq!(
        delivery.state,
        DeliveryState::Delivered,
        "claims took {taken:?}; the receiver got {} requests",
        receiver.received().len()
    );
}
