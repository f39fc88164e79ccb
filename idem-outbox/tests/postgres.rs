//! The outbox on PostgreSQL: enqueued in the effect's transaction, several dispatchers on one
//! database, woken by LISTEN/NOTIFY. Each test has a database of its own on `IDEM_PG_URL` (a
//! missing server is a failure, never a skip).

mod support;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_core::{Idempotency, Outcome, RunError, StoredResponse};
use idem_outbox::{
    DeliveryState, Message, MessageId, OutboxError, OutboxEvent, OutboxEventKind, PgOutbox,
};
use idem_postgres::sqlx::{self, Connection};
use idem_postgres::PgIdempotency;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_rolled_back_effect_sends_nothing_and_committed_one_is_delivered() {
    let (_url, store, outbox, receiver) = pg_with_endpoint("merchant", 3).await;
    let dispatching = outbox
        .dispatcher()
        .allow_loopback(true)
        .start()
        .expect("started");
    sqlx::query("CREATE TABLE charges (id bigserial PRIMARY KEY, cents bigint)")
        .execute(store.pool())
        .await
        .expect("a table");
    let idem = Idempotency::new(store.clone());

    let sender = outbox.clone();
    let request = idem
        .request("acct_1", "POST", "/charges")
        .key(Some("k-1"))
        .body(b"{}")
        .build()
        .expect("a request");
    let failed = idem
        .run_in_transaction(&request, move |tx, _lease| {
            Box::pin(async move {
                sqlx::query("INSERT INTO charges (cents) VALUES (500)")
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| e.to_string())?;
                let message = Message::bytes("text/plain", "rolled back").to("merchant");
                sender
                    .enqueue(&mut *tx, &message)
                    .await
                    .map_err(|e| e.to_string())?;
                Err::<StoredResponse, String>("declined".into())
            })
        })
        .await;
    assert!(matches!(failed, Err(RunError::Released(_))), "{failed:?}");

    let sender = outbox.clone();
    let request = idem
        .request("acct_1", "POST", "/charges")
        .key(Some("k-2"))
        .body(b"{}")
        .build()
        .expect("a request");
    let outcome = idem
        .run_in_transaction(&request, move |tx, _lease| {
            Box::pin(async move {
                sqlx::query("INSERT INTO charges (cents) VALUES (700)")
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| e.to_string())?;
                let message = Message::bytes("text/plain", "committed").to("merchant");
                let id = sender
                    .enqueue(&mut *tx, &message)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(StoredResponse::new(201, id.to_string()))
            })
        })
        .await;
    let Ok(Outcome::Executed(response)) = outcome else {
        panic!("{outcome:?}");
    };
    let id = String::from_utf8(response.body).expect("an id");
    assert!(receiver.wait_for(1, Duration::from_secs(5)).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let received = receiver.received();
    assert_eq!(received.len(), 1, "only the committed message is sent");
    assert_eq!(
        (received[0].id.as_str(), received[0].body.as_slice()),
        (id.as_str(), &b"committed"[..])
    );
    assert!(received[0].verified);
    let delivery = &outbox
        .deliveries(&MessageId::from_stored(id))
        .await
        .expect("deliveries")[0];
    assert_eq!(delivery.state, DeliveryState::Delivered);
    dispatching.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c14_pg_a_connection_outside_a_transaction_or_an_unknown_endpoint_writes_nothing() {
    let url = fresh_database().await;
    let (store, outbox) = pg_outbox(&url).await;
    outbox
        .register(&endpoint(
            "merchant",
            "http://127.0.0.1:9/hooks",
            quick(1, Duration::from_millis(10)),
        ))
        .await
        .expect("registered");
    let mut conn = store.pool().acquire().await.expect("a connection");
    let refused = outbox
        .enqueue(&mut conn, &Message::bytes("a/b", "x").to("merchant"))
        .await;
    assert!(
        matches!(refused, Err(OutboxError::NotInEffectTransaction(_))),
        "{refused:?}"
    );
    let mut tx = conn.begin().await.expect("a transaction");
    let unknown = outbox
        .enqueue(
            &mut tx,
            &Message::bytes("a/b", "x").to("merchant").to("nobody"),
        )
        .await;
    assert!(
        matches!(unknown, Err(OutboxError::UnknownEndpoint(_))),
        "{unknown:?}"
    );
    tx.commit().await.expect("committed");
    let counts = outbox.counts().await.expect("counts");
    assert_eq!((counts.pending, counts.delayed, counts.dead), (0, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_receiver_down_then_back_gets_everything() {
    let url = fresh_database().await;
    let (store, outbox) = pg_outbox(&url).await;
    let addr = free_addr().await;
    let down_url = format!("http://{addr}/hooks");
    outbox
        .register(&endpoint(
            "merchant",
            &down_url,
            quick(60, Duration::from_millis(100)),
        ))
        .await
        .expect("registered");
    let dispatching = outbox
        .dispatcher()
        .allow_loopback(true)
        .poll_interval(Duration::from_millis(50))
        .start()
        .expect("started");
    let mut ids = HashSet::new();
    for n in 0..30 {
        ids.insert(enqueue(&store, &outbox, "merchant", n).await.to_string());
    }
    // Down for a while: every attempt fails, nothing is lost.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let receiver = Receiver::start_on(addr).await;
    assert!(
        receiver
            .wait_for_effects(ids.len(), Duration::from_secs(10))
            .await
    );
    dispatching.stop().await;
    let effects = receiver.effects();
    let processed: HashSet<String> = effects.keys().cloned().collect();
    assert_eq!(processed, ids, "every message delivered");
    assert!(effects.values().all(|n| *n == 1), "each processed once");
    let mut retried = 0;
    for id in &ids {
        let delivery = &outbox
            .deliveries(&MessageId::from_stored(id.clone()))
            .await
            .expect("deliveries")[0];
        assert_eq!(delivery.state, DeliveryState::Delivered);
        retried += usize::from(delivery.attempts > 1);
    }
    eprintln!(
        "pg outage: messages {}, received {}, processed {}, duplicates processed 0, lost 0, retried {retried}",
        ids.len(),
        receiver.received().len(),
        processed.len()
    );
    assert!(retried > 0, "the outage made attempts fail");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_three_dispatchers_deliver_every_message_none_concurrently() {
    let url = fresh_database().await;
    let (store, outbox) = pg_outbox(&url).await;
    let receiver = Receiver::start().await;
    receiver.plan(|p| {
        p.hold_every = Duration::from_millis(5);
        // Some failures, so that retries interleave with first attempts.
        p.statuses.extend([500, 200, 200, 503, 200, 200, 200, 500]);
    });
    outbox
        .register(&endpoint(
            "merchant",
            &receiver.url(),
            quick(20, Duration::from_millis(30)),
        ))
        .await
        .expect("registered");
    let mut dispatchers = Vec::new();
    for _ in 0..3 {
        let (_, other) = pg_outbox(&url).await;
        dispatchers.push(
            other
                .dispatcher()
                .allow_loopback(true)
                .batch(4)
                .poll_interval(Duration::from_millis(20))
                .lease(Duration::from_secs(5))
                .expect("a lease")
                .start()
                .expect("started"),
        );
    }
    let mut ids = HashSet::new();
    for n in 0..150 {
        ids.insert(enqueue(&store, &outbox, "merchant", n).await.to_string());
    }
    assert!(
        receiver
            .wait_for_effects(ids.len(), Duration::from_secs(30))
            .await
    );
    for dispatching in dispatchers {
        dispatching.stop().await;
    }
    let effects = receiver.effects();
    assert_eq!(effects.keys().cloned().collect::<HashSet<_>>(), ids);
    assert!(effects.values().all(|n| *n == 1));
    assert_eq!(
        receiver.overlaps(),
        0,
        "no message delivered by two dispatchers at once"
    );
    let received = receiver.received().len();
    eprintln!(
        "pg three dispatchers: messages {}, requests {received}, overlaps 0, lost 0",
        ids.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_first_attempt_starts_within_100ms_p50_on_an_idle_dispatcher() {
    let (_url, store, outbox, receiver) = pg_with_endpoint("merchant", 3).await;
    let dispatching = outbox
        .dispatcher()
        .allow_loopback(true)
        .poll_interval(Duration::from_secs(5))
        .start()
        .expect("started");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut latencies = Vec::new();
    for n in 0..20 {
        let mut tx = store.pool().begin().await.expect("a transaction");
        let message = Message::bytes("text/plain", format!("{n}")).to("merchant");
        outbox.enqueue(&mut tx, &message).await.expect("enqueued");
        let committed = Instant::now();
        tx.commit().await.expect("committed");
        assert!(receiver.wait_for(n + 1, Duration::from_secs(5)).await);
        latencies.push(
            receiver.received()[n]
                .at
                .saturating_duration_since(committed),
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    dispatching.stop().await;
    let median = p50(latencies.clone());
    eprintln!("pg: latency from commit to first attempt: p50 {median:?}, all {latencies:?}");
    assert!(median < Duration::from_millis(100), "{median:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_operators_retry_replay_and_purge_with_the_same_id() {
    let url = fresh_database().await;
    let (store, outbox) = pg_outbox(&url).await;
    let receiver = Receiver::start().await;
    receiver.plan(|p| p.statuses.extend([500]));
    outbox
        .register(&endpoint(
            "merchant",
            &receiver.url(),
            quick(0, Duration::from_millis(10)),
        ))
        .await
        .expect("registered");
    let dispatcher = outbox.dispatcher().allow_loopback(true);
    let id = enqueue(&store, &outbox, "merchant", 1).await;
    assert!(outbox.oldest_pending_age().await.expect("age").is_some());
    dispatcher.dispatch_due().await.expect("dispatched");
    assert_eq!(
        outbox
            .list(DeliveryState::Dead, 10)
            .await
            .expect("listed")
            .len(),
        1
    );
    assert_eq!(outbox.counts().await.expect("counts").dead, 1);
    assert_eq!(outbox.retry(&id).await.expect("retried"), 1);
    dispatcher.dispatch_due().await.expect("dispatched");
    assert_eq!(outbox.replay(&id).await.expect("replayed"), 1);
    dispatcher.dispatch_due().await.expect("dispatched");
    assert_eq!(receiver.received().len(), 3);
    assert_eq!(receiver.effects().get(id.as_str()), Some(&1));
    let delivery = &outbox.deliveries(&id).await.expect("deliveries")[0];
    assert_eq!(delivery.state, DeliveryState::Delivered);
    assert_eq!(
        outbox.attempts(delivery.id).await.expect("attempts").len(),
        3
    );
    assert_eq!(
        outbox
            .purge(idem_outbox::Retention::default(), 100)
            .await
            .expect("purged"),
        0
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    let now = idem_outbox::Retention {
        delivered: Duration::ZERO,
        dead: Duration::from_secs(3600),
    };
    assert_eq!(outbox.purge(now, 100).await.expect("purged"), 1);
    assert!(outbox
        .attempts(delivery.id)
        .await
        .expect("attempts")
        .is_empty());
}

/// The backend pids of the connections listening on the outbox's channel in `url`'s database.
async fn listeners(store: &idem_postgres::PgStore) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%'",
    )
    .fetch_all(store.pool())
    .await
    .expect("pg_stat_activity")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_a_lost_listen_connection_still_wakes_the_dispatcher_promptly() {
    let (_url, store, outbox, receiver) = pg_with_endpoint("merchant", 3).await;
    // A poll far longer than the test: only the wake-up can deliver in time.
    let dispatching = outbox
        .dispatcher()
        .allow_loopback(true)
        .poll_interval(Duration::from_secs(60))
        .start()
        .expect("started");
    let mut listening = Vec::new();
    for _ in 0..100 {
        listening = listeners(&store).await;
        if !listening.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(listening.len(), 1, "the dispatcher listens: {listening:?}");
    enqueue(&store, &outbox, "merchant", 0).await;
    assert!(receiver.wait_for(1, Duration::from_secs(2)).await);

    // The listening connection dies (an operator, a proxy, a failover).
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(listening[0])
        .fetch_one(store.pool())
        .await
        .expect("terminated");
    assert!(killed);
    let committed = Instant::now();
    enqueue(&store, &outbox, "merchant", 1).await;
    assert!(
        receiver.wait_for(2, Duration::from_secs(3)).await,
        "a message committed after the LISTEN connection died is delivered without waiting \
         for the 60 s poll"
    );
    let latency = receiver.received()[1]
        .at
        .saturating_duration_since(committed);
    // The listener is back: the next message is woken by its notification again.
    let mut again = Vec::new();
    for _ in 0..100 {
        again = listeners(&store).await;
        if !again.is_empty() && again != listening {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        again.len() == 1 && again != listening,
        "listening again on a new connection: {again:?} (was {listening:?})"
    );
    let committed = Instant::now();
    enqueue(&store, &outbox, "merchant", 2).await;
    assert!(receiver.wait_for(3, Duration::from_secs(2)).await);
    let next = receiver.received()[2]
        .at
        .saturating_duration_since(committed);
    dispatching.stop().await;
    eprintln!(
        "pg lost LISTEN connection: delivered {latency:?} after the commit; the next one {next:?}"
    );
    assert!(
        latency < Duration::from_millis(500) && next < Duration::from_millis(500),
        "{latency:?}, {next:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_a_disabled_endpoints_deliveries_wait_without_holding_up_others() {
    let url = fresh_database().await;
    let (store, outbox) = pg_outbox(&url).await;
    let receiver = Receiver::start().await;
    let schedule = || quick(3, Duration::from_millis(50));
    let disabled = endpoint("disabled", &receiver.url(), schedule()).enabled(false);
    outbox.register(&disabled).await.expect("registered");
    outbox
        .register(&endpoint("merchant", &receiver.url(), schedule()))
        .await
        .expect("registered");
    // The disabled endpoint's deliveries are due first, more than a claim takes.
    let mut waiting = Vec::new();
    for n in 0..40 {
        waiting.push(enqueue(&store, &outbox, "disabled", n).await);
    }
    let mut ids = HashSet::new();
    for n in 0..5 {
        ids.insert(enqueue(&store, &outbox, "merchant", n).await.to_string());
    }
    let dispatcher = outbox.dispatcher().allow_loopback(true).batch(16);
    let mut taken = 0;
    for _ in 0..10 {
        taken += dispatcher.dispatch_due().await.expect("dispatched");
    }
    assert_eq!(
        taken, 45,
        "each due delivery taken once: 40 set aside, 5 sent"
    );
    let received: HashSet<String> = receiver.received().into_iter().map(|r| r.id).collect();
    assert_eq!(
        received, ids,
        "the enabled endpoint's messages, and only them"
    );
    for id in &waiting {
        let delivery = &outbox.deliveries(id).await.expect("deliveries")[0];
        assert_eq!(
            (delivery.state, delivery.attempts),
            (DeliveryState::Pending, 0),
            "waiting, never attempted"
        );
    }
    // Enabled again, its deliveries are due at once (not after the lease they were set aside).
    outbox
        .register(&disabled.enabled(true))
        .await
        .expect("registered");
    for _ in 0..5 {
        dispatcher.dispatch_due().await.expect("dispatched");
    }
    assert_eq!(receiver.received().len(), 45, "every message delivered");
    assert!(receiver.effects().values().all(|n| *n == 1));
}

/// An outbox table made by an earlier build, without the claim's `claimed_until`, gets the
/// column when the outbox opens, and its messages are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_a_table_without_the_claim_column_gets_it_on_open() {
    let url = fresh_database().await;
    let (store, _) = pg_outbox(&url).await;
    sqlx::raw_sql("ALTER TABLE idem_outbox_deliveries DROP COLUMN claimed_until")
        .execute(store.pool())
        .await
        .expect("the earlier table");
    let outbox = PgOutbox::open(&store).await.expect("opened again");
    let (column,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM information_schema.columns \
         WHERE table_name = 'idem_outbox_deliveries' AND column_name = 'claimed_until'",
    )
    .fetch_one(store.pool())
    .await
    .expect("counted");
    assert_eq!(column, 1, "the column is back");
    let receiver = Receiver::start().await;
    outbox
        .register(&endpoint(
            "merchant",
            &receiver.url(),
            quick(3, Duration::from_millis(50)),
        ))
        .await
        .expect("registered");
    let _dispatching = outbox
        .dispatcher()
        .allow_loopback(true)
        .start()
        .expect("started");
    enqueue(&store, &outbox, "merchant", 1).await;
    assert!(receiver.wait_for(1, Duration::from_secs(5)).await);
}

/// An outbox call on a frozen link: whether it failed.
type Failing<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + 'a>>;

/// C13: the outbox's own calls (an operator's, an admin endpoint's) on a database gone silent
/// are errors within the outbox's deadline, never a hang, whichever pooled connection each
/// gets; the outbox answers again once the link does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_operator_calls_on_a_frozen_database_fail_within_the_deadline() {
    const DEADLINE: Duration = Duration::from_millis(300);
    /// What a loaded two-core machine may add.
    const MARGIN: Duration = Duration::from_millis(700);
    let url = fresh_database().await;
    let (head, database) = url.rsplit_once('/').expect("a database in the URL");
    let (user, server) = head.rsplit_once('@').expect("a server in the URL");
    let proxy = fault_proxy::FaultProxy::start(server)
        .await
        .expect("a proxy");
    let (store, outbox) = pg_outbox(&format!("{user}@{}/{database}", proxy.addr())).await;
    let outbox = outbox.store_timeout(DEADLINE);
    outbox
        .register(&endpoint("m", "http://127.0.0.1:9/", quick(3, DEADLINE)))
        .await
        .expect("registered");
    let mut tx = store.pool().begin().await.expect("a transaction");
    let id = outbox
        .enqueue(&mut tx, &Message::bytes("text/plain", "x").to("m"))
        .await
        .expect("enqueued");
    tx.commit().await.expect("committed");
    for _ in 0..4 {
        outbox.counts().await.expect("counted");
    }

    proxy.set(fault_proxy::Fault::Freeze);
    let calls: Vec<(&str, Failing<'_>)> = vec![
        (
            "replay",
            Box::pin(async { outbox.replay(&id).await.is_err() }),
        ),
        (
            "retry",
            Box::pin(async { outbox.retry(&id).await.is_err() }),
        ),
        ("counts", Box::pin(async { outbox.counts().await.is_err() })),
        (
            "list",
            Box::pin(async { outbox.list(DeliveryState::Pending, 10).await.is_err() }),
        ),
        (
            "deliveries",
            Box::pin(async { outbox.deliveries(&id).await.is_err() }),
        ),
        (
            "attempts",
            Box::pin(async { outbox.attempts(1).await.is_err() }),
        ),
        (
            "endpoint",
            Box::pin(async { outbox.endpoint("m").await.is_err() }),
        ),
        (
            "oldest",
            Box::pin(async { outbox.oldest_pending_age().await.is_err() }),
        ),
        (
            "purge",
            Box::pin(async {
                outbox
                    .purge(idem_outbox::Retention::default(), 10)
                    .await
                    .is_err()
            }),
        ),
    ];
    for (name, call) in calls {
        let started = Instant::now();
        let failed = tokio::time::timeout(Duration::from_secs(20), call)
            .await
            .unwrap_or_else(|_| panic!("{name} hung on a frozen database"));
        assert!(failed, "{name} answered through a frozen link");
        let took = started.elapsed();
        assert!(took < DEADLINE + MARGIN, "{name} failed after {took:?}");
    }

    proxy.set(fault_proxy::Fault::PassThrough);
    let answered = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if outbox.deliveries(&id).await.is_ok_and(|d| d.len() == 1) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(answered.is_ok(), "the outbox did not answer again");
}

/// A store set up for PgBouncer in transaction mode (simple statements, its listener on the
/// server) is one the outbox works on too: enqueued in the effect's transaction, claimed,
/// delivered and recorded through the pooler, whose server connections several clients
/// share. (Prepared statements do not survive it: a statement prepared on one server
/// connection is missing on the next, or another client's of the same name is run.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_an_outbox_behind_pgbouncer_in_transaction_mode_delivers() {
    let url = fresh_database().await;
    let bouncer = bouncer::PrivateBouncer::start(&url, database_of(&url), 2).await;
    let store = idem_postgres::PgStore::builder()
        .max_connections(8)
        .statements(idem_postgres::StatementMode::Simple)
        .listener_url(&url)
        .connect(bouncer.url())
        .await
        .expect("a store");
    store.migrate().await.expect("migrated");
    let outbox = PgOutbox::open(&store).await.expect("an outbox");
    let receiver = Receiver::start().await;
    outbox
        .register(&endpoint(
            "merchant",
            &receiver.url(),
            quick(3, Duration::from_millis(1)),
        ))
        .await
        .expect("registered");
    let idem = Idempotency::new(store.clone());
    let mut ids = HashSet::new();
    for n in 0..20 {
        let sender = outbox.clone();
        let request = idem
            .request("acct_1", "POST", "/charges")
            .key(Some(&format!("k-{n}")))
            .body(b"{}")
            .build()
            .expect("a request");
        let outcome = idem
            .run_in_transaction(&request, move |tx, _lease| {
                Box::pin(async move {
                    let message = Message::bytes("text/plain", "charged").to("merchant");
                    let id = sender
                        .enqueue(&mut *tx, &message)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok::<_, String>(StoredResponse::new(201, id.to_string()))
                })
            })
            .await;
        let Ok(Outcome::Executed(response)) = outcome else {
            panic!("{outcome:?}");
        };
        ids.insert(String::from_utf8(response.body).expect("an id"));
    }
    let dispatcher = outbox.dispatcher().allow_loopback(true);
    let mut failures = Vec::new();
    for _ in 0..10 {
        if let Err(error) = dispatcher.dispatch_due().await {
            failures.push(error.to_string());
        }
    }
    assert_eq!(failures, Vec::<String>::new(), "every claim went through");
    let received: HashSet<String> = receiver.received().into_iter().map(|r| r.id).collect();
    assert_eq!(received, ids, "every message delivered");
    for id in &ids {
        let delivery = &outbox
            .deliveries(&MessageId::from_stored(id.clone()))
            .await
            .expect("deliveries")[0];
        assert_eq!(delivery.state, DeliveryState::Delivered);
    }
}

/// The last attempt of a delivery fails and the answer to its record is lost (the server
/// committed it dead, the connection dropped): the delivery is dead, and, dead, it is reported
/// as an `OutboxEvent` all the same once the database answers again, as C17 and
/// docs/outbox.md say of every dead delivery ("kept ... and reported").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_a_dead_delivery_whose_record_answer_is_lost_is_still_reported() {
    let url = fresh_database().await;
    let (store, outbox) = pg_outbox(&url).await;
    let (head, database) = url.rsplit_once('/').expect("a database in the URL");
    let (user, server) = head.rsplit_once('@').expect("a server in the URL");
    let proxy = fault_proxy::FaultProxy::start(server)
        .await
        .expect("a proxy");
    let (_, proxied) = pg_outbox(&format!("{user}@{}/{database}", proxy.addr())).await;
    let receiver = Receiver::start().await;
    // One attempt only, answered 500 with a body that holds `LOST` whether the record carries
    // it as bytes or in hex (`LOST` is the hex of its tail).
    const LOST: &[u8] = b"6c6f737420616e73776572";
    receiver.plan(|p| {
        p.statuses.extend([500, 500, 500]);
        p.body = Some(b"6c6f737420616e73776572lost answer");
    });
    outbox
        .register(&endpoint(
            "merchant",
            &receiver.url(),
            quick(0, Duration::from_millis(1)),
        ))
        .await
        .expect("registered");
    let events = Arc::new(Mutex::new(Vec::<OutboxEvent>::new()));
    let seen = Arc::clone(&events);
    let dispatcher = proxied
        .dispatcher()
        .allow_loopback(true)
        .lease(Duration::from_millis(300))
        .expect("a lease")
        .on_event(move |event| seen.lock().expect("events").push(event.clone()));
    let id = enqueue(&store, &outbox, "merchant", 1).await;
    // The record carries the response's first KiB: its answer is lost.
    proxy.set(fault_proxy::LoseAnswer::to(LOST));
    assert_eq!(dispatcher.dispatch_due().await.expect("dispatched"), 1);
    assert_eq!(proxy.answers_lost(), 1, "the record's answer was lost");
    let delivery = &outbox.deliveries(&id).await.expect("deliveries")[0];
    assert_eq!(
        (delivery.state, delivery.attempts),
        (DeliveryState::Dead, 1),
        "recorded dead by the server"
    );
    // The database answers again; the dispatcher goes on past the claim.
    tokio::time::sleep(Duration::from_millis(400)).await;
    for _ in 0..3 {
        dispatcher.dispatch_due().await.expect("dispatched");
    }
    assert_eq!(receiver.received().len(), 1, "never attempted again");
    let dead: Vec<OutboxEvent> = events
        .lock()
        .expect("events")
        .iter()
        .filter(|e| e.message_id == id && matches!(e.kind, OutboxEventKind::Dead(_)))
        .cloned()
        .collect();
    assert_eq!(dead.len(), 1, "the dead delivery is reported: {dead:?}");
}

/// A running dispatcher of an outbox whose store is behind PgBouncer in transaction mode
/// listens where the store's own listener does (`listener_url`, on the server), never through
/// the pooler: a `LISTEN` there stays on a server connection the pooler hands to other
/// clients, whose statements then meet notifications they never asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_a_dispatcher_behind_pgbouncer_never_listens_through_it() {
    let url = fresh_database().await;
    let bouncer = bouncer::PrivateBouncer::start(&url, database_of(&url), 2).await;
    let store = idem_postgres::PgStore::builder()
        .max_connections(8)
        .statements(idem_postgres::StatementMode::Simple)
        .listener_url(&url)
        .connect(bouncer.url())
        .await
        .expect("a store");
    store.migrate().await.expect("migrated");
    let outbox = PgOutbox::open(&store).await.expect("an outbox");
    let receiver = Receiver::start().await;
    outbox
        .register(&endpoint(
            "merchant",
            &receiver.url(),
            quick(3, Duration::from_millis(1)),
        ))
        .await
        .expect("registered");
    let dispatching = outbox
        .dispatcher()
        .allow_loopback(true)
        .poll_interval(Duration::from_millis(50))
        .start()
        .expect("started");
    // The dispatcher's listener is up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut failures = Vec::new();
    let mut ids = HashSet::new();
    for n in 0..10 {
        let enqueued = async {
            let mut tx = store.pool().begin().await.map_err(|e| e.to_string())?;
            let message = Message::bytes("text/plain", format!("charge {n}")).to("merchant");
            let id = outbox
                .enqueue(&mut tx, &message)
                .await
                .map_err(|e| e.to_string())?;
            tx.commit().await.map_err(|e| e.to_string())?;
            Ok::<_, String>(id)
        }
        .await;
        match enqueued {
            Ok(id) => {
                ids.insert(id.to_string());
            }
            Err(error) => failures.push(error),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        failures,
        Vec::<String>::new(),
        "every effect's transaction went through"
    );
    assert!(
        receiver
            .wait_for_effects(ids.len(), Duration::from_secs(10))
            .await
    );
    dispatching.stop().await;
}

/// An operator's retry of a dead delivery starts its attempts over (`requeue.sql`: attempts
/// 0), so its first new attempt has the number of an attempt already in the table. When the
/// record of that new attempt fails (here a trigger refuses it: nothing is written, the
/// delivery still carries the claim), the dispatcher must not take the old attempt of the
/// same number for it and report the delivery delivered: it is not recorded, and is attempted
/// again once the claim runs out (C17).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_pg_an_unrecorded_attempt_after_a_retry_is_not_reported_recorded() {
    let url = fresh_database().await;
    let (store, outbox) = pg_outbox(&url).await;
    let receiver = Receiver::start().await;
    receiver.plan(|p| p.statuses.extend([500]));
    outbox
        .register(&endpoint(
            "merchant",
            &receiver.url(),
            quick(0, Duration::from_millis(1)),
        ))
        .await
        .expect("registered");
    let events = Arc::new(Mutex::new(Vec::<OutboxEvent>::new()));
    let seen = Arc::clone(&events);
    let dispatcher = outbox
        .dispatcher()
        .allow_loopback(true)
        .lease(Duration::from_millis(300))
        .expect("a lease")
        .on_event(move |event| seen.lock().expect("events").push(event.clone()));
    let id = enqueue(&store, &outbox, "merchant", 1).await;
    assert_eq!(dispatcher.dispatch_due().await.expect("dispatched"), 1);
    let delivery = &outbox.deliveries(&id).await.expect("deliveries")[0];
    assert_eq!(delivery.state, DeliveryState::Dead, "one attempt, refused");
    assert_eq!(outbox.retry(&id).await.expect("retried"), 1);
    // The next record of an attempt fails: nothing of it is written.
    let mut conn = sqlx::PgConnection::connect(&url)
        .await
        .expect("a connection");
    for statement in [
        "CREATE FUNCTION refuse_attempt() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'attempt refused'; END $$",
        "CREATE TRIGGER refuse_attempt BEFORE INSERT ON idem_outbox_attempts \
         FOR EACH ROW EXECUTE FUNCTION refuse_attempt()",
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut conn)
            .await
            .expect("trigger");
    }
    events.lock().expect("events").clear();
    assert_eq!(dispatcher.dispatch_due().await.expect("dispatched"), 1);
    assert_eq!(
        receiver.received().len(),
        2,
        "delivered again after the retry"
    );
    let delivery = &outbox.deliveries(&id).await.expect("deliveries")[0];
    assert_ne!(
        delivery.state,
        DeliveryState::Delivered,
        "the record failed: nothing written"
    );
    let reported: Vec<OutboxEvent> = events
        .lock()
        .expect("events")
        .iter()
        .filter(|e| e.message_id == id)
        .cloned()
        .collect();
    assert!(
        reported.is_empty(),
        "an attempt not recorded is not reported as recorded: {reported:?}"
    );
}

/// The database `url` names (its path, without parameters).
fn database_of(url: &str) -> &str {
    let path = url.rsplit_once('/').map_or("", |(_, path)| path);
    path.split('?').next().unwrap_or(path)
}
