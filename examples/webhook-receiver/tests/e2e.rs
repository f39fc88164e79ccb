//! End-to-end tests of `webhook-receiver`: the real binary as a child process on a free
//! loopback port with a fresh SQLite file per test, and a sender that signs and retries like
//! Stripe. Every scenario checks the invoices committed (`GET /test/invoices/count`) and the
//! audit trail (`GET /test/audit`), `IDEM_TEST_HOOKS=1`.

mod support;

use idem::inbox::SignatureScheme;
use reqwest::StatusCode;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::{
    assert_problem, new_event_id, now_unix, order_amount, order_quantity, shuffle, Event, Server,
    TestEnv,
};

const SECRET: &str = "whsec_e2e_0123456789abcdef";

fn scheme(secrets: &str) -> SignatureScheme {
    SignatureScheme::from_comma_separated(secrets).expect("a signature scheme")
}

/// Asserts a 200 acknowledgement `{"received":true}`.
fn assert_acknowledged(reply: &support::Reply) {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.describe());
    assert_eq!(
        reply.json(),
        json!({"received": true}),
        "{}",
        reply.describe()
    );
}

/// Asserts a 400 problem of `kind`.
fn assert_refused(reply: &support::Reply, kind: &str) {
    assert_problem(reply, 400, kind);
}

/// Scenario 1: 1,000 deliveries of 100 `payment_intent.succeeded` events (100 orders), ten of
/// each, shuffled, from 32 concurrent senders that retry 409s and 5xx like Stripe: exactly 100
/// invoices, every delivery acknowledged, exactly one live processing per event, and the
/// audit trail counts every delivery that reached the inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_redeliveries_issue_one_invoice_per_order() {
    const EVENTS: u32 = 100;
    const COPIES: usize = 10;
    const SENDERS: usize = 32;
    let env = TestEnv::new("concurrent");
    let server = Server::start(&env, SECRET).await;
    let sender = server.sender();
    let signing = Arc::new(scheme(SECRET));

    let events: Vec<Event> = (1..=EVENTS)
        .map(|n| {
            Event::payment_succeeded(
                &new_event_id(&format!("n{n}")),
                &format!("ord_{n}"),
                order_amount(n),
            )
        })
        .collect();
    let mut queue: Vec<Event> = events
        .iter()
        .flat_map(|e| std::iter::repeat_n(e.clone(), COPIES))
        .collect();
    shuffle(&mut queue);
    let queue = Arc::new(queue);
    let next = Arc::new(AtomicUsize::new(0));

    let mut tasks = Vec::new();
    for _ in 0..SENDERS {
        let (queue, next, sender, signing) = (
            Arc::clone(&queue),
            Arc::clone(&next),
            sender.clone(),
            Arc::clone(&signing),
        );
        tasks.push(tokio::spawn(async move {
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(event) = queue.get(i) else { break };
                let delivered = sender
                    .deliver(event, &signing, Duration::from_secs(120))
                    .await;
                done.push((event.id.clone(), delivered));
            }
            done
        }));
    }
    let mut deliveries = 0usize;
    let mut attempts_answered = 0u64;
    let mut live: BTreeMap<String, usize> = BTreeMap::new();
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    for task in tasks {
        for (id, delivered) in task.await.expect("a sender task panicked") {
            deliveries += 1;
            assert_eq!(delivered.transport_errors, 0, "{id}: connection errors");
            assert_acknowledged(&delivered.reply);
            attempts_answered += delivered.statuses.len() as u64;
            for status in &delivered.statuses {
                *statuses.entry(*status).or_default() += 1;
            }
            if !delivered.reply.replayed() {
                *live.entry(id).or_default() += 1;
            }
        }
    }
    eprintln!(
        "{deliveries} deliveries, {attempts_answered} attempts answered, statuses {statuses:?}"
    );
    assert_eq!(deliveries, EVENTS as usize * COPIES);
    assert_eq!(
        live.len(),
        EVENTS as usize,
        "every event is processed live exactly once (the others are replays)"
    );
    assert!(
        live.values().all(|n| *n == 1),
        "an event was processed live twice: {live:?}"
    );

    assert_eq!(
        sender.invoice_count().await,
        u64::from(EVENTS),
        "one invoice per order"
    );
    let units: i64 = (1..=EVENTS).map(order_quantity).sum();
    assert_eq!(
        sender.units_sold().await,
        units,
        "stock taken once per order"
    );

    let audit = sender.audit().await;
    assert_eq!(audit.len(), EVENTS as usize, "{audit:#?}");
    let ids: BTreeSet<&str> = audit
        .iter()
        .filter_map(|e| e["event_id"].as_str())
        .collect();
    assert_eq!(ids, events.iter().map(|e| e.id.as_str()).collect());
    let mut counted = 0u64;
    for entry in &audit {
        assert_eq!(entry["outcome"], "processed", "{entry}");
        assert_eq!(entry["conflicts"], 0, "{entry}");
        assert!(entry["processed"].as_u64().is_some(), "{entry}");
        let n = entry["deliveries"].as_u64().expect("deliveries");
        assert!(n >= COPIES as u64, "{entry}");
        counted += n;
    }
    assert_eq!(
        counted, attempts_answered,
        "the audit counts every delivery attempt the receiver answered"
    );
}

