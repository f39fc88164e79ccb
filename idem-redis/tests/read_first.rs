//! `read_first(true)`: the read (`HMGET` of the record's read header, then `TIME`) decides as
//! the reservation script does, whoever set the key's TTL, on a single Redis and on a Cluster,
//! and a value that is not a record is never an answer.
//!
//! Each test builds two stores on one prefix: `reads` (read_first(true), the default) and
//! `scripts` (read_first(false)), and asserts what C9/C10 require of both.

mod common;

use common::Redis;
use idem_core::store::Store;
use idem_core::store::{Acquire, Deadline, StoreExt};
use idem_core::testing::{policy, request, unique_consumer, LEASE, SHORT_RETENTION};
use idem_core::{
    Answer, Begin, Error, Failure, FencingToken, Idempotency, Request, StoredResponse,
};
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
    let scripts = redis
        .connect(RedisStore::builder().prefix(&prefix).read_first(false))
        .await;
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

    // A key whose TTL was removed (PERSIST): still answered by its own deadline.
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
    // Ours, without a token and without a read header: the script reads it, and fails.
    let req = request(&consumer, "notoken", b"{}");
    let Begin::Acquired(_l) = idem.begin(&req).await.expect("begin") else {
        panic!("fresh")
    };
    let key = store.key_of(req.id());
    let _: i64 = redis
        .raw(redis::cmd("HDEL").arg(&key).arg("tok").arg("rh"))
        .await;
    let got = idem.begin(&req).await;
    assert!(got.is_err(), "no token: {got:?}");
    // A read header that is not one: an error, never an answer or a reservation.
    for (name, header) in [
        ("garbage", b"\xff\x00".to_vec()),
        ("empty", Vec::new()),
        (
            "five-values",
            [0xa1, b'1', 0xa0, 0xa0, 0xa1, b'0', 0xa0].to_vec(),
        ),
    ] {
        let req = request(&consumer, name, b"{}");
        let Begin::Acquired(_l) = idem.begin(&req).await.expect("begin") else {
            panic!("fresh")
        };
        let key = store.key_of(req.id());
        let _: i64 = redis
            .raw(redis::cmd("HSET").arg(&key).arg("rh").arg(header))
            .await;
        let got = idem.begin(&req).await;
        assert!(
            matches!(&got, Err(Error::CorruptRecord(_))),
            "{name}: {:?}",
            got.map(|b| kind(&b))
        );
    }
}

/// The read header (`rh`), read behind the store's back by another MessagePack reader:
/// `[version, fingerprint, token, state, deadline, triple]`, or `None`.
async fn header(redis: &Redis, store: &RedisStore, req: &Request) -> Option<Vec<Vec<u8>>> {
    let packed: Option<Vec<u8>> = redis
        .raw(redis::cmd("HGET").arg(store.key_of(req.id())).arg("rh"))
        .await;
    let mut rest = packed?;
    let mut rest = rest.as_mut_slice() as &[u8];
    let mut values = Vec::new();
    while !rest.is_empty() {
        match rmpv::decode::read_value(&mut rest).expect("MessagePack") {
            rmpv::Value::String(s) => values.push(s.into_bytes()),
            other => panic!("a header holds strings, not {other:?}"),
        }
    }
    Some(values)
}

/// The record's own fields the header copies, in its order.
async fn copied(redis: &Redis, store: &RedisStore, req: &Request) -> Vec<Vec<u8>> {
    redis
        .raw(
            redis::cmd("HMGET")
                .arg(store.key_of(req.id()))
                .arg(&["v", "fp", "tok", "st", "dl", "id"]),
        )
        .await
}

