//! A Redis refusing calls for a moment answers with codes that mean "down for now", never "no
//! for good" (C13): `BUSY` while a slow script runs (someone else's, past
//! `busy-reply-threshold`) until it ends or is killed, and `MISCONF` while writes are refused
//! after a failed save (`stop-writes-on-bgsave-error`: a full or unwritable disk) until a save
//! succeeds, as PostgreSQL's disk full is. A completion met by either right after the effect
//! ran is retried within the lease and lands as the handler's answer (C8): never replaced by a
//! stored 500, never given up so that a retry after the lease runs the effect again. Each on a
//! redis-server of its own.

mod common;

use common::{start_on_free_port, temp_dir, Server};
use idem_core::{Answer, Begin, Failure, Idempotency, Outcome, Policy, StoredResponse};
use idem_redis::redis;
use idem_redis::RedisStore;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long Redis refuses once it does.
const REFUSING_FOR: Duration = Duration::from_millis(1200);

/// How Redis refuses for a moment.
#[derive(Clone, Copy, Debug)]
enum Refusal {
    /// `BUSY`: a script that runs past `busy-reply-threshold`.
    Busy,
    /// `MISCONF`: writes refused after a failed save.
    Misconf,
}

impl Refusal {
    /// A redis-server that can refuse so, and its URL.
    fn server(self) -> (Server, String) {
        let dir = temp_dir();
        let args: &[&str] = match self {
            Refusal::Busy => &["--busy-reply-threshold", "50"],
            // It saves (so a failed save stops writes) and lets its directory be moved.
            Refusal::Misconf => &["--save", "3600 1", "--enable-protected-configs", "yes"],
        };
        let (child, port) = start_on_free_port(&dir, args);
        (Server(child, dir), format!("redis://127.0.0.1:{port}"))
    }

    /// Makes the server at `url` (its files in `dir`) refuse so; returns once it does, and it
    /// stops after [`REFUSING_FOR`].
    async fn start(self, url: &str, dir: PathBuf) {
        match self {
            Refusal::Busy => make_busy(url).await,
            Refusal::Misconf => refuse_writes(url, dir).await,
        }
    }
}

/// Runs a script that never ends on a connection of its own, waits until Redis answers
/// `BUSY`, and kills the script (`SCRIPT KILL`, from another connection) after [`REFUSING_FOR`].
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
        tokio::time::sleep(REFUSING_FOR).await;
        let killed: redis::RedisResult<()> = redis::cmd("SCRIPT")
            .arg("KILL")
            .query_async(&mut admin)
            .await;
        killed.expect("script kill");
    });
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
/// [`REFUSING_FOR`].
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
        tokio::time::sleep(REFUSING_FOR).await;
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
async fn c08_a_completion_answered_busy_is_retried_and_stores_the_handlers_answer() {
    closure_completion_lands(Refusal::Busy).await;
}

#[tokio::test]
async fn c08_a_completion_refused_misconf_is_retried_and_stores_the_handlers_answer() {
    closure_completion_lands(Refusal::Misconf).await;
}

#[tokio::test]
async fn c08_a_guard_completion_answered_busy_lands_within_the_lease() {
    guard_completion_lands(Refusal::Busy).await;
}

#[tokio::test]
async fn c08_a_guard_completion_refused_misconf_lands_within_the_lease() {
    guard_completion_lands(Refusal::Misconf).await;
}

/// A closure's effect runs, then Redis refuses for [`REFUSING_FOR`] before its completion:
/// the completion is retried within the store budget, the handler's answer sent and stored.
async fn closure_completion_lands(refusal: Refusal) {
    let (server, url) = refusal.server();
    let idem = engine(store(&url).await, Duration::from_secs(10));
    let req = idem
        .request("acct", "POST", "/v1/charges")
        .key(Some("refused-closure"))
        .body(b"{}")
        .build()
        .expect("request");
    let effects = Arc::new(AtomicUsize::new(0));
    let (e, u, dir) = (Arc::clone(&effects), url.clone(), server.1.clone());
    let first = idem
        .run(&req, move |_| async move {
            e.fetch_add(1, Ordering::SeqCst);
            refusal.start(&u, dir).await;
            Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged"))
        })
        .await;
    eprintln!("first: {first:?}");
    tokio::time::sleep(REFUSING_FOR + Duration::from_millis(500)).await;
    let second = idem
        .run(&req, |_| async {
            Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged again"))
        })
        .await;
    eprintln!("second: {second:?}");
    assert_eq!(effects.load(Ordering::SeqCst), 1, "the effect ran once");
    assert!(
        matches!(&first, Ok(Outcome::Executed(r)) if r.status == 201),
        "Redis refusing ({refusal:?}) for {REFUSING_FOR:?}, within the store budget: the \
         completion is retried and the handler's answer sent: {first:?}"
    );
    assert!(
        matches!(&second, Ok(Outcome::Answered(Answer::Replay(r)))
            if r.status == 201 && r.body == b"charged"),
        "the handler's answer is what is stored, never a 500 in its place: {second:?}"
    );
}

/// A guard's effect runs, then Redis refuses for [`REFUSING_FOR`] of a 3 s lease before its
/// completion: the completion is retried within the lease, and a retry after it replays.
async fn guard_completion_lands(refusal: Refusal) {
    let (server, url) = refusal.server();
    let lease = Duration::from_secs(3);
    let idem = engine(store(&url).await, lease);
    let req = idem
        .request("acct", "POST", "/v1/charges")
        .key(Some("refused-guard"))
        .body(b"{}")
        .build()
        .expect("request");
    let Begin::Acquired(held) = idem.begin(&req).await.expect("begin") else {
        panic!("a fresh key is acquired");
    };
    refusal.start(&url, server.1.clone()).await;
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
        "Redis refusing ({refusal:?}) for {REFUSING_FOR:?} of a {lease:?} lease: the \
         completion is retried within it: {completed:?}"
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
    let (server, url) = Refusal::Busy.server();
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
    Refusal::Busy.start(&url, server.1.clone()).await;
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
