//! The replay cache (C10) on a master demoted by hand: `REPLICAOF` with no Sentinel keeps the
//! clients' connections, and the demoted master goes on serving reads after a resync that
//! dropped its last record. No call fails, so only the server's identity (its role and
//! replication ID, asked once a second while the cache is used) tells the store that its data
//! set changed; without it, reads of other keys kept the cache confirmed and one process went on
//! replaying a charge the store had lost while another executed the key again.

mod common;
mod support;

use idem_core::{Failure, Idempotency, ReplayCache, StoredResponse};
use idem_redis::RedisStore;
use std::convert::Infallible;
use std::time::{Duration, Instant};
use support::redis_cli::{cli, wait_for};

/// Runs `key` on `idem` with an effect answering `body`: what the caller is told.
async fn run(idem: &Idempotency<RedisStore>, key: &str, body: &str) -> String {
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some(key))
        .body(b"{}")
        .build()
        .expect("request");
    let body = body.to_owned();
    let effect = |_| async move { Ok::<_, Failure<Infallible>>(StoredResponse::new(201, body)) };
    match idem.run(&request, effect).await {
        Ok(outcome) => outcome
            .response()
            .map(|r| String::from_utf8_lossy(&r.body).into_owned())
            .unwrap_or_default(),
        Err(error) => format!("error: {error}"),
    }
}

#[test]
fn c10_a_master_demoted_by_hand_empties_the_replay_cache() {
    let dir = common::temp_dir();
    for node in ["m", "r"] {
        std::fs::create_dir_all(dir.join(node)).expect("a directory");
    }
    let (mut master, m) = common::start_on_free_port(&dir.join("m"), &[]);
    let (mut replica, r) = common::start_on_free_port(&dir.join("r"), &[]);
    assert_eq!(cli(r, &["replicaof", "127.0.0.1", &m.to_string()]), "OK");
    let linked = || cli(r, &["info", "replication"]).contains("master_link_status:up");
    wait_for(Duration::from_secs(10), "the replica's link", linked);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let late = runtime.block_on(async {
        let store = RedisStore::connect(&format!("redis://127.0.0.1:{m}"))
            .await
            .expect("store on the master");
        let a = Idempotency::builder(store)
            .replay_cache(ReplayCache::new(1000, 1 << 20))
            .build()
            .expect("engine");
        assert_eq!(run(&a, "warm", "warm").await, "warm");
        // The replica is promoted before K is written: K exists on the old master only.
        assert_eq!(cli(r, &["replicaof", "no", "one"]), "OK");
        assert_eq!(run(&a, "K", "first").await, "first");
        assert_eq!(run(&a, "K", "again").await, "first", "replayed");
        // The old master is demoted under the new one and resyncs: K is gone there.
        assert_eq!(cli(m, &["replicaof", "127.0.0.1", &r.to_string()]), "OK");
        let resynced = || cli(m, &["info", "replication"]).contains("master_link_status:up");
        wait_for(Duration::from_secs(10), "the resync", resynced);
        let demoted = Instant::now();
        let b = Idempotency::new(
            RedisStore::connect(&format!("redis://127.0.0.1:{r}"))
                .await
                .expect("store on the new master"),
        );
        assert_eq!(run(&b, "K", "second").await, "second", "K is new there");
        // Replays of another key keep answering from the store, as live traffic does.
        let mut late = Vec::new();
        while demoted.elapsed() < Duration::from_secs(5) {
            run(&a, "warm", "warm").await;
            let k = run(&a, "K", "late").await;
            if k == "first" {
                late.push(demoted.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        late
    });
    let _ = (master.kill(), replica.kill());
    let _ = (master.wait(), replica.wait());
    // The store asks once a second: within two, the cache answers no more.
    assert!(
        late.iter().all(|at| *at < Duration::from_secs(2)),
        "the cache replayed a record the server lost, {late:?} after the demotion"
    );
}