/// Scenario 2: verification comes first. A wrong secret, a missing or malformed header, a
/// stale or future timestamp, an altered body: 400 saying which, nothing recorded. An
/// authentic body that is not an event with an id: 400. During a rotation
/// (`WEBHOOK_SECRET=old,new`) deliveries signed with either secret, or both, are accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn signatures_are_verified_before_anything_is_recorded() {
    let env = TestEnv::new("signatures");
    let server = Server::start(&env, "whsec_old_e2e, whsec_new_e2e").await;
    let sender = server.sender();
    let (old, new) = (scheme("whsec_old_e2e"), scheme("whsec_new_e2e"));
    let event = Event::payment_succeeded(&new_event_id("sig"), "ord_1", order_amount(1));
    let now = now_unix();

    let wrong = scheme("whsec_wrong").sign(&event.body, now);
    let reply = sender
        .post(&event.body, Some(&wrong), &[])
        .await
        .expect("an answer");
    assert_refused(&reply, "signature-mismatch");

    let reply = sender
        .post(&event.body, None, &[])
        .await
        .expect("an answer");
    assert_refused(&reply, "signature-missing");

    let reply = sender
        .post(&event.body, Some("t=soon,v1=abc"), &[])
        .await
        .expect("an answer");
    assert_refused(&reply, "signature-malformed");

    let stale = old.sign(&event.body, now_unix() - 301);
    let reply = sender
        .post(&event.body, Some(&stale), &[])
        .await
        .expect("an answer");
    assert_refused(&reply, "signature-stale");

    // Well past the tolerance (300 s): the receiver reads its clock later than this line, and
    // at 301 a second boundary in between brought the timestamp back within it (a 200).
    let future = new.sign(&event.body, now_unix() + 310);
    let reply = sender
        .post(&event.body, Some(&future), &[])
        .await
        .expect("an answer");
    assert_refused(&reply, "signature-future");

    let mut altered = event.body.clone();
    let header = new.sign(&altered, now_unix());
    altered.extend_from_slice(b" ");
    let reply = sender
        .post(&altered, Some(&header), &[])
        .await
        .expect("an answer");
    assert_refused(&reply, "signature-mismatch");

    for body in [
        &b"not json"[..],
        br#"{"object":"event","type":"payment_intent.succeeded"}"#,
    ] {
        let header = new.sign(body, now_unix());
        let reply = sender
            .post(body, Some(&header), &[])
            .await
            .expect("an answer");
        assert_refused(&reply, "event-invalid");
    }

    assert_eq!(
        sender.audit().await,
        Vec::<serde_json::Value>::new(),
        "nothing recorded"
    );
    assert_eq!(sender.invoice_count().await, 0, "no invoice");

    // The rotation: the new secret, the old one, and both in one header.
    assert_acknowledged(&sender.deliver_once(&event, &new).await);
    let by_old = Event::payment_succeeded(&new_event_id("old"), "ord_2", order_amount(2));
    assert_acknowledged(&sender.deliver_once(&by_old, &old).await);
    let by_both = Event::payment_succeeded(&new_event_id("both"), "ord_3", order_amount(3));
    let header = scheme("whsec_newer_unknown,whsec_new_e2e")
        .sign_with_all_secrets(&by_both.body, now_unix());
    let reply = sender
        .post(&by_both.body, Some(&header), &[])
        .await
        .expect("an answer");
    assert_acknowledged(&reply);

    assert_eq!(sender.invoice_count().await, 3);
    let audit = sender.audit().await;
    assert_eq!(audit.len(), 3, "{audit:#?}");
    assert!(
        audit
            .iter()
            .all(|e| e["deliveries"] == 1 && e["outcome"] == "processed"),
        "{audit:#?}"
    );

    let log = server.log();
    assert!(
        log.contains("outcome=\"bad_signature\"") || log.contains("outcome=bad_signature"),
        "{log}"
    );
    for secret in ["whsec_old_e2e", "whsec_new_e2e"] {
        assert!(!log.contains(secret), "the log shows a secret:\n{log}");
    }
    assert!(
        !log.contains("amount_received"),
        "the log shows a payload:\n{log}"
    );
}

