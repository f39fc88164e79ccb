//! Redis Cluster failovers (a replica per master) under a replay-heavy load on several
//! engines: `CLUSTER FAILOVER` (graceful, FORCE, TAKEOVER), a master killed.

mod support;

use idem_core::{FencingToken, Idempotency};
use idem_redis::RedisStore;
use std::time::{Duration, Instant};
use support::replays::{Load, Replays, Seen};
use support::replicated_cluster::ReplicatedCluster;
use support::under_load::{
    engine, one_at_a_time, runtime, shared_store_settings, DEADLINE, MARGIN,
};

const CLIENTS: Replays = Replays {
    tasks: 48,
    answers: 4,
    retry: Duration::from_millis(100),
    hang: Duration::from_secs(8),
    give_up: Duration::from_secs(10),
};

async fn engines(cluster: &ReplicatedCluster, n: usize) -> Vec<Idempotency<RedisStore>> {
    let urls = cluster.urls();
    let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
    let prefix = format!("t{}", FencingToken::generate());
    let mut engines = Vec::new();
    for _ in 0..n {
        let store = shared_store_settings(&prefix)
            .connect_cluster(&seeds)
            .await
            .expect("connect");
        engines.push(engine(store));
    }
    engines
}

fn run(
    name: &str,
    aof_always: bool,
    fault: impl FnOnce(&mut ReplicatedCluster) -> Instant + Send + 'static,
) -> (Seen, Instant) {
    let _one = one_at_a_time();
    let cluster = ReplicatedCluster::start(aof_always);
    let name = name.to_owned();
    runtime().block_on(async move {
        let engines = engines(&cluster, 3).await;
        let load = Load::start(&engines, &name, CLIENTS);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (cluster, ended) = tokio::task::spawn_blocking(move || {
            let mut cluster = cluster;
            let ended = fault(&mut cluster);
            (cluster, ended)
        })
        .await
        .expect("the fault");
        tokio::time::sleep(Duration::from_secs(4)).await;
        let seen = load.stop(&engines).await;
        println!("{name}: {}", seen.summary(ended));
        drop(cluster);
        (seen, ended)
    })
}

fn check(name: &str, seen: &Seen, ended: Instant, no_loss: bool) {
    let summary = seen.summary(ended);
    assert!(seen.foreign.is_empty(), "{name}: {:?}", seen.foreign);
    assert!(
        seen.inconsistent.is_empty(),
        "{name}: {:?}",
        seen.inconsistent
    );
    assert_eq!(seen.hangs, 0, "{name}: {summary}");
    assert!(
        seen.slowest_refusal <= DEADLINE + MARGIN,
        "{name}: a 503 took {:?}: {summary}",
        seen.slowest_refusal
    );
    assert!(seen.unanswered.is_empty(), "{name}: {:?}", seen.unanswered);
    if no_loss {
        assert!(
            seen.duplicates().is_empty(),
            "{name}: ran twice: {:?}: {summary}",
            seen.duplicates()
        );
    }
    assert!(
        seen.recovery_after(ended) <= 2 * DEADLINE,
        "{name}: errors {:?} after the failover: {summary}",
        seen.recovery_after(ended)
    );
}

/// Graceful `CLUSTER FAILOVER` on each replica in turn: the master pauses its clients until
/// the replica caught up, nothing acknowledged is lost; no key may run twice.
#[test]
fn c13_graceful_cluster_failover_under_replays() {
    let (seen, ended) = run("graceful", true, |cluster| {
        for replica in cluster.replicas() {
            cluster.failover(replica, None);
            std::thread::sleep(Duration::from_millis(1500));
        }
        cluster.wait_ok(Duration::from_secs(20));
        Instant::now()
    });
    check("graceful", &seen, ended, true);
}

#[test]
fn c13_forced_cluster_failover_under_replays() {
    let (seen, ended) = run("force", true, |cluster| {
        for replica in cluster.replicas() {
            cluster.failover(replica, Some("force"));
            std::thread::sleep(Duration::from_millis(1500));
        }
        cluster.wait_ok(Duration::from_secs(20));
        Instant::now()
    });
    check("force", &seen, ended, false);
}

#[test]
fn c13_takeover_cluster_failover_under_replays() {
    let (seen, ended) = run("takeover", true, |cluster| {
        for replica in cluster.replicas() {
            cluster.failover(replica, Some("takeover"));
            std::thread::sleep(Duration::from_millis(1500));
        }
        cluster.wait_ok(Duration::from_secs(20));
        Instant::now()
    });
    check("takeover", &seen, ended, false);
}

/// A master killed: its replica is promoted by the cluster (node timeout 1 s).
#[test]
fn c13_cluster_master_killed_replica_promoted_under_replays() {
    let (seen, ended) = run("killed", true, |cluster| {
        let replica = cluster.replicas()[0];
        let master = cluster.master_of(replica);
        cluster.kill_port(master);
        support::redis_cli::wait_for(Duration::from_secs(20), "promotion", || {
            cluster.role(replica) == "master"
        });
        cluster.wait_ok(Duration::from_secs(20));
        Instant::now()
    });
    check("killed", &seen, ended, false);
}

/// A master frozen (`DEBUG SLEEP`) past the node timeout: its replica is promoted while it
/// sleeps; it wakes up a master with its clients' queued commands, then learns it was replaced.
#[test]
fn c13_cluster_master_frozen_replica_promoted_under_replays() {
    let (seen, ended) = run("frozen", true, |cluster| {
        let replica = cluster.replicas()[0];
        let master = cluster.master_of(replica);
        let sleeper = support::redis_cli::freeze_port(master, 4.0);
        support::redis_cli::wait_for(Duration::from_secs(20), "promotion", || {
            cluster.role(replica) == "master"
        });
        sleeper.join().expect("DEBUG SLEEP");
        cluster.wait_ok(Duration::from_secs(20));
        Instant::now()
    });
    check("frozen", &seen, ended, true);
}

/// Slots moved away and back while the engines read first (keys migrated ten at a time:
/// MOVED and ASK all along).
#[test]
fn c13_slots_migrated_under_replays() {
    let (seen, ended) = run("migrated", true, |cluster| {
        let masters = cluster.masters();
        for _ in 0..2 {
            cluster.reshard(masters[0], masters[1], 300);
            cluster.reshard(masters[1], masters[0], 300);
        }
        Instant::now()
    });
    check("migrated", &seen, ended, true);
}