/// A store that reads first keeps a read header equal to the record's fields through every
/// write (a reservation, a renewal, a takeover, a completion); a completion in doubt and a
/// store that does not read first write none, and a read of the fields answers their records.
async fn header_follows_the_record(cluster: bool) {
    let redis = Redis { cluster };
    let prefix = format!("t{}", FencingToken::generate());
    let reads = redis
        .connect(RedisStore::builder().prefix(&prefix).read_first(true))
        .await;
    let scripts = redis
        .connect(RedisStore::builder().prefix(&prefix).read_first(false))
        .await;
    let consumer = unique_consumer("rf-header");
    let req = request(&consumer, "k", b"{}");
    let Begin::Acquired(orphan) = reads
        .reservation(&req, LEASE, Deadline::default())
        .await
        .expect("reserve")
    else {
        panic!("fresh")
    };
    let agree = |what: &'static str| {
        let (redis, reads, req) = (&redis, &reads, &req);
        async move {
            let fields = copied(redis, reads, req).await;
            assert_eq!(
                header(redis, reads, req).await.as_ref(),
                Some(&fields),
                "{what}"
            );
            fields
        }
    };
    let reserved = agree("reserved").await;
    assert_eq!(reserved[3], b"0");
    tokio::time::sleep(Duration::from_millis(20)).await;
    reads
        .renew(&orphan, LEASE, Deadline::default())
        .await
        .expect("renew");
    assert_ne!(agree("renewed").await[4], reserved[4], "a later deadline");
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    let idem = Idempotency::with_policy(reads.clone(), policy()).expect("policy");
    let Begin::Acquired(lease) = idem.begin(&req).await.expect("begin") else {
        panic!("the orphan is taken over")
    };
    assert_eq!(agree("taken over").await[2], lease.token().as_bytes());
    let got = idem.begin(&req).await.expect("begin");
    assert!(
        matches!(got, Begin::Answered(Answer::InFlight { .. })),
        "in flight, by the header: {}",
        kind(&got)
    );
    idem.complete(lease, StoredResponse::new(201, "made"))
        .await
        .expect("complete");
    assert_eq!(agree("completed").await[3], b"1");

    let doubtful = request(&consumer, "doubt", b"{}");
    let failed = idem
        .run(&doubtful, |_ctx| async {
            Err::<StoredResponse, _>(Failure::unknown("the provider timed out"))
        })
        .await;
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(header(&redis, &reads, &doubtful).await, None, "in doubt");
    let got = idem.begin(&doubtful).await.expect("begin");
    assert!(
        matches!(&got, Begin::Answered(Answer::Replay(r)) if r.status == 500),
        "in doubt, answered by a read of the fields: {}",
        kind(&got)
    );

    let plain = Idempotency::with_policy(scripts.clone(), policy()).expect("policy");
    let other = request(&consumer, "plain", b"{}");
    let Begin::Acquired(lease) = plain.begin(&other).await.expect("begin") else {
        panic!("fresh")
    };
    assert_eq!(header(&redis, &scripts, &other).await, None, "reserved");
    let got = idem.begin(&other).await.expect("begin");
    assert!(
        matches!(got, Begin::Answered(Answer::InFlight { .. })),
        "no header, answered by a read of the fields: {}",
        kind(&got)
    );
    plain
        .complete(lease, StoredResponse::new(201, "plain"))
        .await
        .expect("complete");
    assert_eq!(header(&redis, &scripts, &other).await, None, "completed");
    let got = idem.begin(&other).await.expect("begin");
    assert!(
        matches!(&got, Begin::Answered(Answer::Replay(r)) if r.body == b"plain"),
        "no header, answered by a read of the fields: {}",
        kind(&got)
    );
}

/// A rolling upgrade: a release that does not know read headers completes or renews a record
/// whose header it leaves as it was. The read never answers from the stale header: a
/// completion is replayed (C7), never answered in flight; a renewed lease is never taken over
/// (C9).
#[tokio::test]
async fn c07_a_header_left_behind_by_an_older_release_is_never_an_answer() {
    let redis = Redis { cluster: false };
    let store = redis
        .connect(
            RedisStore::builder()
                .prefix(&format!("t{}", FencingToken::generate()))
                .read_first(true),
        )
        .await;
    let idem = Idempotency::with_policy(store.clone(), policy()).expect("policy");
    let consumer = unique_consumer("rf-upgrade");
    let now_ms = |time: Vec<String>| -> i64 {
        time[0].parse::<i64>().expect("s") * 1000 + time[1].parse::<i64>().expect("us") / 1000
    };

    // Completed as complete.lua did before headers: state, response, deadline, TTL.
    let req = request(&consumer, "completed", b"{}");
    let Begin::Acquired(_lease) = idem.begin(&req).await.expect("begin") else {
        panic!("fresh")
    };
    let key = store.key_of(req.id());
    let now = now_ms(redis.raw(&redis::cmd("TIME")).await);
    let response = StoredResponse::new(201, "old release")
        .encode()
        .expect("encodes");
    let mut old_complete = redis::cmd("HSET");
    old_complete
        .arg(&key)
        .arg("st")
        .arg("1")
        .arg("resp")
        .arg(response)
        .arg("dl")
        .arg(now + 60_000)
        .arg("ca")
        .arg(now);
    let _: i64 = redis.raw(&old_complete).await;
    let _: i64 = redis
        .raw(redis::cmd("PEXPIREAT").arg(&key).arg(now + 60_000))
        .await;
    assert_eq!(header(&redis, &store, &req).await.expect("stale")[3], b"0");
    let got = idem.begin(&req).await.expect("begin");
    assert!(
        matches!(&got, Begin::Answered(Answer::Replay(r)) if r.body == b"old release"),
        "{}",
        kind(&got)
    );

    // Renewed as renew.lua did before headers, after the header's lease passed.
    let req = request(&consumer, "renewed", b"{}");
    let Begin::Acquired(_lease) = idem.begin(&req).await.expect("begin") else {
        panic!("fresh")
    };
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    let key = store.key_of(req.id());
    let now = now_ms(redis.raw(&redis::cmd("TIME")).await);
    let _: i64 = redis
        .raw(redis::cmd("HSET").arg(&key).arg("dl").arg(now + 60_000))
        .await;
    let _: i64 = redis
        .raw(redis::cmd("PEXPIREAT").arg(&key).arg(now + 61_000))
        .await;
    let got = idem.begin(&req).await.expect("begin");
    assert!(
        matches!(got, Begin::Answered(Answer::InFlight { .. })),
        "the renewed lease holds: {}",
        kind(&got)
    );
}

