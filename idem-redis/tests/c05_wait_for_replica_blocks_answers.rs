//! C5: an answer that writes nothing never waits for a writer of the store. With
//! `wait_for_replica` on, each completion sends `WAIT 1 <d>` on the store's one multiplexed
//! connection; Redis serves one connection's commands in order, so while no replica
//! acknowledges (a replica restarting, resyncing after a failover) every `WAIT` holds every
//! command queued behind it on that connection: replays, in-flight answers, reservations of
//! other keys. The docs say a completion then costs `d`; nothing says every other call waits
//! behind the completions, nor that it turns into 503s.

mod common;

use idem_core::{Answer, Failure, Idempotency, Outcome, Policy, StoredResponse};
use idem_redis::RedisStore;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn signal(pid: u32, name: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -{name} {pid}");
}

async fn run(idem: &Idempotency<RedisStore>, key: &str) -> Result<Outcome, String> {
    let request = idem
        .request("acct", "POST", "/v1/notifications")
        .key(Some(key))
        .body(b"{}")
        .build()
        .expect("request");
    idem.run(&request, |_| async {
        Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "sent"))
    })
    .await
    .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c05_replays_never_wait_behind_completions_waiting_for_a_replica() {
    let dir = common::temp_dir();
    for node in ["m", "r"] {
        std::fs::create_dir_all(dir.join(node)).expect("a directory");
    }
    let (master, m) = common::start_on_free_port(&dir.join("m"), &[]);
    let _master = common::Server(master, dir.join("m"));
    let (replica, r) = common::start_on_free_port(&dir.join("r"), &[]);
    let replica_pid = replica.id();
    let _replica = common::Server(replica, dir.join("r"));
    let linked = std::process::Command::new("redis-cli")
        .args([
            "-p",
            &r.to_string(),
            "replicaof",
            "127.0.0.1",
            &m.to_string(),
        ])
        .output()
        .expect("redis-cli");
    assert!(linked.status.success());
    tokio::time::sleep(Duration::from_secs(1)).await;

    let store = RedisStore::builder()
        .response_timeout(Duration::from_secs(3))
        .wait_for_replica(Some(Duration::from_secs(2)))
        .connect(&format!("redis://127.0.0.1:{m}"))
        .await
        .expect("connect");
    let policy = Policy::default().store_timeout(Duration::from_secs(4));
    let idem = Idempotency::with_policy(store, policy).expect("policy");
    assert!(matches!(
        run(&idem, "replayed").await,
        Ok(Outcome::Executed(_))
    ));

    // The replica goes away (a restart, a resync): completions now wait 2 s each.
    signal(replica_pid, "STOP");
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let (idem, stop) = (idem.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    let _ = run(&idem, &format!("fresh-{w}-{n}")).await;
                    n += 1;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Replays of a completed key, meanwhile: one read each.
    let mut slowest = Duration::ZERO;
    let mut failed = Vec::new();
    for _ in 0..10 {
        let asked = Instant::now();
        let answer = run(&idem, "replayed").await;
        slowest = slowest.max(asked.elapsed());
        if !matches!(answer, Ok(Outcome::Answered(Answer::Replay(_)))) {
            failed.push(answer.map(|o| format!("{o:?}")).unwrap_or_else(|e| e));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::SeqCst);
    signal(replica_pid, "CONT");
    for writer in writers {
        let _ = writer.await;
    }
    println!("replays: slowest {slowest:?}, failed {failed:?}");
    assert!(failed.is_empty(), "replays refused: {failed:?}");
    assert!(
        // Far under the 2 s a replay queued behind a WAIT takes, with room for a loaded machine.
        slowest < Duration::from_secs(1),
        "a replay waited {slowest:?} behind completions waiting for a replica"
    );
}
