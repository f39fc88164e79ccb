//! A Redis Cluster that loses a master, moves its slots or freezes, under 64 retrying clients,
//! on a cluster of the test's own (it kills and reshards nodes). The same long-lived
//! `RedisStore` is used throughout: while the fault lasts every call is answered or is a 503
//! within its deadline (C13), once the fault ends the store answers again by itself within
//! twice the deadline (its cluster connection is rebuilt from the seed nodes when it keeps
//! failing), and no key's effect runs twice: the nodes keep an append-only file synced on
//! every write, so no acknowledged record is lost, and C14's re-run (a Redis that lost a
//! record) cannot happen; any second effect is a failure.

mod support;

use std::time::{Duration, Instant};
use support::load::Seen;
use support::private_cluster::PrivateCluster;
use support::under_load::{engine, one_at_a_time, runtime, store_settings, through};

/// Runs `fault` on a private cluster under load (see `support::under_load`).
fn under_load(
    name: &str,
    fault: impl FnOnce(&mut PrivateCluster) -> Instant + Send + 'static,
) -> Seen {
    let _one = one_at_a_time();
    let mut cluster = PrivateCluster::start();
    runtime().block_on(async move {
        let urls = cluster.urls();
        let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
        let store = store_settings()
            .connect_cluster(&seeds)
            .await
            .expect("connect to the private cluster");
        let idem = engine(store);
        let (seen, _, cluster) = through(name, &idem, move || {
            let ended = fault(&mut cluster);
            (cluster, ended)
        })
        .await;
        drop(cluster);
        seen
    })
}

/// A master killed (`kill -9`) for eight seconds, then started again on the same port with the
/// same `nodes.conf` and append-only file, so it rejoins as the master it was.
#[test]
fn c13_a_master_killed_and_restarted_under_load_and_the_same_store_heals() {
    let seen = under_load("killed-master", |cluster| {
        cluster.kill(0);
        std::thread::sleep(Duration::from_secs(8));
        assert!(!cluster.is_ok(), "the cluster never saw its master go");
        cluster.restart(0);
        cluster.wait_ok(Duration::from_secs(20));
        Instant::now()
    });
    assert!(!seen.errors.is_empty(), "the kill was never seen by a call");
}

/// Five hundred slots of a master (about one key in thirty) moved to another master and back
/// (`redis-cli --cluster reshard`, keys migrated with their slots), twice, under load.
#[test]
fn c13_slots_resharded_away_and_back_twice_under_load_and_the_same_store_heals() {
    under_load("resharded", |cluster| {
        const MOVED: usize = 500;
        let slots = cluster.slot_count(0);
        assert!(slots > 5000, "node 0 serves {slots} slots");
        for _ in 0..2 {
            cluster.reshard(0, 1, MOVED);
            assert_eq!(
                cluster.slot_count(0),
                slots - MOVED,
                "the slots never moved"
            );
            cluster.reshard(1, 0, MOVED);
            assert_eq!(cluster.slot_count(0), slots, "the slots never came back");
        }
        Instant::now()
    });
}

/// `DEBUG SLEEP` on a master, three times the deadline: calls are 503s within the deadline,
/// and the store answers again once the master woke and the cluster says `cluster_state:ok`
/// again (the other masters marked it failed meanwhile, and clear that only once it has been
/// reachable for twice the node timeout).
#[test]
fn c13_a_master_frozen_past_the_deadline_under_load_and_the_same_store_heals() {
    let seen = under_load("frozen-master", |cluster| {
        cluster.freeze(0, 3.0).join().expect("DEBUG SLEEP");
        cluster.wait_ok(Duration::from_secs(20));
        Instant::now()
    });
    assert!(
        !seen.errors.is_empty(),
        "the freeze was never seen by a call"
    );
}
