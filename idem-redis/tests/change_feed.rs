//! The change feed (C5, C13): a duplicate that waits for its original in another process (two
//! stores, two clients, two engines: nothing shared in memory) is woken by the original's
//! announcement (`PUBLISH`) through the waiter's subscription, within a few milliseconds of
//! the completion, far below the one-second polling fallback of a waiter whose store has a
//! feed; on a Redis Cluster too, whichever node each waiter subscribed on (a `PUBLISH` reaches
//! the subscribers of every node); and again after the subscription's connection was killed
//! by the server or vanished silently (its server side gone, the client hearing nothing), once
//! the feed noticed and subscribed again.
//!
//! Each round completes the original 1.35 s after the duplicates started waiting, away from
//! every poll of the engine's waiters: one whose store has a feed polls every second (its next
//! read would come 650 ms after the completion), one whose store has none polls at 20 ms
//! doubling up to 500 ms (its next read, at about 1.62 s, would come 270 ms after it). Both are
//! past the bound of every round, 150 ms: only a wake-up by the feed is that quick.

mod common;
mod support;

use common::{cluster_nodes, free_port, redis_url, start_server, temp_dir};
use fault_proxy::{Fault, FaultProxy};
use idem_core::{
    Answer, Failure, FencingToken, Idempotency, InFlightAnswer, Outcome, Policy, Store,
    StoredResponse,
};
use idem_redis::redis;
use idem_redis::{RedisStore, RedisStoreBuilder};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::private_cluster::PrivateCluster;
use tokio::sync::oneshot;

/// How long after the original's completion each waiter must have its replay.
const PROMPT: Duration = Duration::from_millis(150);

/// How long the waiters wait before the original completes: away from the polls of either kind
/// of waiter (see the top of this file).
const BEFORE_COMPLETING: Duration = Duration::from_millis(1350);

fn engine<S: Store + 'static>(store: S) -> Idempotency<S> {
    let policy = Policy::default().in_flight(InFlightAnswer::Wait(Duration::from_secs(5)));
    Idempotency::with_policy(store, policy).expect("a valid policy")
}

/// Settings no other test shares: a key prefix and a channel of this test's own.
fn settings(prefix: &str, channel: &str) -> RedisStoreBuilder {
    RedisStore::builder().prefix(prefix).channel(channel)
}

/// A prefix and a channel for one test.
fn names() -> (String, String) {
    let token = FencingToken::generate().to_string();
    (format!("t{token}"), format!("idem:changes:{token}"))
}

fn charge(body: &str) -> StoredResponse {
    StoredResponse::new(201, body.to_owned())
}

/// One round: `original` runs a request whose handler waits; each of `waiters` sends a
/// duplicate, which waits; the original completes. Returns how long after the completion the
/// slowest duplicate had its replay (no duplicate's handler ever run).
async fn round<S: Store + 'static>(
    waiters: &[&Idempotency<S>],
    original: &Idempotency<S>,
) -> Duration {
    let key = format!("k_{}", FencingToken::generate());
    let req = original
        .request("acct_feed", "POST", "/notifications")
        .key(Some(key.as_str()))
        .body(b"{}")
        .build()
        .expect("a request");
    let runs = Arc::new(AtomicUsize::new(0));
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let first = {
        let (idem, req, runs) = (original.clone(), req.clone(), Arc::clone(&runs));
        tokio::spawn(async move {
            let outcome = idem
                .run(&req, move |_ctx| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let _ = started_tx.send(());
                    let _ = finish_rx.await;
                    Ok::<_, Failure<std::io::Error>>(charge("sent"))
                })
                .await;
            (outcome, Instant::now())
        })
    };
    started_rx.await.expect("the original started");
    let duplicates: Vec<_> = waiters
        .iter()
        .map(|waiter| {
            let (idem, req, runs) = ((*waiter).clone(), req.clone(), Arc::clone(&runs));
            tokio::spawn(async move {
                let outcome = idem
                    .run(&req, move |_ctx| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Failure<std::io::Error>>(charge("the duplicate ran"))
                    })
                    .await;
                (outcome, Instant::now())
            })
        })
        .collect();
    tokio::time::sleep(BEFORE_COMPLETING).await;
    assert!(
        duplicates.iter().all(|d| !d.is_finished()),
        "a duplicate did not wait"
    );
    finish_tx.send(()).expect("the original waits to finish");
    let (outcome, ended) = first.await.expect("the original ran");
    assert!(
        matches!(outcome, Ok(Outcome::Executed(_))),
        "the original: {outcome:?}"
    );
    let mut slowest = Duration::ZERO;
    for duplicate in duplicates {
        let (outcome, answered) = duplicate.await.expect("a duplicate ran");
        assert_eq!(
            outcome.expect("the duplicate is answered"),
            Outcome::Answered(Answer::Replay(charge("sent")))
        );
        slowest = slowest.max(answered.saturating_duration_since(ended));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one execution");
    slowest
}

