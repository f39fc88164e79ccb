//! C12 and C13 on Redis: a stored record whose fields contradict each other is a typed error on
//! every path that reads it, never an answer made up from part of it; a Redis that freezes is a
//! store-unavailable error within the store's deadline, never a hang, and the same store answers
//! again once Redis does.

mod common;

use common::{start_on_free_port, temp_dir, Redis, Server};
use idem_core::store::Deadline;
use idem_core::store::{Store, StoreExt};
use idem_core::testing::{request, unique_consumer};
use idem_core::{Answer, Begin, Error, Field, Idempotency, Policy, StoreErrorKind, StoredResponse};
use idem_ops::{ListQuery, Operator};
use idem_redis::redis;
use idem_redis::RedisStore;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const BOTH: [Redis; 2] = [Redis { cluster: false }, Redis { cluster: true }];

const LEASE: Duration = Duration::from_secs(3600);

/// The stored hash of `key`, field by field.
async fn hash(redis: &Redis, key: &str) -> BTreeMap<String, Vec<u8>> {
    redis.raw(redis::cmd("HGETALL").arg(key)).await
}

/// Rewrites a record's read header from its fields as they are (as the scripts pack it).
const HEADER_FROM_FIELDS: &str =
    "local r = redis.call('HMGET', KEYS[1], 'v', 'fp', 'tok', 'st', 'dl', 'id') \
    if redis.call('HEXISTS', KEYS[1], 'rh') == 0 then return 0 end \
    redis.call('HSET', KEYS[1], 'rh', cmsgpack.pack(r[1], r[2], r[3], r[4], r[5], r[6])) \
    return 1";

/// A record that says it is in progress and also holds a response: a completed record whose
/// state is set back to in progress by hand, with its deadline in the future (a live lease) or
/// long past (an expired one, which a reservation would take over), its read header (the
/// fields' packed copy, `rh`) edited alike. The SQL stores refuse such a row
/// (`CorruptRecord`); so must this one, on reserve (same or another body: the read finds a
/// header in progress beside a response and reads the fields), lookup, listing and stats, and
/// nothing may rewrite it.
#[tokio::test]
async fn c12_in_progress_record_with_a_response_is_corrupt() {
    for redis in BOTH {
        for deadline in [None, Some("1")] {
            let store = redis.store().await;
            let idem = Idempotency::with_policy(store.clone(), Policy::default().lease(LEASE))
                .expect("valid policy");
            let consumer = unique_consumer("inprogress-resp");
            let same = request(&consumer, "k", b"{}");
            let Begin::Acquired(lease) = idem.begin(&same).await.expect("begin") else {
                panic!("a fresh key is acquired");
            };
            idem.complete(lease, StoredResponse::new(201, "ok"))
                .await
                .expect("complete");
            let key = store.key_of(same.id());
            let mut edit = redis::cmd("HSET");
            edit.arg(&key).arg("st").arg("0");
            if let Some(deadline) = deadline {
                edit.arg("dl").arg(deadline);
            }
            let added: i64 = redis.raw(&edit).await;
            assert_eq!(added, 0, "the fields existed and were overwritten");
            let header: i64 = redis
                .raw(redis::cmd("EVAL").arg(HEADER_FROM_FIELDS).arg(1).arg(&key))
                .await;
            assert_eq!(header, 1, "the store reads first: its record has a header");
            let before = hash(&redis, &key).await;
            let case = format!("cluster {}, deadline {deadline:?}", redis.cluster);

            let other = request(&consumer, "k", b"{\"another\":1}");
            for (which, req) in [("same body", &same), ("another body", &other)] {
                let reserved = store.reservation(req, LEASE, Deadline::default()).await;
                assert!(
                    matches!(reserved, Err(Error::CorruptRecord(_))),
                    "{case}, reserve with the {which}: {reserved:?}"
                );
            }
            let looked = store.lookup(same.id(), Deadline::default()).await;
            assert!(
                matches!(looked, Err(Error::CorruptRecord(_))),
                "{case}, lookup: {looked:?}"
            );
            for query in [
                ListQuery::in_progress(Duration::ZERO),
                ListQuery::completed(&consumer).expect("valid"),
            ] {
                let listed = every_page(&store, query).await;
                assert!(
                    matches!(listed, Err(Error::CorruptRecord(_))),
                    "{case}, list: {listed:?}"
                );
            }
            let stats = store.stats(Deadline::default()).await;
            assert!(
                matches!(stats, Err(Error::CorruptRecord(_))),
                "{case}, stats: {stats:?}"
            );
            assert_eq!(
                hash(&redis, &key).await,
                before,
                "{case}: the corrupt record was rewritten"
            );
        }
    }
}