#[tokio::test]
async fn c06_the_read_header_follows_the_record_on_one_redis() {
    header_follows_the_record(false).await;
}

#[tokio::test]
async fn c06_the_read_header_follows_the_record_on_a_cluster() {
    header_follows_the_record(true).await;
}

#[tokio::test]
async fn c12_read_first_on_one_redis() {
    read_paths(false).await;
}

#[tokio::test]
async fn c12_read_first_on_a_cluster() {
    read_paths(true).await;
}

/// One fleet on one prefix: four engines on their own connections, two reading first (headers
/// written) and two not (none), two with a replay cache. Thirty keys, most of them orphans of
/// short leases, six concurrent callers each on rotating engines, the orphans' holders trying
/// to complete late: every key runs its effect once (C4, C9, C6), and every answer is that
/// execution's response (C7), whichever engine wrote or read the record.
async fn mixed_fleet(cluster: bool) {
    use idem_core::{Outcome, ReplayCache};
    use std::collections::HashMap;
    use std::sync::Mutex;

    let redis = Redis { cluster };
    let prefix = format!("t{}", FencingToken::generate());
    let (mut stores, mut engines) = (Vec::new(), Vec::new());
    for i in 0..4 {
        let builder = RedisStore::builder().prefix(&prefix).read_first(i % 2 == 0);
        let store = Arc::new(redis.connect(builder).await);
        let mut engine = Idempotency::builder(Arc::clone(&store)).policy(policy());
        if i < 2 {
            engine = engine.replay_cache(ReplayCache::new(10_000, 64 << 20));
        }
        engines.push(engine.build().expect("engine"));
        stores.push(store);
    }
    let consumer = unique_consumer("rf-fleet");
    const KEYS: usize = 30;
    let mut orphans = Vec::new();
    for k in (0..KEYS).filter(|k| k % 3 != 0) {
        let req = request(&consumer, &format!("k{k}"), b"{}");
        let lease = Duration::from_millis(150 + (k as u64 % 5) * 60);
        let Begin::Acquired(orphan) = stores[k % 4]
            .reservation(&req, lease, Deadline::default())
            .await
            .expect("reserve")
        else {
            panic!("fresh")
        };
        orphans.push((k, orphan));
    }
    let executions: Arc<Mutex<HashMap<usize, Vec<String>>>> = Arc::default();
    let answers: Arc<Mutex<HashMap<usize, Vec<Vec<u8>>>>> = Arc::default();
    let mut callers = Vec::new();
    for k in 0..KEYS {
        for t in 0..6u64 {
            let idem = engines[(k + t as usize) % 4].clone();
            let req = request(&consumer, &format!("k{k}"), b"{}");
            let (executions, answers) = (Arc::clone(&executions), Arc::clone(&answers));
            callers.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis((t * 37 + k as u64 * 13) % 300)).await;
                let give_up = std::time::Instant::now() + Duration::from_secs(8);
                loop {
                    let executions = Arc::clone(&executions);
                    let body = format!("{k}-{t}-{}", FencingToken::generate());
                    let got = idem
                        .run(&req, move |_ctx| async move {
                            executions
                                .lock()
                                .expect("lock")
                                .entry(k)
                                .or_default()
                                .push(body.clone());
                            tokio::time::sleep(Duration::from_millis(t * 71 % 250)).await;
                            Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, body))
                        })
                        .await;
                    match got {
                        Ok(Outcome::Executed(r) | Outcome::Answered(Answer::Replay(r))) => {
                            let mut bodies = vec![r.body];
                            for _ in 0..3 {
                                match idem.begin(&req).await {
                                    Ok(Begin::Answered(Answer::Replay(r))) => bodies.push(r.body),
                                    other => panic!("key {k}, after its completion: {other:?}"),
                                }
                            }
                            answers
                                .lock()
                                .expect("lock")
                                .entry(k)
                                .or_default()
                                .extend(bodies);
                            return;
                        }
                        Ok(Outcome::Answered(Answer::InFlight { .. })) => {
                            assert!(std::time::Instant::now() < give_up, "key {k}: in flight");
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        other => panic!("key {k}: {other:?}"),
                    }
                }
            }));
        }
    }
    // The orphans' holders wake up after their leases and try to complete: fenced out (C6).
    tokio::time::sleep(Duration::from_millis(700)).await;
    for (k, orphan) in orphans {
        let late = engines[(k + 1) % 4]
            .complete(orphan, StoredResponse::new(201, "late"))
            .await;
        assert!(late.is_err(), "key {k}: a late completion landed");
    }
    for caller in callers {
        caller.await.expect("caller");
    }
    let executions = executions.lock().expect("lock");
    let answers = answers.lock().expect("lock");
    for k in 0..KEYS {
        let ran = executions.get(&k).cloned().unwrap_or_default();
        assert_eq!(ran.len(), 1, "key {k}: executions {ran:?}");
        let answered = answers.get(&k).cloned().unwrap_or_default();
        assert_eq!(answered.len(), 6 * 4, "key {k}");
        assert!(
            answered.iter().all(|body| *body == ran[0].as_bytes()),
            "key {k}: answers {answered:?} against the execution {ran:?}"
        );
    }
}

