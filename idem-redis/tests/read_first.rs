//! `read_first(true)`: the read (`HMGET`, `PEXPIRETIME`, `PTTL` in one `MULTI`) decides as the
//! reservation script does, whoever set the key's TTL, on a single Redis and on a Cluster, and a
//! value that is not a record is never an answer.
//!
//! Each test builds two stores on one prefix: `reads` (read_first(true)) and `scripts` (the
//! default), and asserts what C9/C10 require of both.

mod common;

use common::Redis;
use idem_core::store::{Acquire, Deadline, StoreExt};
use idem_core::testing::{policy, request, unique_consumer, LEASE, SHORT_RETENTION};
use idem_core::{Answer, Begin, FencingToken, Idempotency, Request, StoredResponse};
use idem_redis::redis;
use idem_redis::RedisStore;
use std::sync::Arc;
use std::time::Duration;

async fn pair() -> (Arc<RedisStore>, Arc<RedisStore>) {
    let redis = Redis { cluster: false };
    let prefix = format!("t{}", FencingToken::generate());
    let reads = redis
        .connect(RedisStore::builder().prefix(&prefix).read_first(true))
        .await;
    let scripts = redis.connect(RedisStore::builder().prefix(&prefix)).await;
    (Arc::new(reads), Arc::new(scripts))
}

fn kind(begin: &Begin) -> String {
    match begin {
        Begin::Acquired(lease) => format!("acquired {:?}", lease.acquired()),
        Begin::Answered(Answer::Replay(r)) => format!("replay {r:?}"),
        Begin::Answered(other) => format!("{other:?}"),
    }
}

/// Completes `req` under `idem`, then keeps its key a minute longer behind the store's back (an
/// operator's `PEXPIRE`), and waits until its retention has passed.
async fn completed_then_kept(
    idem: &Idempotency<Arc<RedisStore>>,
    store: &RedisStore,
    req: &Request,
) {
    let Begin::Acquired(lease) = idem.begin(req).await.expect("begin") else {
        panic!("fresh")
    };
    idem.complete(lease, StoredResponse::new(201, "old"))
        .await
        .expect("complete");
    let set: i64 = Redis { cluster: false }
        .raw(
            redis::cmd("PEXPIRE")
                .arg(store.key_of(req.id()))
                .arg(60_000),
        )
        .await;
    assert_eq!(set, 1);
    tokio::time::sleep(SHORT_RETENTION + Duration::from_millis(200)).await;
}

/// C10: a completed record past its retention behaves as absent, whoever extended its key's
/// TTL: read first or not, the same body starts over.
#[tokio::test]
async fn c10_read_first_starts_over_a_record_past_retention_whose_ttl_was_extended() {
    let (reads, scripts) = pair().await;
    let pol = policy().retention(SHORT_RETENTION);
    let consumer = unique_consumer("rf-c10");
    for (name, store, key) in [("reads", &reads, "k1"), ("scripts", &scripts, "k2")] {
        let idem = Idempotency::with_policy(Arc::clone(store), pol.clone()).expect("policy");
        let req = request(&consumer, key, b"{}");
        completed_then_kept(&idem, store, &req).await;
        let same = idem.begin(&req).await.expect("begin again");
        assert!(
            matches!(&same, Begin::Acquired(lease) if lease.acquired() != Acquire::FRESH),
            "{name}: a record past its retention behaves as absent (C10): {}",
            kind(&same)
        );
    }
}

/// C10 / C3: another body on a record past its retention whose TTL was extended is a new
/// request, never a 422.
#[tokio::test]
async fn c10_read_first_never_answers_422_for_a_record_past_retention() {
    let (reads, _scripts) = pair().await;
    let pol = policy().retention(SHORT_RETENTION);
    let idem = Idempotency::with_policy(Arc::clone(&reads), pol).expect("policy");
    let consumer = unique_consumer("rf-c10b");
    let req = request(&consumer, "k", b"{}");
    completed_then_kept(&idem, &reads, &req).await;
    let other = request(&consumer, "k", b"{\"other\":1}");
    let got = idem.begin(&other).await.expect("begin");
    assert!(
        matches!(got, Begin::Acquired(_)),
        "expired record behaves as absent (C10), not a mismatch: {}",
        kind(&got)
    );
}