/// A value under a record's key that the store did not write: a string (another program's, or
/// a key typed by hand) fails the first read of the reservation and of a lookup (Redis's
/// WRONGTYPE, reported as `CorruptRecord`), and a hash without the record's fields is
/// `CorruptRecord` too: never a fresh reservation written over it, never "absent".
#[tokio::test]
async fn c12_a_foreign_value_under_a_record_key_is_an_error_and_stays() {
    for redis in BOTH {
        let store = redis.store().await;
        let consumer = unique_consumer("foreign");
        let case = format!("cluster {}", redis.cluster);

        let string = request(&consumer, "a-string", b"{}");
        let key = store.key_of(string.id());
        let () = redis
            .raw(redis::cmd("SET").arg(&key).arg("not a record"))
            .await;
        let reserved = store.reservation(&string, LEASE, Deadline::default()).await;
        assert!(
            matches!(&reserved, Err(Error::CorruptRecord(why)) if why.contains("WRONGTYPE")),
            "{case}, reserve over a string: {reserved:?}"
        );
        let looked = store.lookup(string.id(), Deadline::default()).await;
        assert!(
            matches!(&looked, Err(Error::CorruptRecord(why)) if why.contains("WRONGTYPE")),
            "{case}, lookup of a string: {looked:?}"
        );
        let kept: String = redis.raw(redis::cmd("GET").arg(&key)).await;
        assert_eq!(kept, "not a record", "{case}: the string was overwritten");

        let other = request(&consumer, "a-hash", b"{}");
        let key = store.key_of(other.id());
        let added: i64 = redis
            .raw(
                redis::cmd("HSET")
                    .arg(&key)
                    .arg("owner")
                    .arg("someone else"),
            )
            .await;
        assert_eq!(added, 1, "a hash of one field of someone else's");
        let before = hash(&redis, &key).await;
        let reserved = store.reservation(&other, LEASE, Deadline::default()).await;
        assert!(
            matches!(reserved, Err(Error::CorruptRecord(_))),
            "{case}, reserve over a foreign hash: {reserved:?}"
        );
        for inspect in [false, true] {
            let looked = if inspect {
                store
                    .inspect(other.id(), Deadline::default())
                    .await
                    .map(|found| found.is_some())
            } else {
                store
                    .lookup(other.id(), Deadline::default())
                    .await
                    .map(|found| found.is_some())
            };
            assert!(
                matches!(looked, Err(Error::CorruptRecord(_))),
                "{case}, lookup (inspect {inspect}) of a foreign hash: {looked:?}"
            );
        }
        assert_eq!(
            hash(&redis, &key).await,
            before,
            "{case}: the foreign hash was rewritten"
        );
    }
}

/// Every page of `query`, or the first error.
async fn every_page(store: &RedisStore, query: ListQuery) -> Result<(), Error> {
    let mut query = query.limit(100);
    for _ in 0..100_000 {
        match store.list(&query, Deadline::default()).await?.next {
            Some(next) => query = query.after(next),
            None => return Ok(()),
        }
    }
    panic!("the listing does not end");
}

/// How long `call` took to fail; `Ok(())` if it did not fail.
async fn timed<T>(
    call: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<(), (Error, Duration)> {
    let asked = Instant::now();
    match call.await {
        Ok(_) => Ok(()),
        Err(error) => Err((error, asked.elapsed())),
    }
}

/// Whether the server answers a PING within 100 ms, on a connection of its own.
async fn answers(client: &redis::Client) -> bool {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(100)))
        .set_response_timeout(Some(Duration::from_millis(100)));
    let Ok(mut conn) = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
    else {
        return false;
    };
    redis::cmd("PING")
        .query_async::<String>(&mut conn)
        .await
        .is_ok()
}

