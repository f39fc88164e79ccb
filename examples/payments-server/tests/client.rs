//! idem-client (the calling side) against this payments server, run as a real process on a
//! SQLite file: a slow first attempt, concurrent copies of one operation, a
//! reused key, a 409 while the original runs, and a server killed and restarted mid-sequence.
//! Charges are counted through the server's own API; the key of every attempt is read by a
//! proxy in front of the server.

mod client_support;

use client_support::payments::{charge_count, listed_charges, port, World, API_KEY};
use client_support::proxy::Proxy;
use idem_client::{Backoff, Client, Error, IdempotencyKey, Outcome, RetryPolicy, Stop};
use std::time::{Duration, Instant};

fn client(policy: RetryPolicy) -> Client {
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a reqwest client");
    Client::new(http).with_policy(policy)
}

/// `POST url` of a charge of `amount` USD cents, slow by `delay_ms` inside its transaction.
fn charge(client: &Client, url: &str, amount: u32, delay_ms: u64) -> reqwest::RequestBuilder {
    client
        .post(url)
        .bearer_auth(API_KEY)
        .header("X-Test-Delay-Ms", delay_ms.to_string())
        .form(&[
            ("amount", amount.to_string()),
            ("currency", "usd".to_owned()),
            ("description", "idem-client test".to_owned()),
        ])
}

fn quick_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(50), Duration::from_millis(200))
}