/// C9: an orphan whose lease has passed is taken over by the next attempt, read first or not,
/// even when its key's TTL was extended (an operator's `PEXPIRE`): never answered in flight for
/// as long as the key lives.
#[tokio::test]
async fn c09_read_first_takes_over_an_orphan_whose_ttl_was_extended() {
    let (reads, scripts) = pair().await;
    let consumer = unique_consumer("rf-c09");
    let mut outcomes = Vec::new();
    for (name, store, key) in [("reads", &reads, "o1"), ("scripts", &scripts, "o2")] {
        let idem = Idempotency::with_policy(Arc::clone(store), policy()).expect("policy");
        let req = request(&consumer, key, b"{}");
        let Begin::Acquired(orphan) = store
            .reservation(&req, LEASE, Deadline::default())
            .await
            .expect("reserve")
        else {
            panic!("fresh")
        };
        let _: i64 = Redis { cluster: false }
            .raw(
                redis::cmd("PEXPIRE")
                    .arg(reads.key_of(req.id()))
                    .arg(60_000),
            )
            .await;
        tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
        let got = idem.begin(&req).await.expect("begin");
        outcomes.push((name, kind(&got), got, orphan.token()));
    }
    for (name, text, _, _) in &outcomes {
        println!("{name}: {text}");
    }
    for (name, text, begin, token) in &outcomes {
        assert!(
            matches!(begin, Begin::Acquired(lease) if lease.acquired() == Acquire::take_over(*token)),
            "{name}: the orphan is taken over (C9): {text}"
        );
    }
}

/// The read on a single Redis or a Cluster: in flight, mismatch, replay, and corrupt values.
async fn read_paths(cluster: bool) {
    let redis = Redis { cluster };
    let store = Arc::new(
        redis
            .connect(
                RedisStore::builder()
                    .prefix(&format!("t{}", FencingToken::generate()))
                    .read_first(true),
            )
            .await,
    );
    let idem = Idempotency::with_policy(Arc::clone(&store), policy()).expect("policy");
    let consumer = unique_consumer("rf-paths");
    let req = request(&consumer, "k", b"{}");
    let Begin::Acquired(lease) = idem.begin(&req).await.expect("begin") else {
        panic!("fresh")
    };
    let got = idem.begin(&req).await.expect("begin");
    assert!(
        matches!(got, Begin::Answered(Answer::InFlight { .. })),
        "{}",
        kind(&got)
    );
    let other = request(&consumer, "k", b"{\"o\":1}");
    let got = idem.begin(&other).await.expect("begin");
    assert!(
        matches!(got, Begin::Answered(Answer::Mismatch)),
        "{}",
        kind(&got)
    );
    idem.complete(lease, StoredResponse::new(201, "made"))
        .await
        .expect("complete");
    let got = idem.begin(&req).await.expect("begin");
    assert!(
        matches!(got, Begin::Answered(Answer::Replay(_))),
        "{}",
        kind(&got)
    );
    let got = idem.begin(&other).await.expect("begin");
    assert!(
        matches!(got, Begin::Answered(Answer::Mismatch)),
        "{}",
        kind(&got)
    );

    // A key whose TTL was removed (PERSIST): left to the script, which still answers.
    let req = request(&consumer, "persisted", b"{}");
    let Begin::Acquired(lease) = idem.begin(&req).await.expect("begin") else {
        panic!("fresh")
    };
    let key = store.key_of(req.id());
    let _: i64 = redis.raw(redis::cmd("PERSIST").arg(&key)).await;
    let got = idem.begin(&req).await.expect("begin");
    assert!(
        matches!(got, Begin::Answered(Answer::InFlight { .. })),
        "{}",
        kind(&got)
    );
    idem.complete(lease, StoredResponse::new(201, "made"))
        .await
        .expect("complete");
    let got = idem.begin(&req).await.expect("begin");
    assert!(
        matches!(got, Begin::Answered(Answer::Replay(_))),
        "{}",
        kind(&got)
    );
    // A string at the key (WRONGTYPE): an error, never a reservation.
    let req = request(&consumer, "string", b"{}");
    let _: () = redis
        .raw(redis::cmd("SET").arg(store.key_of(req.id())).arg("x"))
        .await;
    let got = idem.begin(&req).await;
    assert!(got.is_err(), "WRONGTYPE: {got:?}");
    // A foreign hash (no 'v'), with a TTL.
    let req = request(&consumer, "foreign", b"{}");
    let key = store.key_of(req.id());
    let _: () = redis
        .raw(redis::cmd("HSET").arg(&key).arg("a").arg("b"))
        .await;
    let _: i64 = redis.raw(redis::cmd("PEXPIRE").arg(&key).arg(60_000)).await;
    let got = idem.begin(&req).await;
    assert!(got.is_err(), "foreign hash: {got:?}");
    // Ours, without a token.
    let req = request(&consumer, "notoken", b"{}");
    let Begin::Acquired(_l) = idem.begin(&req).await.expect("begin") else {
        panic!("fresh")
    };
    let key = store.key_of(req.id());
    let _: i64 = redis.raw(redis::cmd("HDEL").arg(&key).arg("tok")).await;
    let got = idem.begin(&req).await;
    assert!(got.is_err(), "no token: {got:?}");
}

#[tokio::test]
async fn c12_read_first_on_one_redis() {
    read_paths(false).await;
}

#[tokio::test]
async fn c12_read_first_on_a_cluster() {
    read_paths(true).await;
}
