//! A Redis of this test's own, with the append-only file on: restarted between reserve and
//! complete, the lease survives and the fenced completion still lands; killed, it is an error
//! (503), never a pass-through that runs the effect unprotected (C13).

use idem_core::{
    Answer, Begin, Error, Failure, Idempotency, Policy, RunError, StoreErrorKind, StoredResponse,
};
use idem_redis::RedisStore;
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod common;

use common::temp_dir;

/// redis-server with AOF, fsync on every write.
const AOF: [&str; 4] = ["--appendonly", "yes", "--appendfsync", "always"];

/// Starts redis-server with [`AOF`] again on `port`.
fn restart(port: u16, dir: &std::path::Path) -> Child {
    common::start_server(port, dir, &AOF)
}

#[tokio::test]
async fn c09_a_restart_with_aof_keeps_the_lease_and_the_completion_lands() {
    let dir = temp_dir();
    let (mut server, port) = common::start_on_free_port(&dir, &AOF);
    let store = RedisStore::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .expect("connect");
    let idem = Idempotency::with_policy(store, Policy::default().lease(Duration::from_secs(10)))
        .expect("policy");
    let request = idem
        .request("acct", "POST", "/notifications")
        .key(Some("restart"))
        .body(b"{}")
        .build()
        .expect("request");
    let Begin::Acquired(lease) = idem.begin(&request).await.expect("begin") else {
        panic!("fresh");
    };
    server.kill().expect("SIGKILL");
    server.wait().expect("wait");
    let mut server = restart(port, &dir);
    // In flight after the restart: the reservation was in the append-only file.
    let answer = loop {
        match idem.begin(&request).await {
            Ok(answer) => break answer,
            Err(error) => {
                assert!(error.is_retryable(), "{error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert!(
        matches!(answer, Begin::Answered(Answer::InFlight { .. })),
        "{answer:?}"
    );
    let sent = idem
        .complete(lease, StoredResponse::new(202, "sent"))
        .await
        .expect("the fenced completion lands after the restart");
    assert_eq!(
        idem.begin(&request).await.expect("begin"),
        Begin::Answered(Answer::Replay(sent))
    );
    server.kill().expect("kill");
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn c13_a_killed_server_is_an_error_and_the_effect_never_runs() {
    let dir = temp_dir();
    let (mut server, port) = common::start_on_free_port(&dir, &AOF);
    let store = RedisStore::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .expect("connect");
    let idem = Idempotency::new(store);
    server.kill().expect("SIGKILL");
    server.wait().expect("wait");
    let ran = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&ran);
    let request = idem
        .request("acct", "POST", "/notifications")
        .key(Some("down"))
        .body(b"{}")
        .build()
        .expect("request");
    let result = idem
        .run(&request, move |_| async move {
            r.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failure<Error>>(StoredResponse::new(202, "sent"))
        })
        .await;
    let Err(RunError::Idem(error)) = result else {
        panic!("expected a store error, got {result:?}");
    };
    assert!(matches!(error, Error::Store(_)), "{error}");
    assert_eq!(
        error.as_store().map(|e| e.kind()),
        Some(StoreErrorKind::Unavailable)
    );
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "the effect ran without protection"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
