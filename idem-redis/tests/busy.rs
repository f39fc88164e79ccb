//! A Redis busy running a slow script (someone else's, past `busy-reply-threshold`) answers
//! every call `BUSY` until the script ends or is killed: a store that is down for a moment
//! (C13), never a refusal. A completion answered `BUSY` right after the effect ran is retried
//! within the lease and lands as the handler's answer (C8): never replaced by a stored 500,
//! never given up so that a retry after the lease runs the effect again. Each on a
//! redis-server of its own.

mod common;

use common::{start_on_free_port, temp_dir, Server};
use idem_core::{Answer, Begin, Failure, Idempotency, Outcome, Policy, StoredResponse};
use idem_redis::redis;
use idem_redis::RedisStore;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long the slow script keeps Redis busy once it answers `BUSY`.
const BUSY_FOR: Duration = Duration::from_millis(1200);

/// A redis-server that answers `BUSY` 50 ms into a slow script.
fn busy_prone() -> (Server, String) {
    let dir = temp_dir();
    let (child, port) = start_on_free_port(&dir, &["--busy-reply-threshold", "50"]);
    (Server(child, dir), format!("redis://127.0.0.1:{port}"))
}

/// Runs a script that never ends on a connection of its own, waits until Redis answers
/// `BUSY`, and kills the script (`SCRIPT KILL`, from another connection) after [`BUSY_FOR`].
/// Returns once Redis answers `BUSY`.
async fn make_busy(url: &str) {
    let client = redis::Client::open(url).expect("url");
    let mut runner = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let mut admin = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    tokio::spawn(async move {
        let ended: redis::RedisResult<redis::Value> = redis::cmd("EVAL")
            .arg("while true do end")
            .arg(0)
            .query_async(&mut runner)
            .await;
        assert!(ended.is_err(), "the script ends killed: {ended:?}");
    });
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let ping: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut admin).await;
        if matches!(&ping, Err(e) if e.code() == Some("BUSY")) {
            break;
        }
    }
    tokio::spawn(async move {
        tokio::time::sleep(BUSY_FOR).await;
        let killed: redis::RedisResult<()> = redis::cmd("SCRIPT")
            .arg("KILL")
            .query_async(&mut admin)
            .await;
        killed.expect("script kill");
    });
}

fn engine(store: RedisStore, lease: Duration) -> Idempotency<RedisStore> {
    Idempotency::with_policy(store, Policy::default().lease(lease)).expect("policy")
}

#[tokio::test]
async fn c08_a_completion_answered_busy_is_retried_and_stores_the_handlers_answer() {
    let (_server, url) = busy_prone();
    let store = RedisStore::builder()
        .response_timeout(Duration::from_millis(500))
        .connect(&url)
        .await
        .expect("connect");
    let idem = engine(store, Duration::from_secs(10));
    let req = idem
        .request("acct", "POST", "/v1/charges")
        .key(Some("busy-closure"))
        .body(b"{}")
        .build()
        .expect("request");
    let effects = Arc::new(AtomicUsize::new(0));
    let (e, u) = (Arc::clone(&effects), url.clone());
    let first = idem
        .run(&req, move |_| async move {
            e.fetch_add(1, Ordering::SeqCst);
            make_busy(&u).await;
            Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged"))
        })
        .await;
    eprintln!("first: {first:?}");
    tokio::time::sleep(BUSY_FOR + Duration::from_millis(500)).await;
    let second = idem
        .run(&req, |_| async {
            Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged again"))
        })
        .await;
    eprintln!("second: {second:?}");
    assert_eq!(effects.load(Ordering::SeqCst), 1, "the effect ran once");
    assert!(
        matches!(&first, Ok(Outcome::Executed(r)) if r.status == 201),
        "Redis busy for {BUSY_FOR:?}, within the store budget: the completion is retried and \
         the handler's answer sent: {first:?}"
    );
    assert!(
        matches!(&second, Ok(Outcome::Answered(Answer::Replay(r)))
            if r.status == 201 && r.body == b"charged"),
        "the handler's answer is what is stored, never a 500 in its place: {second:?}"
    );
}

#[tokio::test]
async fn c08_a_guard_completion_answered_busy_lands_within_the_lease() {
    let (_server, url) = busy_prone();
    let store = RedisStore::builder()
        .response_timeout(Duration::from_millis(500))
        .connect(&url)
        .await
        .expect("connect");
    let lease = Duration::from_secs(3);
    let idem = engine(store, lease);
    let req = idem
        .request("acct", "POST", "/v1/charges")
        .key(Some("busy-guard"))
        .body(b"{}")
        .build()
        .expect("request");
    let Begin::Acquired(held) = idem.begin(&req).await.expect("begin") else {
        panic!("a fresh key is acquired");
    };
    // The effect runs, then Redis turns busy before its completion.
    make_busy(&url).await;
    let completed = idem
        .complete(held, StoredResponse::new(201, "charged"))
        .await;
    eprintln!("completed: {completed:?}");
    // Past the lease: a retry is answered from the record.
    tokio::time::sleep(lease + Duration::from_millis(500)).await;
    let retry = idem.begin(&req).await.expect("begin");
    eprintln!("retry after the lease: {retry:?}");
    assert!(
        matches!(&completed, Ok(r) if r.status == 201),
        "Redis busy for {BUSY_FOR:?} of a {lease:?} lease: the completion is retried within \
         it: {completed:?}"
    );
    assert!(
        matches!(&retry, Begin::Answered(Answer::Replay(r)) if r.body == b"charged"),
        "a retry after the lease replays, never runs the effect again: {retry:?}"
    );
}

/// A read-first store's read (`HMGET` and `TIME` in one pipeline) answered `BUSY` is a store
/// that is down for a moment too: a retryable error (a 503 that says to retry), as a script
/// answered `BUSY` is; so is a reservation that reads first.
#[tokio::test]
async fn c13_a_read_answered_busy_is_unavailable_like_a_script() {
    use idem_core::store::{Deadline, Store};
    let (_server, url) = busy_prone();
    let store = RedisStore::builder()
        .response_timeout(Duration::from_millis(500))
        .read_first(true)
        .connect(&url)
        .await
        .expect("connect");
    let idem = engine(store.clone(), Duration::from_secs(10));
    let req = idem
        .request("acct", "POST", "/v1/charges")
        .key(Some("busy-read"))
        .body(b"{}")
        .build()
        .expect("request");
    make_busy(&url).await;
    let read = store.read(&req, Deadline::default()).await;
    let reserved = idem.begin(&req).await;
    eprintln!("read: {read:?}\nreserve: {reserved:?}");
    assert!(
        matches!(&reserved, Err(e) if e.is_retryable()),
        "a reservation answered BUSY: {reserved:?}"
    );
    assert!(
        matches!(&read, Err(e) if e.is_retryable()),
        "a read answered BUSY: {read:?}"
    );
}