#[tokio::test]
async fn c04_a_mixed_fleet_runs_each_key_once_on_one_redis() {
    mixed_fleet(false).await;
}

#[tokio::test]
async fn c04_a_mixed_fleet_runs_each_key_once_on_a_cluster() {
    mixed_fleet(true).await;
}

/// C3, C5: a request whose alternative fingerprint holds the key in flight, the record written
/// by a store that never reads first (no read header: another process of the prefix, or an
/// older release during an upgrade), is in flight at once on a store that reads first: the
/// read cannot tell, and the record the reservation's script finds is in flight as found.
#[tokio::test]
async fn c03_in_flight_under_the_alternative_without_a_header_is_in_flight() {
    let (reads, scripts) = pair().await;
    let consumer = unique_consumer("rf-c03");
    let old = request(&consumer, "k", b"raw");
    let new =
        request(&consumer, "k", b"canonical").with_alternative_fingerprint(*old.fingerprint());
    let Begin::Acquired(_holder) = scripts
        .reservation(&old, LEASE * 50, Deadline::default())
        .await
        .expect("reserve")
    else {
        panic!("fresh")
    };
    for (name, store) in [("reads", &reads), ("scripts", &scripts)] {
        let idem = Idempotency::with_policy(Arc::clone(store), policy()).expect("policy");
        let got = idem.begin(&new).await;
        assert!(
            matches!(got, Ok(Begin::Answered(Answer::InFlight { .. }))),
            "{name}: {got:?}"
        );
    }
}

/// A record gone behind the store's back, as after a master's restart without its data or a
/// failover to a replica the record had not reached, and answers with a replay cache. On one
/// Redis the store counts the connection's failure, which empties the cache; a Cluster's
/// client follows such a restart and failover without a failure the store could count, so
/// there the cache holds nothing (`Store::generation` is `None`), and every answer is Redis's
/// own: the retry after the loss is executed, never the lost execution's replay from one
/// process while another executes it again.
async fn cache_after_a_lost_record_on_a_cluster() -> Vec<String> {
    use idem_core::{Outcome, ReplayCache};
    let redis = Redis { cluster: true };
    let store = redis
        .connect(RedisStore::builder().prefix(&format!("t{}", FencingToken::generate())))
        .await;
    let idem = Idempotency::builder(store)
        .replay_cache(ReplayCache::new(10_000, 64 << 20))
        .build()
        .expect("engine");
    let req = request(&unique_consumer("rf-lost"), "k", b"{}");
    let mut answers = Vec::new();
    for round in 0..3 {
        if round == 2 {
            let key = idem.store().key_of(req.id());
            let deleted: i64 = redis.raw(redis::cmd("DEL").arg(&key)).await;
            assert_eq!(deleted, 1, "the record was there");
        }
        let got = idem
            .run(&req, move |_ctx| async move {
                Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, format!("run {round}")))
            })
            .await;
        answers.push(match got {
            Ok(Outcome::Executed(r)) => format!("executed {}", String::from_utf8_lossy(&r.body)),
            Ok(Outcome::Answered(Answer::Replay(r))) => {
                format!("replayed {}", String::from_utf8_lossy(&r.body))
            }
            other => panic!("round {round}: {other:?}"),
        });
    }
    answers
}

#[tokio::test]
async fn c10_on_a_cluster_a_lost_record_is_never_answered_from_memory() {
    assert_eq!(
        cache_after_a_lost_record_on_a_cluster().await,
        ["executed run 0", "replayed run 0", "executed run 2"]
    );
    let store = Redis { cluster: true }.store().await;
    assert_eq!(Store::generation(&store), None, "a Cluster caches nothing");
    let one = Redis { cluster: false }.store().await;
    assert!(
        Store::generation(&one).is_some(),
        "one Redis counts its failures"
    );
}
