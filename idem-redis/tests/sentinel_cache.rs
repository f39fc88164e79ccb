//! Redis under Sentinel with the engines' replay caches and read-first, under a replay-heavy
//! load on several engines (each its own store): failovers of several kinds.

mod support;

use idem_core::{FencingToken, Idempotency, ReplayCache};
use idem_redis::RedisStore;
use std::time::{Duration, Instant};
use support::private_sentinel::{PrivateSentinel, MASTER_NAME};
use support::replays::{Load, Replays, Seen};
use support::under_load::{
    one_at_a_time, policy, runtime, shared_store_settings, DEADLINE, MARGIN,
};

const CLIENTS: Replays = Replays {
    tasks: 48,
    answers: 5,
    retry: Duration::from_millis(100),
    hang: Duration::from_secs(8),
    give_up: Duration::from_secs(10),
};

async fn engines(setup: &PrivateSentinel, n: usize, cache: bool) -> Vec<Idempotency<RedisStore>> {
    let urls = setup.urls();
    let sentinels: Vec<&str> = urls.iter().map(String::as_str).collect();
    let prefix = format!("t{}", FencingToken::generate());
    let mut engines = Vec::new();
    for _ in 0..n {
        let store = shared_store_settings(&prefix)
            .connect_sentinel(&sentinels, MASTER_NAME)
            .await
            .expect("connect");
        let mut builder = Idempotency::builder(store).policy(policy());
        if cache {
            builder = builder.replay_cache(ReplayCache::new(100_000, 64 << 20));
        }
        engines.push(builder.build().expect("engine"));
    }
    engines
}

/// Runs the load, the fault (returns when the new master was promoted).
fn run(
    name: &str,
    cache: bool,
    fault: impl FnOnce(&mut PrivateSentinel) -> Instant + Send + 'static,
) -> (Seen, Instant) {
    let _one = one_at_a_time();
    let setup = PrivateSentinel::start();
    let name = name.to_owned();
    runtime().block_on(async move {
        let engines = engines(&setup, 3, cache).await;
        let load = Load::start(&engines, &name, CLIENTS);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (setup, promoted) = tokio::task::spawn_blocking(move || {
            let mut setup = setup;
            let at = fault(&mut setup);
            (setup, at)
        })
        .await
        .expect("the fault");
        tokio::time::sleep(Duration::from_secs(5)).await;
        let seen = load.stop(&engines).await;
        println!("{name}: {}", seen.summary(promoted));
        for (key, at, bodies) in seen.flips.iter().take(10) {
            let when = if *at >= promoted {
                format!("+{:?}", at.duration_since(promoted))
            } else {
                format!("-{:?}", promoted.duration_since(*at))
            };
            println!("  flip {key} at {when} after the promotion: {bodies:?}");
        }
        drop(setup);
        (seen, promoted)
    })
}

fn report(name: &str, seen: &Seen, promoted: Instant) {
    let summary = seen.summary(promoted);
    assert!(seen.foreign.is_empty(), "{name}: {:?}", seen.foreign);
    assert_eq!(seen.hangs, 0, "{name}: {summary}");
    assert!(
        seen.slowest_refusal <= DEADLINE + MARGIN,
        "{name}: a 503 took {:?}: {summary}",
        seen.slowest_refusal
    );
    let late: Vec<_> = seen
        .flips
        .iter()
        .filter(|(_, at, _)| *at > promoted + 2 * DEADLINE)
        .collect();
    assert!(late.is_empty(), "{name}: old answers long after: {late:?}");
}

#[test]
fn sentinel_failover_with_cache() {
    let (seen, promoted) = run("failover+cache", true, |setup| {
        setup.fail_over();
        setup.wait_promoted(Duration::from_secs(30))
    });
    report("failover+cache", &seen, promoted);
}

#[test]
fn sentinel_frozen_master_with_cache() {
    let (seen, promoted) = run("frozen+cache", true, |setup| {
        let sleeper = setup.freeze_master(5.0);
        let promoted = setup.wait_promoted(Duration::from_secs(30));
        sleeper.join().expect("DEBUG SLEEP");
        promoted
    });
    report("frozen+cache", &seen, promoted);
}

#[test]
fn sentinel_frozen_master_without_cache() {
    let (seen, promoted) = run("frozen", false, |setup| {
        let sleeper = setup.freeze_master(5.0);
        let promoted = setup.wait_promoted(Duration::from_secs(30));
        sleeper.join().expect("DEBUG SLEEP");
        promoted
    });
    report("frozen", &seen, promoted);
}

#[test]
fn sentinel_killed_master_with_cache() {
    let (seen, promoted) = run("killed+cache", true, |setup| {
        setup.kill_master();
        setup.wait_promoted(Duration::from_secs(30))
    });
    report("killed+cache", &seen, promoted);
}