/// `DEBUG SLEEP` freezes the whole server (as a stalled process or a stopped VM would): every
/// call (connect, reserve, complete, release, renew, lookup, list, stats) is a store-unavailable
/// error within the store's timeouts (a reservation resends once after a lost answer, so twice
/// the response timeout), long before Redis wakes up; once it does, the same store, not
/// rebuilt, answers again.
#[tokio::test]
async fn c13_a_frozen_redis_is_an_error_within_the_deadline() {
    const FROZEN: Duration = Duration::from_secs(5);
    let dir = temp_dir();
    let (child, port) = start_on_free_port(&dir, &["--enable-debug-command", "yes"]);
    let _server = Server(child, dir);
    let url = format!("redis://127.0.0.1:{port}");
    let store = RedisStore::builder()
        .response_timeout(Duration::from_millis(300))
        .connection_timeout(Duration::from_millis(300))
        .connect(&url)
        .await
        .expect("connect");
    let idem = Idempotency::with_policy(store.clone(), Policy::default().lease(LEASE))
        .expect("valid policy");
    let consumer = unique_consumer("frozen");
    let mut leases = Vec::new();
    for key in ["to-complete", "to-release", "to-renew"] {
        match store
            .reservation(&request(&consumer, key, b"{}"), LEASE, Deadline::default())
            .await
        {
            Ok(Begin::Acquired(lease)) => leases.push(lease),
            other => panic!("a fresh key is acquired: {other:?}"),
        }
    }
    let [to_complete, to_release, to_renew] = <[_; 3]>::try_from(leases).expect("three leases");

    let client = redis::Client::open(url.as_str()).expect("url");
    let no_timeout = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let mut admin = client
        .get_multiplexed_async_connection_with_config(&no_timeout)
        .await
        .expect("connect");
    let sleep = tokio::spawn(async move {
        redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(FROZEN.as_secs_f64())
            .query_async::<String>(&mut admin)
            .await
    });
    let frozen_at = Instant::now();
    while answers(&client).await {
        assert!(
            frozen_at.elapsed() < FROZEN,
            "DEBUG SLEEP never froze Redis"
        );
    }

    // Every call at once, each timed: none may wait for Redis to wake up.
    let frozen = request(&consumer, "frozen", b"{}");
    let in_progress = ListQuery::in_progress(Duration::ZERO);
    let completion = idem.completion(&to_complete, StoredResponse::new(201, "ok"));
    let asked = Instant::now();
    let connecting = RedisStore::builder()
        .response_timeout(Duration::from_millis(300))
        .connection_timeout(Duration::from_millis(300))
        .connect(&url);
    let (connect, reserve, complete, release, renew, lookup, list, stats) = tokio::join!(
        timed(connecting),
        timed(store.reservation(&frozen, LEASE, Deadline::default())),
        timed(store.complete(&completion, Deadline::default())),
        timed(store.release(&to_release, Deadline::default())),
        timed(store.renew(&to_renew, LEASE, Deadline::default())),
        timed(store.lookup(frozen.id(), Deadline::default())),
        timed(store.list(&in_progress, Deadline::default())),
        timed(store.stats(Deadline::default())),
    );
    for (name, outcome) in [
        ("connect", connect),
        ("reserve", reserve),
        ("complete", complete),
        ("release", release),
        ("renew", renew),
        ("lookup", lookup),
        ("list", list),
        ("stats", stats),
    ] {
        let Err((error, took)) = outcome else {
            panic!("{name}: a frozen Redis answered");
        };
        assert_eq!(
            error.as_store().map(|e| e.kind()),
            Some(StoreErrorKind::Unavailable),
            "{name}: {error}"
        );
        assert!(error.is_retryable(), "{name}: {error}");
        assert!(took < Duration::from_millis(1500), "{name} took {took:?}");
    }
    assert!(asked.elapsed() < FROZEN, "the calls waited for Redis");

    sleep
        .await
        .expect("the DEBUG SLEEP task")
        .expect("DEBUG SLEEP");
    // The reservation sent while Redis slept ran when it woke up (its answer was lost): the key
    // is held by that lease, or free; never an error.
    let again = store.reservation(&frozen, LEASE, Deadline::default()).await;
    assert!(
        matches!(
            again,
            Ok(Begin::Answered(Answer::InFlight { .. }) | Begin::Acquired(_))
        ),
        "{again:?}"
    );
    let fresh = request(&consumer, "after", b"{}");
    assert!(
        matches!(
            store.reservation(&fresh, LEASE, Deadline::default()).await,
            Ok(Begin::Acquired(_))
        ),
        "a fresh key after Redis woke up"
    );
    assert!(
        store
            .lookup(fresh.id(), Deadline::default())
            .await
            .expect("lookup")
            .is_some(),
        "the reservation is stored"
    );
}

