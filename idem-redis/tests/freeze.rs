//! A frozen process (C5, C9, C14): a child process (this test binary, re-run in child mode)
//! runs a handler with `run` and is stopped with SIGSTOP in the middle of it; the parent,
//! another process on the same Redis, retries the same request.

mod common;

use common::redis_url;
use idem_core::{Answer, Begin, Failure, Idempotency, Policy, Request, StoredResponse};
use idem_redis::RedisStore;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LEASE: Duration = Duration::from_millis(1500);
const CHILD_ENV: &str = "IDEM_REDIS_FREEZE_CHILD";

fn request(idem: &Idempotency<RedisStore>, key: &str) -> Request {
    idem.request("acct_freeze", "POST", "/notifications")
        .key(Some(key))
        .body(b"{}")
        .build()
        .expect("request")
}

async fn engine() -> Idempotency<RedisStore> {
    let store = RedisStore::connect(&redis_url()).await.expect("connect");
    Idempotency::with_policy(store, Policy::default().lease(LEASE)).expect("policy")
}

/// The child's side: runs the handler, which prints `READY` and then works for a while (the
/// parent stops it there); prints `DONE ` and how the run ended.
#[tokio::test]
#[ignore = "child process of the freeze tests: run by them with IDEM_REDIS_FREEZE_CHILD set"]
async fn freeze_child() {
    let key = std::env::var(CHILD_ENV).expect("run by the freeze tests");
    let idem = engine().await;
    let ran = idem
        .run(&request(&idem, &key), |_ctx| async {
            println!("READY");
            tokio::time::sleep(Duration::from_millis(500)).await;
            Ok::<_, Failure<&'static str>>(StoredResponse::new(202, "child"))
        })
        .await;
    println!("DONE {ran:?}");
    tokio::time::sleep(Duration::from_secs(60)).await;
}

/// A child process, killed when dropped.
struct Frozen(Child);

impl Frozen {
    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.0.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {}", self.0.id());
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// C5, C9, C14: a holder frozen in its handler is in flight for its whole lease, however many
/// processes ask (a second execution within the lease is never allowed on Redis either); past
/// it the record is taken over (the documented re-execution of C14), and the frozen holder,
/// woken, is fenced out: every later retry gets the takeover's answer.
#[tokio::test]
async fn c05_c09_c14_a_frozen_holder_is_in_flight_for_its_lease_then_fenced() {
    let key = format!("frozen-{}", idem_core::FencingToken::generate());
    let idem = engine().await;
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--ignored",
            "--exact",
            "freeze_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &key)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    let frozen = Frozen(child);
    let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
    assert!(
        lines.any(|line| line.contains("READY")),
        "the child did not reach its freeze point"
    );
    frozen.signal("-STOP");
    let stopped = Instant::now();

    let request = request(&idem, &key);
    let (lease, in_flight) = {
        let mut in_flight = 0;
        loop {
            let asked = Instant::now();
            let begun = idem.begin(&request).await.expect("begin");
            assert!(asked.elapsed() < Duration::from_secs(1), "at once (C5)");
            match begun {
                Begin::Acquired(lease) => break (lease, in_flight),
                Begin::Answered(Answer::InFlight { .. }) => {
                    assert!(
                        stopped.elapsed() < Duration::from_secs(10),
                        "never taken over"
                    );
                    in_flight += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => panic!("nothing completed the record: {other:?}"),
            }
        }
    };
    let taken_after = stopped.elapsed();
    assert!(
        taken_after >= LEASE - Duration::from_millis(200),
        "taken over after {taken_after:?}, within the frozen holder's lease of {LEASE:?} \
         ({in_flight} in-flight answers first)"
    );
    let takeover = idem
        .complete(lease, StoredResponse::new(202, "takeover"))
        .await
        .expect("the takeover completes");

    frozen.signal("-CONT");
    let done = lines
        .find(|line| line.starts_with("DONE "))
        .expect("the child ends its run");
    assert!(
        done.contains("LeaseLost") || done.contains("lease lost"),
        "the woken holder is fenced out: {done}"
    );
    eprintln!(
        "taken over after {taken_after:?} ({in_flight} in-flight answers); the child: {done}"
    );
    drop(frozen);
    assert_eq!(
        idem.begin(&request).await.expect("replay"),
        Begin::Answered(Answer::Replay(takeover)),
        "the takeover's answer stays"
    );
}
