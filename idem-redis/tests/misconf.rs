//! A Redis that cannot persist (an RDB save failed, `stop-writes-on-bgsave-error`: a full or
//! unwritable disk) refuses writes with `MISCONF` until a save succeeds again: a store that is
//! down for a moment (C13), as PostgreSQL's disk full is, never a refusal for good. A
//! completion refused `MISCONF` right after the effect ran is retried within the lease and
//! lands as the handler's answer (C8): never replaced by a stored 500, never given up so that
//! a retry after the lease runs the effect again. Each on a redis-server of its own.

mod common;

use common::{start_on_free_port, temp_dir, Server};
use idem_core::{Answer, Begin, Failure, Idempotency, Outcome, Policy, StoredResponse};
use idem_redis::redis;
use idem_redis::RedisStore;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long writes are refused once they are.
const REFUSED_FOR: Duration = Duration::from_millis(1200);

/// A redis-server that saves (so a failed save stops writes) and lets its directory be moved.
fn saving() -> (Server, String) {
    let dir = temp_dir();
    let (child, port) = start_on_free_port(
        &dir,
        &["--save", "3600 1", "--enable-protected-configs", "yes"],
    );
    (Server(child, dir), format!("redis://127.0.0.1:{port}"))
}

async fn admin(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

/// Makes a save fail (its directory where no file can be created), waits until writes are
/// refused `MISCONF`, and lets a save succeed again (its own directory back) after
/// [`REFUSED_FOR`].
async fn refuse_writes(url: &str, dir: PathBuf) {
    let mut conn = admin(url).await;
    let set_dir = |to: PathBuf| {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("SET").arg("dir").arg(to.to_str().expect("a path"));
        cmd
    };
    let () = set_dir(PathBuf::from("/proc"))
        .query_async(&mut conn)
        .await
        .expect("config set dir");
    let _: String = redis::cmd("BGSAVE")
        .query_async(&mut conn)
        .await
        .expect("bgsave");
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let written: redis::RedisResult<()> = redis::cmd("SET")
            .arg("probe")
            .arg("1")
            .query_async(&mut conn)
            .await;
        if matches!(&written, Err(e) if e.code() == Some("MISCONF")) {
            break;
        }
    }
    tokio::spawn(async move {
        tokio::time::sleep(REFUSED_FOR).await;
        let () = set_dir(dir)
            .query_async(&mut conn)
            .await
            .expect("config set dir");
        let _: String = redis::cmd("BGSAVE")
            .query_async(&mut conn)
            .await
            .expect("bgsave");
    });
}

fn engine(store: RedisStore, lease: Duration) -> Idempotency<RedisStore> {
    Idempotency::with_policy(store, Policy::default().lease(lease)).expect("policy")
}

async fn store(url: &str) -> RedisStore {
    RedisStore::builder()
        .response_timeout(Duration::from_millis(500))
        .connect(url)
        .await
        .expect("connect")
}

#[tokio::test]
async fn c08_a_completion_refused_misconf_is_retried_and_stores_the_handlers_answer() {
    let (server, url) = saving();
    let idem = engine(store(&url).await, Duration::from_secs(10));
    let req = idem
        .request("acct", "POST", "/v1/charges")
        .key(Some("misconf-closure"))
        .body(b"{}")
        .build()
        .expect("request");
    let effects = Arc::new(AtomicUsize::new(0));
    let (e, u, dir) = (Arc::clone(&effects), url.clone(), server.1.clone());
    let first = idem
        .run(&req, move |_| async move {
            e.fetch_add(1, Ordering::SeqCst);
            refuse_writes(&u, dir).await;
            Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged"))
        })
        .await;
    eprintln!("first: {first:?}");
    tokio::time::sleep(REFUSED_FOR + Duration::from_millis(500)).await;
    let second = idem
        .run(&req, |_| async {
            Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged again"))
        })
        .await;
    eprintln!("second: {second:?}");
    assert_eq!(effects.load(Ordering::SeqCst), 1, "the effect ran once");
    assert!(
        matches!(&first, Ok(Outcome::Executed(r)) if r.status == 201),
        "writes refused for {REFUSED_FOR:?}, within the store budget: the completion is \
         retried and the handler's answer sent: {first:?}"
    );
    assert!(
        matches!(&second, Ok(Outcome::Answered(Answer::Replay(r)))
            if r.status == 201 && r.body == b"charged"),
        "the handler's answer is what is stored, never a 500 in its place: {second:?}"
    );
}

#[tokio::test]
async fn c08_a_guard_completion_refused_misconf_lands_within_the_lease() {
    let (server, url) = saving();
    let lease = Duration::from_secs(3);
    let idem = engine(store(&url).await, lease);
    let req = idem
        .request("acct", "POST", "/v1/charges")
        .key(Some("misconf-guard"))
        .body(b"{}")
        .build()
        .expect("request");
    let Begin::Acquired(held) = idem.begin(&req).await.expect("begin") else {
        panic!("a fresh key is acquired");
    };
    // The effect runs, then a save fails before its completion.
    refuse_writes(&url, server.1.clone()).await;
    let completed = idem
        .complete(held, StoredResponse::new(201, "charged"))
        .await;
    eprintln!("completed: {completed:?}");
    tokio::time::sleep(lease + Duration::from_millis(500)).await;
    let retry = idem.begin(&req).await.expect("begin");
    eprintln!("retry after the lease: {retry:?}");
    assert!(
        matches!(&completed, Ok(r) if r.status == 201),
        "writes refused for {REFUSED_FOR:?} of a {lease:?} lease: the completion is retried \
         within it: {completed:?}"
    );
    assert!(
        matches!(&retry, Begin::Answered(Answer::Replay(r)) if r.body == b"charged"),
        "a retry after the lease replays, never runs the effect again: {retry:?}"
    );
}
