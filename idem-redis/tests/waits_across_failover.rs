//! C5's bounded wait across failovers: duplicates in one engine wait for originals running in
//! another (each its own store); a failover happens meanwhile. Every duplicate whose original
//! completed well before its wait ended must get the replay, not "in flight".

mod support;

use idem_core::{Answer, Failure, FencingToken, Idempotency, Outcome, Policy, StoredResponse};
use idem_redis::RedisStore;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::private_sentinel::{PrivateSentinel, MASTER_NAME};
use support::replicated_cluster::ReplicatedCluster;
use support::under_load::{one_at_a_time, runtime};

const WAIT: Duration = Duration::from_secs(4);
const EFFECT: Duration = Duration::from_millis(800);

#[derive(Default, Debug)]
struct Seen {
    /// (key, when the original's completion was answered, when the waiter ended, outcome)
    pairs: Vec<(String, Option<Instant>, Instant, String)>,
}

async fn pairs(
    original: Idempotency<RedisStore>,
    waiter: Idempotency<RedisStore>,
    n: usize,
) -> Seen {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut tasks = Vec::new();
    for i in 0..n {
        let (o, w, seen) = (original.clone(), waiter.clone(), Arc::clone(&seen));
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20 * i as u64)).await;
            let key = format!("k{i}");
            let build = |idem: &Idempotency<RedisStore>| {
                idem.request("acct", "POST", "/v1/notifications")
                    .key(Some(&key))
                    .body(b"{}")
                    .build()
                    .expect("request")
            };
            let (ro, rw) = (build(&o), build(&w));
            let orig = tokio::spawn(async move {
                let out = o
                    .run(&ro, |_| async {
                        tokio::time::sleep(EFFECT).await;
                        Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "sent"))
                    })
                    .await;
                (Instant::now(), out.map_err(|e| e.to_string()))
            });
            tokio::time::sleep(Duration::from_millis(150)).await;
            let waited = w
                .run(&rw, |_| async {
                    Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "ran in the waiter"))
                })
                .await;
            let ended = Instant::now();
            let (done_at, out) = orig.await.expect("joined");
            let done = matches!(out, Ok(Outcome::Executed(_))).then_some(done_at);
            let what = match waited {
                Ok(Outcome::Answered(Answer::Replay(r))) => {
                    format!("replay {}", String::from_utf8_lossy(&r.body))
                }
                Ok(Outcome::Answered(Answer::InFlight { .. })) => "in flight".to_owned(),
                Ok(other) => format!("{other:?}").chars().take(60).collect(),
                Err(e) => format!("error {e}").chars().take(90).collect(),
            };
            seen.lock()
                .expect("the pairs")
                .pairs
                .push((key, done, ended, what));
        }));
    }
    for t in tasks {
        t.await.expect("joined");
    }
    Arc::try_unwrap(seen)
        .expect("every task ended")
        .into_inner()
        .expect("the pairs")
}

fn report(name: &str, seen: &Seen) {
    let mut late = Vec::new();
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    for (key, done, ended, what) in &seen.pairs {
        *kinds
            .entry(what.split(':').next().unwrap_or("").to_owned())
            .or_default() += 1;
        if let Some(done) = done {
            // The original's answer came 1.5 s or more before the waiter gave up in flight.
            if what == "in flight"
                && ended.saturating_duration_since(*done) > Duration::from_millis(1500)
            {
                late.push(format!(
                    "{key}: completed {:?} before the wait ended",
                    ended.duration_since(*done)
                ));
            }
        }
    }
    println!("{name}: {kinds:?}; late: {late:?}");
    assert!(late.is_empty(), "{name}: waiters not woken: {late:?}");
}

fn policy() -> Policy {
    Policy::default()
        .lease(Duration::from_secs(5))
        .store_timeout(Duration::from_secs(1))
        .wait_in_flight(WAIT)
}

#[test]
fn c05_waiters_across_a_sentinel_failover() {
    let _one = one_at_a_time();
    let setup = PrivateSentinel::start();
    runtime().block_on(async move {
        let urls = setup.urls();
        let sentinels: Vec<&str> = urls.iter().map(String::as_str).collect();
        let prefix = format!("t{}", FencingToken::generate());
        let mut engines = Vec::new();
        for _ in 0..2 {
            let store = RedisStore::builder()
                .prefix(&prefix)
                .response_timeout(Duration::from_millis(300))
                .connection_timeout(Duration::from_millis(300))
                .connect_sentinel(&sentinels, MASTER_NAME)
                .await
                .expect("connect");
            engines.push(Idempotency::with_policy(store, policy()).expect("policy"));
        }
        let (o, w) = (engines[0].clone(), engines[1].clone());
        let load = tokio::spawn(pairs(o, w, 150));
        tokio::time::sleep(Duration::from_millis(700)).await;
        let setup = tokio::task::spawn_blocking(move || {
            setup.fail_over();
            setup.wait_promoted(Duration::from_secs(30));
            setup
        })
        .await
        .expect("failover");
        let seen = load.await.expect("joined");
        report("sentinel", &seen);
        drop(setup);
    });
}

#[test]
fn c05_waiters_across_a_cluster_failover() {
    let _one = one_at_a_time();
    let cluster = ReplicatedCluster::start(true);
    runtime().block_on(async move {
        let urls = cluster.urls();
        let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
        let prefix = format!("t{}", FencingToken::generate());
        let mut engines = Vec::new();
        for _ in 0..2 {
            let store = RedisStore::builder()
                .prefix(&prefix)
                .response_timeout(Duration::from_millis(300))
                .connection_timeout(Duration::from_millis(300))
                .connect_cluster(&seeds)
                .await
                .expect("connect");
            engines.push(Idempotency::with_policy(store, policy()).expect("policy"));
        }
        let (o, w) = (engines[0].clone(), engines[1].clone());
        let load = tokio::spawn(pairs(o, w, 150));
        tokio::time::sleep(Duration::from_millis(700)).await;
        let cluster = tokio::task::spawn_blocking(move || {
            // The feeds subscribe on the first seed node: its master role moves away.
            let first = cluster.ports()[0];
            let replica = cluster
                .replicas()
                .into_iter()
                .find(|&r| cluster.master_of(r) == first)
                .expect("a replica of the first seed");
            cluster.failover(replica, None);
            cluster
        })
        .await
        .expect("failover");
        let seen = load.await.expect("joined");
        report("cluster", &seen);
        drop(cluster);
    });
}