/// Scenario 3: the process dies between the invoice's commit and the answer (the sender sees
/// a connection error); restarted on the same file, the redelivery is acknowledged as a
/// duplicate and there is still exactly one invoice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_between_commit_and_answer_is_acknowledged_on_redelivery() {
    let env = TestEnv::new("crash");
    let mut server = Server::start(&env, SECRET).await;
    let signing = scheme(SECRET);
    let event = Event::payment_succeeded(&new_event_id("crash"), "ord_5", order_amount(5));

    let header = signing.sign(&event.body, now_unix());
    let crashed = server
        .sender()
        .post(
            &event.body,
            Some(&header),
            &[("x-test-crash-after-commit", "1")],
        )
        .await;
    assert!(
        crashed.is_err(),
        "the receiver answered instead of dying: {crashed:?}"
    );
    let status = server.wait_for_exit(Duration::from_secs(10)).await;
    assert!(
        !status.success(),
        "the receiver should have aborted: {status}"
    );
    assert!(
        server.log().contains("X-Test-Crash-After-Commit"),
        "{}",
        server.log_tail(20)
    );

    let mut server = Server::start(&env, SECRET).await;
    let sender = server.sender();
    assert_eq!(
        sender.invoice_count().await,
        1,
        "the invoice committed before the crash"
    );
    let delivered = sender
        .deliver(&event, &signing, Duration::from_secs(30))
        .await;
    assert_acknowledged(&delivered.reply);
    assert!(
        delivered.reply.replayed(),
        "the redelivery is a duplicate: {}",
        delivered.reply.describe()
    );
    assert_eq!(sender.invoice_count().await, 1, "still exactly one invoice");
    assert_eq!(
        sender.units_sold().await,
        order_quantity(5),
        "stock taken once"
    );
    // The audit trail is in the same file: it kept the delivery that crashed.
    let entry = sender
        .audit_entry(&event.id)
        .await
        .expect("the event's audit entry");
    assert_eq!(entry["deliveries"], 2, "{entry}");
    assert_eq!(
        entry["outcome"], "processed",
        "the redelivery records what the crash hid: {entry}"
    );
    assert!(entry["processed"].as_u64().is_some(), "{entry}");
    assert_eq!(entry["conflicts"], 0, "{entry}");
    eprintln!("audit entry after the crash and the redelivery: {entry}");

    let status = server.terminate(Duration::from_secs(30)).await;
    assert!(status.success(), "SIGTERM: a clean exit, got {status}");
}

/// Scenario 4: the same event id with another payload is refused with 422, issues nothing,
/// and is counted in the audit trail; the original is still acknowledged as a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_id_with_another_payload_is_refused() {
    let env = TestEnv::new("conflict");
    let server = Server::start(&env, SECRET).await;
    let sender = server.sender();
    let signing = scheme(SECRET);
    let id = new_event_id("reuse");
    let original = Event::payment_succeeded(&id, "ord_10", order_amount(10));
    let other = Event::payment_succeeded(&id, "ord_11", order_amount(11));

    let first = sender
        .deliver(&original, &signing, Duration::from_secs(30))
        .await;
    assert_acknowledged(&first.reply);
    assert!(!first.reply.replayed());

    let reused = sender
        .deliver(&other, &signing, Duration::from_secs(30))
        .await;
    assert_eq!(
        reused.reply.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        reused.reply.describe()
    );
    assert_eq!(reused.reply.problem_kind(), "event-id-reused");

    let again = sender
        .deliver(&original, &signing, Duration::from_secs(30))
        .await;
    assert_acknowledged(&again.reply);
    assert!(again.reply.replayed(), "{}", again.reply.describe());

    assert_eq!(sender.invoice_count().await, 1, "no second invoice");
    assert_eq!(
        sender.units_sold().await,
        order_quantity(10),
        "ord_11 untouched"
    );
    let entry = sender
        .audit_entry(&id)
        .await
        .expect("the event's audit entry");
    assert_eq!(entry["conflicts"], 1, "{entry}");
    assert_eq!(entry["deliveries"], 3, "{entry}");
    assert_eq!(entry["outcome"], "processed", "{entry}");
}