/// Runs `rounds` rounds and asserts each was prompt.
async fn prompt_rounds<S: Store + 'static>(
    waiters: &[&Idempotency<S>],
    original: &Idempotency<S>,
    rounds: usize,
    case: &str,
) {
    for i in 0..rounds {
        let after = round(waiters, original).await;
        eprintln!("{case}, round {i}: answered {after:?} after the completion");
        assert!(
            after < PROMPT,
            "{case}, round {i}: a waiter was answered {after:?} after the completion"
        );
    }
}

/// Runs `cmd` on the Redis at `url`.
async fn raw<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> T {
    let client = redis::Client::open(url).expect("a client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    cmd.query_async(&mut conn).await.expect("a command")
}

/// How many subscribers `channel` has on the Redis at `url`.
async fn subscribers(url: &str, channel: &str) -> i64 {
    let reply: Vec<redis::Value> = raw(url, redis::cmd("PUBSUB").arg("NUMSUB").arg(channel)).await;
    match reply.get(1) {
        Some(redis::Value::Int(n)) => *n,
        other => panic!("PUBSUB NUMSUB answered {other:?}"),
    }
}

/// Waits until `channel` has `count` subscribers on the Redis at `url`, at most `limit`.
async fn until_subscribers(url: &str, channel: &str, count: i64, limit: Duration) {
    let started = Instant::now();
    loop {
        let now = subscribers(url, channel).await;
        if now == count {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "{now} subscribers of {channel} after {limit:?}, not {count}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The ids of the pub/sub clients of the Redis at `url`.
async fn pubsub_clients(url: &str) -> Vec<String> {
    let list: String = raw(
        url,
        redis::cmd("CLIENT").arg("LIST").arg("TYPE").arg("pubsub"),
    )
    .await;
    list.lines()
        .filter_map(|line| {
            line.split(' ')
                .find_map(|field| field.strip_prefix("id="))
                .map(str::to_owned)
        })
        .collect()
}

/// A redis-server of this test's own, killed when dropped.
struct Private {
    child: std::process::Child,
    url: String,
}

impl Private {
    fn start() -> Self {
        let port = free_port();
        let child = start_server(port, &temp_dir(), &[]);
        Self {
            child,
            url: format!("redis://127.0.0.1:{port}"),
        }
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c05_a_duplicate_waiting_in_another_process_is_woken_by_the_announcement() {
    let (prefix, channel) = names();
    let url = redis_url();
    let connect = || settings(&prefix, &channel).connect(&url);
    let there = engine(connect().await.expect("connect"));
    let here = engine(connect().await.expect("connect"));
    prompt_rounds(&[&here], &there, 3, "one Redis").await;
    prompt_rounds(&[&there], &here, 1, "one Redis, the other way").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c05_on_a_cluster_waiters_subscribed_on_every_node_are_woken_by_the_announcement() {
    let (prefix, channel) = names();
    let nodes = cluster_nodes();
    // Each waiter's feed subscribes on the first of its seed nodes: one waiter per node, so
    // the announcement reaches most of them through the cluster's broadcast.
    let rotated = |first: usize| -> Vec<String> {
        (0..nodes.len())
            .map(|i| nodes[(first + i) % nodes.len()].clone())
            .collect()
    };
    let connect = |seeds: Vec<String>| {
        let builder = settings(&prefix, &channel);
        async move {
            let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
            builder
                .connect_cluster(&seeds)
                .await
                .expect("connect to the cluster")
        }
    };
    let original = engine(connect(rotated(0)).await);
    let mut waiters = Vec::new();
    for first in 0..nodes.len() {
        waiters.push(engine(connect(rotated(first)).await));
    }
    let waiters: Vec<&Idempotency<RedisStore>> = waiters.iter().collect();
    prompt_rounds(&waiters, &original, 3, "a Redis Cluster").await;
    for node in &nodes {
        assert_eq!(
            subscribers(node, &channel).await,
            1,
            "one waiter's feed subscribed on {node}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_subscription_killed_by_the_server_is_replaced_and_wakes_waiters_again() {
    let (prefix, channel) = names();
    let redis = Private::start();
    let connect = || settings(&prefix, &channel).connect(&redis.url);
    let there = engine(connect().await.expect("connect"));
    let here = engine(connect().await.expect("connect"));
    prompt_rounds(&[&here], &there, 1, "before the fault").await;
    let before = pubsub_clients(&redis.url).await;
    assert_eq!(before.len(), 1, "the waiter's feed: {before:?}");
    let killed: i64 = raw(
        &redis.url,
        redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("pubsub"),
    )
    .await;
    assert_eq!(killed, 1);
    // The feed subscribes again by itself (another client)...
    let started = Instant::now();
    loop {
        let now = pubsub_clients(&redis.url).await;
        if now.len() == 1 && now != before {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no new subscription 5 s after the kill: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    until_subscribers(&redis.url, &channel, 1, Duration::from_secs(5)).await;
    // ...and its waiters are woken by announcements again.
    prompt_rounds(&[&here], &there, 2, "after the kill").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_subscription_whose_server_side_vanished_is_replaced_within_its_ping_deadline() {
    let (prefix, channel) = names();
    let url = redis_url();
    let proxy = FaultProxy::start(url.trim_start_matches("redis://"))
        .await
        .expect("start the fault proxy");
    let through = format!("redis://{}", proxy.addr());
    let there = engine(
        settings(&prefix, &channel)
            .connect(&url)
            .await
            .expect("connect"),
    );
    // The waiter's store, its subscription included, goes through the proxy.
    let here = engine(
        settings(&prefix, &channel)
            .feed_ping(Duration::from_millis(200), Duration::from_millis(300))
            .response_timeout(Duration::from_millis(300))
            .connection_timeout(Duration::from_millis(300))
            .connect(&through)
            .await
            .expect("connect through the proxy"),
    );
    prompt_rounds(&[&here], &there, 1, "before the fault").await;
    // The server's side of every connection through the proxy closes; the clients hear
    // nothing.
    proxy.set(Fault::ServerGone);
    until_subscribers(&url, &channel, 0, Duration::from_secs(5)).await;
    proxy.set(Fault::PassThrough);
    let noticed = Instant::now();
    // Nothing tells the subscription: only its ping does, once the store's own connection
    // (as silent) has been replaced and can publish it.
    until_subscribers(&url, &channel, 1, Duration::from_secs(8)).await;
    eprintln!(
        "the silent subscription was replaced after {:?}",
        noticed.elapsed()
    );
    prompt_rounds(&[&here], &there, 2, "after the silent loss").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_an_announcement_lost_while_the_subscription_was_gone_still_wakes_its_waiter() {
    let (prefix, channel) = names();
    let redis = Private::start();
    let connect = || settings(&prefix, &channel).connect(&redis.url);
    let there = engine(connect().await.expect("connect"));
    let here = engine(connect().await.expect("connect"));
    // The feed runs (it starts with the first wait).
    prompt_rounds(&[&here], &there, 1, "before the fault").await;

    let req = there
        .request("acct_feed", "POST", "/notifications")
        .key(Some(format!("k_{}", FencingToken::generate()).as_str()))
        .body(b"{}")
        .build()
        .expect("a request");
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let first = {
        let (idem, req) = (there.clone(), req.clone());
        tokio::spawn(async move {
            idem.run(&req, move |_ctx| async move {
                let _ = started_tx.send(());
                let _ = finish_rx.await;
                Ok::<_, Failure<std::io::Error>>(charge("sent"))
            })
            .await
        })
    };
    started_rx.await.expect("the original started");
    let waiting_since = Instant::now();
    let second = {
        let (idem, req) = (here.clone(), req.clone());
        tokio::spawn(async move {
            let outcome = idem
                .run(&req, |_ctx| async {
                    Ok::<_, Failure<std::io::Error>>(charge("the duplicate ran"))
                })
                .await;
            (outcome, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The subscription is gone (the feed subscribes again after 100 ms)...
    let killed: i64 = raw(
        &redis.url,
        redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("pubsub"),
    )
    .await;
    assert_eq!(killed, 1);
    // ...so the announcement of this completion reaches nobody.
    finish_tx.send(()).expect("the original waits to finish");
    let outcome = first.await.expect("the original ran");
    assert!(matches!(outcome, Ok(Outcome::Executed(_))), "{outcome:?}");
    let (outcome, answered) = second.await.expect("the duplicate ran");
    assert_eq!(
        outcome.expect("the duplicate is answered"),
        Outcome::Answered(Answer::Replay(charge("sent")))
    );
    // Subscribed again, the feed woke every waiter: the duplicate read its record long before
    // its first poll (1 s).
    let after = answered.saturating_duration_since(waiting_since);
    eprintln!("answered {after:?} after it began to wait");
    assert!(
        after < Duration::from_millis(850),
        "answered {after:?} after it began to wait: by polling, not by the feed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_on_a_cluster_a_failed_subscription_moves_to_the_next_seed_node() {
    let (prefix, channel) = names();
    // A cluster of this test's own: its pub/sub clients are the feed's alone.
    let mut cluster = PrivateCluster::start();
    let urls = cluster.urls();
    let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
    let connect = || settings(&prefix, &channel).connect_cluster(&seeds);
    let there = engine(connect().await.expect("connect to the cluster"));
    let here = engine(connect().await.expect("connect to the cluster"));
    prompt_rounds(&[&here], &there, 1, "on the first seed node").await;
    assert_eq!(
        subscribers(&urls[0], &channel).await,
        1,
        "the first seed node"
    );
    // The node drops the subscription: the feed subscribes on the next seed node...
    let killed: i64 = raw(
        &urls[0],
        redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("pubsub"),
    )
    .await;
    assert_eq!(killed, 1);
    until_subscribers(&urls[1], &channel, 1, Duration::from_secs(5)).await;
    // ...where the announcements, published wherever the cluster routes them, reach it.
    prompt_rounds(&[&here], &there, 2, "on the second seed node").await;
    // A node that dies takes the subscription with it: the feed moves on again.
    cluster.kill(1);
    until_subscribers(&urls[2], &channel, 1, Duration::from_secs(10)).await;
}
