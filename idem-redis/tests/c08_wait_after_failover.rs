//! `wait_for_replica` on a Redis Cluster whose master is replaced while a completion waits for
//! its replica (`WAIT`): the completion landed on the old master only, the replica promoted
//! lacks it. The `WAIT` fails (`UNBLOCKED` when the master is demoted under it, `ERR WAIT
//! cannot be used with replica instances` when sent to it demoted): the store's own rustdoc
//! says the engine then retries the completion, which lands on the new master. It must never
//! turn into a stored 500 in place of the handler's answer (C6, C7, C8).

mod support;

use idem_core::{Begin, FencingToken, Idempotency, Policy, StoredResponse};
use idem_redis::RedisStore;
use std::time::Duration;
use support::redis_cli::{cli, wait_for};
use support::replicated_cluster::ReplicatedCluster;
use support::under_load::{one_at_a_time, runtime};

#[test]
fn c08_a_wait_failed_by_a_failover_retries_the_completion_never_a_stored_500() {
    // The engine's own events (a completion refused) beside the store's warnings.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("idem=info,idem_redis=warn")
        .with_test_writer()
        .try_init();
    let _one = one_at_a_time();
    let cluster = ReplicatedCluster::start(true);
    let rt = runtime();
    let urls = cluster.urls();
    let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
    let store = rt
        .block_on(
            RedisStore::builder()
                .prefix(&format!("t{}", FencingToken::generate()))
                .response_timeout(Duration::from_secs(3))
                .wait_for_replica(Some(Duration::from_millis(2500)))
                .connect_cluster(&seeds),
        )
        .expect("connect");
    let policy = Policy::default()
        .lease(Duration::from_secs(30))
        .store_timeout(Duration::from_secs(10));
    let idem = Idempotency::with_policy(store, policy).expect("policy");
    let request = idem
        .request("acct", "POST", "/v1/notifications")
        .key(Some("k-wait"))
        .body(b"{}")
        .build()
        .expect("request");
    let Begin::Acquired(lease) = rt.block_on(idem.begin(&request)).expect("begin") else {
        panic!("a fresh key");
    };
    let key = idem.store().key_of(request.id());
    // The master holding the record, and its replica.
    let master = cluster
        .ports()
        .into_iter()
        .find(|&p| cli(p, &["exists", &key]) == "1")
        .expect("the record's master");
    let replica = cluster
        .replicas()
        .into_iter()
        .find(|&r| cluster.master_of(r) == master)
        .expect("its replica");
    // The replica has the reservation, then stops replicating (a link that cannot
    // authenticate stays down): it will miss the completion.
    wait_for(
        Duration::from_secs(5),
        "the reservation on the replica",
        || {
            let info = |p| cli(p, &["info", "replication"]);
            let offset = |text: String, field: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(field))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or(0)
            };
            offset(info(replica), "slave_repl_offset:")
                >= offset(info(master), "master_repl_offset:")
        },
    );
    assert_eq!(
        cli(replica, &["config", "set", "masterauth", "wrong"]),
        "OK"
    );
    cli(replica, &["client", "kill", "type", "master"]);
    wait_for(Duration::from_secs(5), "the replica's link down", || {
        cli(replica, &["info", "replication"]).contains("master_link_status:down")
    });
    // The completion lands on the master, whose WAIT then waits for a replica.
    let completing = {
        let idem = idem.clone();
        rt.spawn(async move {
            idem.complete(lease, StoredResponse::new(201, "charged"))
                .await
        })
    };
    wait_for(
        Duration::from_secs(5),
        "the completion on the master",
        || cli(master, &["hget", &key, "st"]) == "1",
    );
    // The replica takes over (it lacks the completion); the old master is demoted under
    // the WAIT.
    cluster.failover(replica, Some("takeover"));
    let completed = rt.block_on(completing).expect("joined");
    println!(
        "the completion answered: {:?}",
        completed
            .as_ref()
            .map(|r| (r.status, String::from_utf8_lossy(&r.body).into_owned()))
    );
    let replayed = rt.block_on(idem.begin(&request));
    if let Ok(Begin::Answered(idem_core::Answer::Replay(r))) = &replayed {
        println!(
            "a retry is answered: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
    }
    let body = |r: &StoredResponse| String::from_utf8_lossy(&r.body).into_owned();
    if let Ok(stored) = &completed {
        assert_eq!(
            body(stored),
            "charged",
            "the handler's answer was replaced by a stored 500 (status {})",
            stored.status
        );
    }
    match replayed {
        Ok(Begin::Answered(idem_core::Answer::Replay(r))) => assert_eq!(
            body(&r),
            "charged",
            "replayed a stored 500 in place of the handler's answer (status {})",
            r.status
        ),
        other => panic!("expected the replay of the handler's answer: {other:?}"),
    }
}