/// Scenario 5: other event types, an unknown order and a payment without an order id are
/// acknowledged and recorded without effect; the operator's `GET /audit` pages the trail.
/// Stripe changes `pending_webhooks` from one delivery of an event to the next (and another
/// client may re-encode the JSON): such a redelivery is a duplicate, never a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redelivery_with_another_pending_webhooks_count_is_a_duplicate() {
    let env = TestEnv::new("pending");
    let server = Server::start(&env, SECRET).await;
    let sender = server.sender();
    let signing = scheme(SECRET);
    let id = new_event_id("pending");
    let first = Event::payment_succeeded(&id, "ord_12", order_amount(12));
    let mut body: serde_json::Value = serde_json::from_slice(&first.body).expect("json");
    body["pending_webhooks"] = serde_json::json!(3);
    let redelivered = Event::from_json(body);
    assert_ne!(first.body, redelivered.body);

    let live = sender
        .deliver(&first, &signing, Duration::from_secs(30))
        .await;
    assert_acknowledged(&live.reply);
    let again = sender
        .deliver(&redelivered, &signing, Duration::from_secs(30))
        .await;
    assert_acknowledged(&again.reply);
    assert!(again.reply.replayed(), "{}", again.reply.describe());
    assert_eq!(sender.invoice_count().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn other_events_and_unknown_orders_are_acknowledged_without_effect() {
    let env = TestEnv::new("no-effect");
    let server = Server::start(&env, SECRET).await;
    let sender = server.sender();
    let signing = scheme(SECRET);
    let before = now_unix() as u64 * 1000;

    let customer = Event::other(&new_event_id("cus"), "customer.created");
    let failed = Event::other(&new_event_id("failed"), "payment_intent.payment_failed");
    let unknown = Event::payment_succeeded(&new_event_id("unknown"), "ord_999999", 100);
    let no_order = Event::from_json(json!({
        "id": new_event_id("bare"),
        "object": "event",
        "type": "payment_intent.succeeded",
        "data": {"object": {"id": "pi_bare", "object": "payment_intent", "amount": 500, "metadata": {}}},
    }));
    for event in [&customer, &failed, &unknown, &no_order] {
        let delivered = sender
            .deliver(event, &signing, Duration::from_secs(30))
            .await;
        assert_acknowledged(&delivered.reply);
        assert!(
            !delivered.reply.replayed(),
            "{}",
            delivered.reply.describe()
        );
    }
    let again = sender
        .deliver(&unknown, &signing, Duration::from_secs(30))
        .await;
    assert_acknowledged(&again.reply);
    assert!(again.reply.replayed(), "{}", again.reply.describe());

    assert_eq!(sender.invoice_count().await, 0, "no invoice");
    assert_eq!(sender.units_sold().await, 0, "no stock taken");
    let audit = sender.audit().await;
    assert_eq!(audit.len(), 4, "{audit:#?}");
    assert!(
        audit.iter().all(|e| e["outcome"] == "processed"),
        "{audit:#?}"
    );

    // The operator's endpoint: a time range and a limit.
    let page = sender.get_json("/audit?source=stripe&limit=2").await;
    assert_eq!(page["entries"].as_array().map(Vec::len), Some(2), "{page}");
    let page = sender
        .get_json(&format!(
            "/audit?source=stripe&from={before}&to={}",
            before + 3_600_000
        ))
        .await;
    assert_eq!(page["count"], 4, "{page}");
    let page = sender
        .get_json(&format!("/audit?source=stripe&from={}", before + 3_600_000))
        .await;
    assert_eq!(page["count"], 0, "{page}");
    let page = sender.get_json("/audit?source=paypal").await;
    assert_eq!(page["count"], 0, "{page}");
    let bad = sender.get_reply("/audit?limit=0").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.describe());
    let bad = sender.get_reply("/audit?from=yesterday").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.describe());
}

/// Without `WEBHOOK_SECRET` the receiver refuses to start, and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_to_start_without_a_secret() {
    let env = TestEnv::new("no-secret");
    let refused = Server::start_without_secret(&env).await;
    assert_eq!(refused.status.code(), Some(2), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("WEBHOOK_SECRET is not set"),
        "{}",
        refused.stderr
    );
}