fn charge_id(response: &idem_client::Response) -> String {
    let body: serde_json::Value = response.json().expect("a JSON charge");
    body["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no charge id in {}", response.text()))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_first_attempt_slower_than_its_timeout_is_retried_under_its_key_and_charges_once() {
    let mut world = World::new();
    let server = world.start(0, 60_000).await;
    let proxy = Proxy::start(server.addr(), 0).await;
    let client = client(
        RetryPolicy::default()
            .attempt_timeout(Duration::from_millis(300))
            .deadline(Duration::from_secs(20))
            .max_attempts(40)
            .backoff(quick_backoff()),
    );
    let response = client
        .send(charge(&client, &proxy.url("/v1/charges"), 4242, 1500))
        .await
        .expect("the charge ends with its answer");

    assert_eq!(response.status().as_u16(), 200, "{}", response.text());
    assert!(response.attempts() >= 2, "the first attempt timed out");
    assert!(
        response.replayed(),
        "the answer is the first attempt's, replayed"
    );
    let key = response
        .key()
        .expect("a POST carries a key")
        .as_str()
        .to_owned();
    let keys = proxy.post_keys();
    assert_eq!(keys.len(), response.attempts() as usize, "{keys:?}");
    assert!(
        keys.iter().all(|k| k.as_deref() == Some(key.as_str())),
        "{keys:?}"
    );
    assert_eq!(charge_count(&server).await, 1);
    let listed = listed_charges(&server).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0]["id"].as_str(),
        Some(charge_id(&response).as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c04_eight_concurrent_copies_of_one_operation_charge_once() {
    let mut world = World::new();
    let server = world.start(0, 60_000).await;
    let proxy = Proxy::start(server.addr(), 0).await;
    let client = client(
        RetryPolicy::default()
            .deadline(Duration::from_secs(30))
            .max_attempts(40)
            .backoff(quick_backoff()),
    );
    let key = IdempotencyKey::random().expect("a key");
    let url = proxy.url("/v1/charges");
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (client, key, url) = (client.clone(), key.clone(), url.clone());
            tokio::spawn(async move {
                client
                    .operation(charge(&client, &url, 999, 800))
                    .key(key)
                    .send()
                    .await
            })
        })
        .collect();
    let mut ids = Vec::new();
    let mut executed = 0;
    for task in tasks {
        let response = task
            .await
            .expect("the task")
            .expect("every copy ends with the charge");
        assert_eq!(response.status().as_u16(), 200, "{}", response.text());
        assert_eq!(response.key(), Some(&key));
        if !response.replayed() {
            executed += 1;
        }
        ids.push(charge_id(&response));
    }
    assert_eq!(executed, 1, "one copy ran, the others got its replay");
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    assert_eq!(charge_count(&server).await, 1);
    let keys = proxy.post_keys();
    assert!(keys.len() >= 8, "{keys:?}");
    assert!(
        keys.iter().all(|k| k.as_deref() == Some(key.as_str())),
        "{keys:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c03_a_key_reused_with_another_body_is_a_422_that_is_not_retried() {
    let mut world = World::new();
    let server = world.start(0, 60_000).await;
    let proxy = Proxy::start(server.addr(), 0).await;
    let client = client(RetryPolicy::default().backoff(quick_backoff()));
    let key = IdempotencyKey::new(format!("order-{}", e2e_support::random_u64())).expect("key");
    let url = proxy.url("/v1/charges");
    let first = client
        .operation(charge(&client, &url, 100, 0))
        .key(key.clone())
        .send()
        .await
        .expect("the first charge");
    assert_eq!(first.attempts(), 1);

    let error = client
        .operation(charge(&client, &url, 200, 0))
        .key(key.clone())
        .send()
        .await
        .expect_err("another body under the same key");
    let response = error.response().expect("the 422 is kept");
    assert_eq!(response.status().as_u16(), 422, "{}", response.text());
    assert_eq!(error.attempts(), 1, "a 422 is never retried");
    assert_eq!(error.stop(), Some(Stop::NotRetryable));
    assert_eq!(error.outcome(), Outcome::NotExecuted);
    assert_eq!(error.key(), Some(&key));
    assert_eq!(proxy.post_keys().len(), 2, "one attempt each");
    assert_eq!(charge_count(&server).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c05_a_409_in_flight_is_retried_after_its_retry_after_and_ends_with_the_replay() {
    let mut world = World::new();
    let server = world.start(0, 60_000).await;
    let key = IdempotencyKey::random().expect("a key");
    let url = server.url("/v1/charges");
    // The original: one slow attempt, sent on its own.
    let original = {
        let client = client(RetryPolicy::never());
        let (key, url) = (key.clone(), url.clone());
        tokio::spawn(async move {
            client
                .operation(charge(&client, &url, 777, 2000))
                .key(key)
                .send()
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The retrying copy: a backoff far shorter than a second, so only the 409's
    // `Retry-After` (1 s) explains the pauses.
    let retrying = client(
        RetryPolicy::default()
            .deadline(Duration::from_secs(20))
            .max_attempts(20)
            .backoff(Backoff::new(
                Duration::from_millis(10),
                Duration::from_millis(10),
            )),
    );
    let started = Instant::now();
    let replay = retrying
        .operation(charge(&retrying, &url, 777, 0))
        .key(key.clone())
        .send()
        .await
        .expect("the copy ends with the replay");
    let elapsed = started.elapsed();
    let original = original
        .await
        .expect("the task")
        .expect("the original charge");

    assert!(!original.replayed());
    assert_eq!(replay.status().as_u16(), 200, "{}", replay.text());
    assert!(
        replay.replayed(),
        "the copy's answer is the original's, replayed"
    );
    assert_eq!(charge_id(&replay), charge_id(&original));
    assert!(replay.attempts() >= 2, "the first answer was the 409");
    let waited = Duration::from_millis(950) * (replay.attempts() - 1);
    assert!(
        elapsed >= waited,
        "{} attempts in {elapsed:?}: each retry waited for Retry-After (1 s)",
        replay.attempts()
    );
    assert_eq!(charge_count(&server).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_killed_mid_charge_and_restarted_on_its_port_charges_once() {
    let mut world = World::new();
    let mut server = world.start(0, 2000).await;
    let port = port(&server);
    let url = server.url("/v1/charges");
    let client = client(
        RetryPolicy::default()
            .attempt_timeout(Duration::from_secs(1))
            .deadline(Duration::from_secs(60))
            .max_attempts(200)
            .backoff(quick_backoff()),
    );
    let key = IdempotencyKey::random().expect("a key");
    let operation = {
        let (client, key) = (client.clone(), key.clone());
        tokio::spawn(async move {
            client
                .operation(charge(&client, &url, 5000, 2500))
                .key(key)
                .send()
                .await
        })
    };
    // The first attempt is inside its transaction (the charge row written, not committed).
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(charge_count(&server).await, 0, "nothing committed yet");
    server.kill().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let restarted = world.start(port, 2000).await;

    let response = operation
        .await
        .expect("the task")
        .expect("the retries end with the charge");
    assert_eq!(response.status().as_u16(), 200, "{}", response.text());
    assert!(response.attempts() >= 2);
    assert_eq!(response.key(), Some(&key));
    assert_eq!(
        charge_count(&restarted).await,
        1,
        "the killed attempt rolled back"
    );
    let listed = listed_charges(&restarted).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0]["id"].as_str(),
        Some(charge_id(&response).as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_killed_after_the_charge_committed_replays_it_after_its_restart() {
    let mut world = World::new();
    let mut server = world.start(0, 60_000).await;
    let port = port(&server);
    // The first attempt's answer is lost on the way back: the server committed, the client
    // times out.
    let proxy = Proxy::start(server.addr(), 1).await;
    let client = client(
        RetryPolicy::default()
            .attempt_timeout(Duration::from_millis(1500))
            .deadline(Duration::from_secs(60))
            .max_attempts(200)
            .backoff(quick_backoff()),
    );
    let operation = {
        let client = client.clone();
        let url = proxy.url("/v1/charges");
        tokio::spawn(async move { client.send(charge(&client, &url, 1234, 0)).await })
    };
    let committed = e2e_support::poll(
        250,
        Duration::from_millis(20),
        || charge_count(&server),
        |count| *count == 1,
    )
    .await;
    assert_eq!(committed, 1, "the first attempt committed its charge");
    server.kill().await;
    let restarted = world.start(port, 60_000).await;

    let response = operation
        .await
        .expect("the task")
        .expect("the retries end with the charge");
    assert_eq!(response.status().as_u16(), 200, "{}", response.text());
    assert!(
        response.replayed(),
        "the retry after the restart got the stored answer"
    );
    assert!(response.attempts() >= 2);
    let key = response.key().expect("a key").as_str().to_owned();
    let keys = proxy.post_keys();
    assert!(
        keys.iter().all(|k| k.as_deref() == Some(key.as_str())),
        "{keys:?}"
    );
    assert_eq!(charge_count(&restarted).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_get_is_sent_without_a_key_and_a_post_with_a_fresh_one_per_operation() {
    let mut world = World::new();
    let server = world.start(0, 60_000).await;
    let proxy = Proxy::start(server.addr(), 0).await;
    let client = client(RetryPolicy::default());
    let url = proxy.url("/v1/charges");
    let first = client
        .send(charge(&client, &url, 1, 0))
        .await
        .expect("charge 1");
    let second = client
        .send(charge(&client, &url, 1, 0))
        .await
        .expect("charge 2");
    let listed = client
        .send(client.get(&url).bearer_auth(API_KEY))
        .await
        .expect("the list");
    assert_ne!(first.key(), second.key(), "one key per operation");
    assert_ne!(charge_id(&first), charge_id(&second));
    assert_eq!(listed.key(), None);
    let requests = proxy.requests();
    let get = requests
        .iter()
        .find(|(line, _)| line.starts_with("GET "))
        .expect("the GET went through");
    assert_eq!(get.1, None, "no key on a GET");
    assert_eq!(charge_count(&server).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_server_is_not_executed_and_keeps_the_key() {
    let mut world = World::new();
    let mut server = world.start(0, 60_000).await;
    let url = server.url("/v1/charges");
    server.kill().await;
    let client = client(
        RetryPolicy::default()
            .max_attempts(3)
            .backoff(quick_backoff()),
    );
    let error = client
        .send(charge(&client, &url, 1, 0))
        .await
        .expect_err("nobody listens");
    assert!(matches!(error, Error::Transport(_)), "{error:?}");
    assert_eq!(error.attempts(), 3);
    assert_eq!(error.stop(), Some(Stop::Attempts));
    assert_eq!(error.outcome(), Outcome::NotExecuted, "{error}");
    assert!(error.key().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c01_keys_with_quotes_padding_or_commas_each_charge_once_and_stay_distinct() {
    let mut world = World::new();
    let server = world.start(0, 60_000).await;
    let proxy = Proxy::start(server.addr(), 0).await;
    let client = client(RetryPolicy::default().backoff(quick_backoff()));
    let url = proxy.url("/v1/charges");
    // `"k"` (quotes included) and `k` are two keys; base64 padding and commas are not token
    // characters, so these keys travel as sf-strings. The same body every time: two keys
    // read as one would replay the first charge.
    let keys = ["k", "\"k\"", "q83vEg==", "a,b", "k=v", "back\\slash"];
    let mut ids = Vec::new();
    for key in keys {
        let response = client
            .operation(charge(&client, &url, 700, 0))
            .key(IdempotencyKey::new(key).expect("a key"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(
            response.status().as_u16(),
            200,
            "{key}: {}",
            response.text()
        );
        assert!(!response.replayed(), "{key} was read as an earlier key");
        ids.push(charge_id(&response));
    }
    let distinct: std::collections::HashSet<&String> = ids.iter().collect();
    assert_eq!(distinct.len(), keys.len(), "{ids:?}");
    // Each key again: its own charge, replayed.
    for (key, id) in keys.iter().zip(&ids) {
        let again = client
            .operation(charge(&client, &url, 700, 0))
            .key(IdempotencyKey::new(*key).expect("a key"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert!(again.replayed(), "{key}");
        assert_eq!(&charge_id(&again), id, "{key}");
    }
    assert_eq!(charge_count(&server).await, keys.len() as u64);
    assert_eq!(proxy.post_keys().len(), 2 * keys.len());
}

#[test]
fn the_proxy_frames_requests_by_content_length_whatever_their_bodies_hold() {
    let first = "amount=1&description=Hello+World";
    let second = "amount=2";
    let bytes = format!(
        "POST /v1/charges HTTP/1.1\r\nidempotency-key: k1\r\ncontent-length: {}\r\n\r\n{first}\
         POST /v1/charges HTTP/1.1\r\nIdempotency-Key: \"k,2\"\r\ncontent-length: {}\r\n\r\n{second}\
         GET /v1/charges HTTP/1.1\r\n\r\n",
        first.len(),
        second.len()
    );
    let parsed = client_support::proxy::parse_requests(bytes.as_bytes());
    assert_eq!(
        parsed,
        [
            (
                "POST /v1/charges HTTP/1.1".to_owned(),
                Some("k1".to_owned())
            ),
            (
                "POST /v1/charges HTTP/1.1".to_owned(),
                Some("\"k,2\"".to_owned())
            ),
            ("GET /v1/charges HTTP/1.1".to_owned(), None),
        ]
    );
}
