//! A master configured to refuse writes while its replicas lag (`min-replicas-to-write`, the
//! setting Redis recommends to bound what a failover loses) answers `NOREPLICAS` for as long
//! as its replica is away: a failover under way, a replica restarting. That is a store that
//! cannot take writes for now, not a refusal for good: a completion must keep trying until it
//! lands or the lease is taken (C8), never leave the key to a takeover that runs the effect
//! again once the replica is back.

mod common;
mod support;

use idem_core::{Failure, Idempotency, Outcome, Policy, RunError, StoredResponse};
use idem_redis::RedisStore;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::redis_cli::{cli, try_cli, wait_for};

fn signal(pid: u32, name: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -{name} {pid}");
}

#[test]
fn c08_a_completion_refused_while_replicas_lag_keeps_trying_and_runs_once() {
    let dir = common::temp_dir();
    for node in ["m", "r"] {
        std::fs::create_dir_all(dir.join(node)).expect("a directory");
    }
    let (master, m) = common::start_on_free_port(
        &dir.join("m"),
        &[
            "--min-replicas-to-write",
            "1",
            "--min-replicas-max-lag",
            "1",
        ],
    );
    let _master = common::Server(master, dir.join("m"));
    let (replica, r) = common::start_on_free_port(&dir.join("r"), &[]);
    let replica_pid = replica.id();
    let _replica = common::Server(replica, dir.join("r"));
    assert_eq!(cli(r, &["replicaof", "127.0.0.1", &m.to_string()]), "OK");
    let writable = || try_cli(m, &["set", "probe", "1"]).is_ok_and(|out| out == "OK");
    wait_for(
        Duration::from_secs(10),
        "the master to take writes",
        writable,
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let lease = Duration::from_secs(4);
    let (first, effects, idem, request) = runtime.block_on(async {
        let store = RedisStore::connect(&format!("redis://127.0.0.1:{m}"))
            .await
            .expect("connect");
        let policy = Policy::default()
            .lease(lease)
            .store_timeout(Duration::from_secs(2));
        let idem = Idempotency::with_policy(store, policy).expect("policy");
        let request = idem
            .request("acct", "POST", "/v1/notifications")
            .key(Some("k-lag"))
            .body(b"{}")
            .build()
            .expect("request");
        let effects = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&effects);
        // The replica stops while the effect runs (a failover or a restart under way): the
        // master refuses writes from about a second later until it is back.
        let first = idem
            .run(&request, move |_| async move {
                counted.fetch_add(1, Ordering::SeqCst);
                signal(replica_pid, "STOP");
                let refused = Instant::now();
                while refused.elapsed() < Duration::from_secs(5) {
                    let out = try_cli(m, &["set", "probe", "2"]).unwrap_or_default();
                    if out.contains("NOREPLICAS") {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "sent"))
            })
            .await;
        (first, effects, idem, request)
    });
    let first_error = match &first {
        Ok(outcome) => format!("{outcome:?}"),
        Err(error) => error.to_string(),
    };
    println!("the first call: {first_error}");
    // The replica is back well within the lease: the master takes writes again.
    signal(replica_pid, "CONT");
    wait_for(
        Duration::from_secs(10),
        "the master to take writes again",
        writable,
    );
    let again = runtime.block_on(async {
        // Past the lease, a retry of the same key.
        tokio::time::sleep(lease + Duration::from_millis(500)).await;
        let counted = Arc::clone(&effects);
        idem.run(&request, move |_| async move {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "sent again"))
        })
        .await
    });
    println!("the retry: {again:?}");
    assert!(
        !matches!(first, Err(RunError::Incomplete(ref e)) if !e.is_retryable()),
        "the completion was given up as refused for good: {first_error}"
    );
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "the effect ran again: the completion was never retried once the replica was back"
    );
    assert!(matches!(again, Ok(Outcome::Answered(_))), "{again:?}");
}