/// A call that finds its connection gone reconnects; when Redis is frozen too (a server that
/// stalls right after dropping its clients), the new connection's handshake waits at most the
/// connection timeout, once: the call is an error within the connection and response timeouts,
/// not a chain of reconnection attempts with back-off between them.
#[tokio::test]
async fn c13_a_call_that_must_reconnect_to_a_frozen_redis_is_an_error_within_the_deadline() {
    const FROZEN: Duration = Duration::from_secs(5);
    const TIMEOUT: Duration = Duration::from_millis(300);
    let dir = temp_dir();
    let (child, port) = start_on_free_port(&dir, &["--enable-debug-command", "yes"]);
    let _server = Server(child, dir);
    let url = format!("redis://127.0.0.1:{port}");
    let store = RedisStore::builder()
        .response_timeout(TIMEOUT)
        .connection_timeout(TIMEOUT)
        .connect(&url)
        .await
        .expect("connect");
    let consumer = unique_consumer("reconnect");
    let warm = request(&consumer, "warm", b"{}");
    assert!(matches!(
        store.reservation(&warm, LEASE, Deadline::default()).await,
        Ok(Begin::Acquired(_))
    ));

    let client = redis::Client::open(url.as_str()).expect("url");
    let no_timeout = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let mut admin = client
        .get_multiplexed_async_connection_with_config(&no_timeout)
        .await
        .expect("connect");
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("SKIPME")
        .arg("yes")
        .query_async(&mut admin)
        .await
        .expect("CLIENT KILL");
    assert!(killed >= 1, "the store's connection was cut");
    let sleep = tokio::spawn(async move {
        redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(FROZEN.as_secs_f64())
            .query_async::<String>(&mut admin)
            .await
    });
    let frozen_at = Instant::now();
    while answers(&client).await {
        assert!(
            frozen_at.elapsed() < FROZEN,
            "DEBUG SLEEP never froze Redis"
        );
    }

    // The first call may find the cut connection (an error at once) and start the reconnection;
    // the next ones wait for it.
    for i in 0..3 {
        let id = request(&consumer, &format!("k{i}"), b"{}");
        for (name, bound, outcome) in [
            (
                "lookup",
                2 * TIMEOUT,
                timed(store.lookup(id.id(), Deadline::default())).await,
            ),
            (
                "reserve",
                4 * TIMEOUT,
                timed(store.reservation(&id, LEASE, Deadline::default())).await,
            ),
        ] {
            let Err((error, took)) = outcome else {
                panic!("{name} {i}: a frozen Redis answered");
            };
            assert_eq!(
                error.as_store().map(|e| e.kind()),
                Some(StoreErrorKind::Unavailable),
                "{name} {i}: {error}"
            );
            assert!(
                took < bound + Duration::from_millis(300),
                "{name} {i} took {took:?}: {error}"
            );
        }
    }
    assert!(frozen_at.elapsed() < FROZEN, "the calls waited for Redis");

    sleep
        .await
        .expect("the DEBUG SLEEP task")
        .expect("DEBUG SLEEP");
    let fresh = request(&consumer, "after", b"{}");
    let mut answered = None;
    for _ in 0..20 {
        match store.reservation(&fresh, LEASE, Deadline::default()).await {
            Ok(begin) => {
                answered = Some(begin);
                break;
            }
            Err(error) => {
                assert!(error.is_retryable(), "{error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    assert!(
        matches!(answered, Some(Begin::Acquired(_))),
        "the store reconnected by itself: {answered:?}"
    );
}

/// A deadline of zero would fail every call: refused before connecting, as bad configuration.
#[tokio::test]
async fn c13_a_zero_deadline_is_refused() {
    for builder in [
        RedisStore::builder().response_timeout(Duration::ZERO),
        RedisStore::builder().connection_timeout(Duration::ZERO),
    ] {
        let refused = builder.connect(&common::redis_url()).await.map(|_| ());
        assert!(
            matches!(
                refused,
                Err(Error::InvalidInput {
                    field: Field::Config,
                    ..
                })
            ),
            "{refused:?}"
        );
    }
}

/// A wait for a replica of zero (`WAIT 1 0` waits for ever) or as long as the response
/// timeout (its answer would come after the call's deadline), and Sentinel without a sentinel
/// to ask, are refused before connecting, as bad configuration.
#[tokio::test]
async fn c13_a_replica_wait_without_a_bound_and_sentinel_without_sentinels_are_refused() {
    let refused = [
        RedisStore::builder()
            .wait_for_replica(Some(Duration::ZERO))
            .connect(&common::redis_url())
            .await,
        RedisStore::builder()
            .response_timeout(Duration::from_millis(500))
            .wait_for_replica(Some(Duration::from_millis(500)))
            .connect(&common::redis_url())
            .await,
        RedisStore::builder()
            .connect_sentinel(&[], "mymaster")
            .await,
    ];
    for refused in refused {
        let refused = refused.map(|_| ());
        assert!(
            matches!(
                refused,
                Err(Error::InvalidInput {
                    field: Field::Config,
                    ..
                })
            ),
            "{refused:?}"
        );
    }
}

/// C12: a direct `Store` call with a lease over the engine's bound (`Policy::MAX_LEASE`) is
/// refused before anything is written, never a record left without an expiry; a renewal with
/// one leaves the lease as it was.
#[tokio::test]
async fn c12_a_lease_over_the_bound_writes_nothing() {
    fn refused<T>(got: &Result<T, Error>) -> bool {
        matches!(
            got,
            Err(Error::InvalidInput {
                field: Field::Config,
                ..
            })
        )
    }
    for redis in BOTH {
        let store = redis.store().await;
        let consumer = unique_consumer("long-lease");
        let req = request(&consumer, "k", b"{}");
        let too_long = Policy::MAX_LEASE + Duration::from_millis(1);
        for lease in [too_long, Duration::from_millis(u64::MAX)] {
            let got = store.reservation(&req, lease, Deadline::default()).await;
            assert!(refused(&got), "{got:?}");
            let key = store.key_of(req.id());
            assert!(hash(&redis, &key).await.is_empty(), "nothing written");
        }
        let Begin::Acquired(lease) = store
            .reservation(&req, LEASE, Deadline::default())
            .await
            .expect("reserve")
        else {
            panic!("fresh")
        };
        let got = store.renew(&lease, too_long, Deadline::default()).await;
        assert!(refused(&got), "{got:?}");
        let kept = store.lookup(req.id(), Deadline::default()).await;
        let kept = kept.expect("lookup").expect("the record");
        assert_eq!(kept.deadline(), lease.lease_until(), "the lease as it was");
    }
}

/// An orphan whose deadline field was edited by hand into something that is not a number,
/// its read header left as written: the read (by the header) finds the lease passed and the
/// takeover's compare-and-set reads the field. A field it cannot read is a record it does not
/// know: no takeover, nothing written, and the reservation reports the record corrupt
/// (`CorruptRecord`, C12), as a reservation that reads the fields does; never the script's own
/// failure as a store error.
#[tokio::test]
async fn c12_a_takeover_of_an_orphan_whose_deadline_is_not_a_number_is_corrupt() {
    for redis in BOTH {
        let store = redis.store().await;
        let lease = Duration::from_millis(200);
        let first = Idempotency::with_policy(store.clone(), Policy::default().lease(lease))
            .expect("valid policy");
        let charge = request(&unique_consumer("garbage-deadline"), "k", b"{}");
        let Begin::Acquired(_orphan) = first.begin(&charge).await.expect("begin") else {
            panic!("a fresh key is acquired");
        };
        let key = store.key_of(charge.id());
        let edited: i64 = redis
            .raw(redis::cmd("HSET").arg(&key).arg("dl").arg("soon"))
            .await;
        assert_eq!(edited, 0, "the field existed and was overwritten");
        let before = hash(&redis, &key).await;
        tokio::time::sleep(lease * 2).await;

        // Another process, reading first (its default).
        let taker = Idempotency::with_policy(
            redis
                .connect(RedisStore::builder().prefix(key.split(':').next().expect("prefix")))
                .await,
            Policy::default().lease(lease),
        )
        .expect("valid policy");
        let taken = taker.begin(&charge).await;
        let case = format!("cluster {}", redis.cluster);
        assert!(
            matches!(taken, Err(Error::CorruptRecord(_))),
            "{case}: a takeover of a record whose deadline does not read: {taken:?}"
        );
        assert_eq!(hash(&redis, &key).await, before, "{case}: nothing written");
    }
}
