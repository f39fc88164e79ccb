//! `--webhook-url`/`--webhook-secret`: each succeeded charge emits one `charge.succeeded`
//! event through the outbox (C17), signed, with the charge under `data.object`; a replay of
//! the request emits nothing more. On SQLite and on PostgreSQL, the server a real child
//! process.

#[macro_use]
mod support;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use idem_signature::{StandardWebhooks, WebhookScheme};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::*;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

type Log = Arc<Mutex<Vec<(HeaderMap, Bytes)>>>;

async fn receive(State(log): State<Log>, headers: HeaderMap, body: Bytes) -> &'static str {
    log.lock().expect("log").push((headers, body));
    "ok"
}

/// A receiver on a loopback port: its URL and what it got.
async fn receiver() -> (String, Log) {
    let log = Log::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let url = format!(
        "http://{}/webhooks/standard",
        listener.local_addr().expect("an address")
    );
    let app = axum::Router::new()
        .fallback(receive)
        .with_state(Arc::clone(&log));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, log)
}

async fn charge_succeeded_is_delivered_once_signed(backend: Backend) {
    let env = TestEnv::new(backend, "webhooks").await;
    let (url, log) = receiver().await;
    let server = Server::start_with(
        &env,
        &env.database,
        None,
        &[
            ("IDEM_WEBHOOK_URL", url.as_str()),
            ("IDEM_WEBHOOK_SECRET", SECRET),
        ],
    )
    .await;
    let api = server.api();
    let req = ChargeRequest::form(&new_key("webhook"), 4242);
    let reply = api.post_raw(&req).await;
    let charge = reply.json();
    let replay = api.post_raw(&req).await;
    assert!(replay.replayed(), "{}", replay.describe());

    let deadline = Instant::now() + Duration::from_secs(10);
    while log.lock().expect("log").is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let received = log.lock().expect("log").clone();
    assert_eq!(
        received.len(),
        1,
        "one charge, one event, whatever the retries of the request"
    );
    let (headers, body) = &received[0];
    let pairs: Vec<(String, Vec<u8>)> = headers
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect();
    let scheme = StandardWebhooks::new([SECRET]).expect("a secret");
    let verified = scheme
        .verify(&pairs, body, idem_signature::now_unix())
        .expect("signed with the endpoint's secret");
    assert!(verified.event_id().is_some_and(|id| id.starts_with("msg_")));
    let event: serde_json::Value = serde_json::from_slice(body).expect("JSON");
    assert_eq!(event["type"], "charge.succeeded");
    assert_eq!(event["object"], "event");
    assert_eq!(event["data"]["object"]["id"], charge["id"]);
    assert_eq!(event["data"]["object"]["amount"], 4242);
    eprintln!(
        "{backend:?}: charge {} -> one signed charge.succeeded",
        charge["id"]
    );
}

on_both_backends! {
    charge_succeeded_is_delivered_once_signed => c17_sqlite_charge_succeeded_is_delivered_once_signed, c17_postgres_charge_succeeded_is_delivered_once_signed;
}

/// The server killed (SIGKILL) after the receiver got the event and before the attempt was
/// recorded: the restarted server delivers it again, with the same `webhook-id`.
async fn killed_after_the_receiver_got_it(backend: Backend) {
    const LEASE_MS: u64 = 2000;
    let env = TestEnv::new(backend, "webhook-killed").await;
    let log = Log::default();
    let hold = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let url = format!(
        "http://{}/webhooks/standard",
        listener.local_addr().expect("an address")
    );
    let (seen, holding) = (Arc::clone(&log), Arc::clone(&hold));
    let app = axum::Router::new().fallback(move |headers: HeaderMap, body: Bytes| {
        let (seen, holding) = (Arc::clone(&seen), Arc::clone(&holding));
        async move {
            seen.lock().expect("log").push((headers, body));
            // The first answer never comes in time: the server dies meanwhile.
            if holding.swap(false, std::sync::atomic::Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
            "ok"
        }
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let vars = [
        ("IDEM_WEBHOOK_URL", url.as_str()),
        ("IDEM_WEBHOOK_SECRET", SECRET),
    ];
    let mut server = Server::start_with(&env, &env.database, Some(LEASE_MS), &vars).await;
    let reply = server
        .api()
        .post_raw(&ChargeRequest::form(&new_key("killed-webhook"), 4242))
        .await;
    let charge = reply.json();
    let deadline = Instant::now() + Duration::from_secs(10);
    while log.lock().expect("log").is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(log.lock().expect("log").len(), 1, "the receiver got it");
    server.kill().await;

    let _restarted = Server::start_with(&env, &env.database, Some(LEASE_MS), &vars).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while log.lock().expect("log").len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let received = log.lock().expect("log").clone();
    assert_eq!(
        received.len(),
        2,
        "delivered again once its claim ran out, and only once"
    );
    let ids: Vec<_> = received
        .iter()
        .map(|(headers, _)| {
            headers
                .get("webhook-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        })
        .collect();
    assert!(
        ids[0].is_some() && ids[0] == ids[1],
        "the same webhook-id: {ids:?}"
    );
    let event: serde_json::Value = serde_json::from_slice(&received[1].1).expect("JSON");
    assert_eq!(event["data"]["object"]["id"], charge["id"]);
    eprintln!("{backend:?} killed: messages 1, requests 2, one webhook-id, lost 0");
}

on_both_backends! {
    killed_after_the_receiver_got_it => c17_sqlite_server_killed_after_the_receiver_got_it, c17_postgres_server_killed_after_the_receiver_got_it;
}
