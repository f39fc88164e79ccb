//! What the conformance suite cannot see of a Redis listing (store rule 6): the scan finds a
//! prefix's own keys and no other's, whatever glob characters the prefix holds; records written
//! before reservation times were kept list without one; pages stay within their limit while the
//! listing covers every record; bodies never travel; a record that does not decode is an error.
//! On one Redis and on the Cluster, except where a test needs a server of its own.

mod common;

use common::{start_on_free_port, temp_dir, Redis, Server};
use idem_core::store::Deadline;
use idem_core::store::Store;
use idem_core::testing::{request, request_on, unique_consumer};
use idem_core::{Begin, Error, FencingToken, Idempotency, Policy, RecordId, StoredResponse};
use idem_ops::{ListQuery, Listed, ListedState, Operator};
use idem_redis::redis;
use idem_redis::RedisStore;
use std::collections::HashSet;
use std::time::Duration;

const BOTH: [Redis; 2] = [Redis { cluster: false }, Redis { cluster: true }];

fn engine(store: &RedisStore) -> Idempotency<RedisStore> {
    let policy = Policy::default().lease(Duration::from_secs(3600));
    Idempotency::with_policy(store.clone(), policy).expect("valid policy")
}

/// Reserves `key` of `consumer` and leaves it in progress.
async fn reserve(store: &RedisStore, consumer: &str, key: &str) -> RecordId {
    let request = request(consumer, key, b"{}");
    match engine(store).begin(&request).await.expect("begin") {
        Begin::Acquired(_lease) => request.id().clone(),
        other => panic!("expected to acquire, got {other:?}"),
    }
}

/// Completes `key` of `consumer` on `route` with `response`.
async fn complete(
    store: &RedisStore,
    consumer: &str,
    route: &str,
    key: &str,
    response: StoredResponse,
) -> RecordId {
    let idem = engine(store);
    let request = request_on(consumer, route, key, b"{}");
    match idem.begin(&request).await.expect("begin") {
        Begin::Acquired(lease) => {
            idem.complete(lease, response).await.expect("complete");
        }
        other => panic!("expected to acquire, got {other:?}"),
    }
    request.id().clone()
}

/// Every page of `query`, checking that none exceeds `limit` and that the listing ends; the
/// first error stops it. (One call scans a bounded part of a server shared with other tests, so
/// only the whole listing is sure to meet a given record.)
async fn try_every_page(
    store: &RedisStore,
    query: ListQuery,
    limit: usize,
) -> Result<Vec<Listed>, Error> {
    let mut query = query.limit(limit);
    let mut all = Vec::new();
    for _ in 0..100_000 {
        let page = store.list(&query, Deadline::default()).await?;
        assert!(
            page.records.len() <= limit,
            "{} > {limit}",
            page.records.len()
        );
        all.extend(page.records);
        match page.next {
            Some(next) => query = query.after(next),
            None => return Ok(all),
        }
    }
    panic!("the listing does not end");
}

async fn every_page(store: &RedisStore, query: ListQuery, limit: usize) -> Vec<Listed> {
    try_every_page(store, query, limit).await.expect("list")
}

fn in_progress() -> ListQuery {
    ListQuery::in_progress(Duration::ZERO)
}

#[tokio::test]
async fn a_prefix_with_glob_characters_lists_its_own_records_only() {
    for redis in BOTH {
        let token = FencingToken::generate();
        // Unescaped, `t…*:*` would match every other prefix here, and `t…[ab]:*`, `t…?\:*`
        // would not even match their own keys.
        let prefixes = [
            format!("t{token}*"),
            format!("t{token}[ab]"),
            format!("t{token}a"),
            format!("t{token}?\\"),
            format!("t{token}a:x"),
        ];
        let consumer = unique_consumer("glob");
        let mut stores = Vec::new();
        for (i, prefix) in prefixes.iter().enumerate() {
            let store = redis.connect(RedisStore::builder().prefix(prefix)).await;
            reserve(&store, &consumer, &format!("k{i}")).await;
            stores.push(store);
        }
        for (i, store) in stores.iter().enumerate() {
            let listed = every_page(store, in_progress(), 100).await;
            let keys: Vec<&str> = listed.iter().map(|r| r.id.key()).collect();
            assert_eq!(keys, [format!("k{i}")], "prefix {:?}", prefixes[i]);
            assert_eq!(
                store
                    .stats(Deadline::default())
                    .await
                    .expect("stats")
                    .total(),
                1
            );
        }
    }
}

#[tokio::test]
async fn a_record_written_before_reservation_times_lists_without_one() {
    for redis in BOTH {
        let store = redis.store().await;
        let consumer = unique_consumer("old");
        let old = reserve(&store, &consumer, "old").await;
        reserve(&store, &consumer, "new").await;
        let done = complete(
            &store,
            &consumer,
            "POST /charges",
            "done",
            StoredResponse::new(201, "ok"),
        )
        .await;
        for id in [&old, &done] {
            let removed: i64 = redis
                .raw(redis::cmd("HDEL").arg(store.key_of(id)).arg("at"))
                .await;
            assert_eq!(removed, 1, "the record had its reservation time");
        }

        let aged = every_page(
            &store,
            ListQuery::in_progress(Duration::from_secs(3600)),
            10,
        )
        .await;
        assert_eq!(aged.len(), 1, "only the record without a time: {aged:?}");
        assert_eq!(aged[0].id, old);
        assert_eq!(aged[0].reserved_at, None);
        let all = every_page(&store, in_progress(), 10).await;
        assert_eq!(all.len(), 2, "{all:?}");
        assert!(all
            .iter()
            .any(|r| r.id.key() == "new" && r.reserved_at.is_some()));

        let completed =
            every_page(&store, ListQuery::completed(&consumer).expect("valid"), 10).await;
        assert_eq!(completed.len(), 1, "{completed:?}");
        assert_eq!(completed[0].id, done);
        assert_eq!(completed[0].reserved_at, None);
        assert!(matches!(
            completed[0].state,
            ListedState::Completed { status: 201, .. }
        ));

        let stats = store.stats(Deadline::default()).await.expect("stats");
        assert_eq!((stats.in_progress, stats.completed), (2, 1), "{stats:?}");
        let oldest = stats.oldest_in_progress.expect("the new record has a time");
        assert!(oldest <= stats.now, "{stats:?}");
    }
}

#[tokio::test]
async fn pages_stay_within_their_limit_and_the_listing_covers_every_record() {
    for redis in BOTH {
        let store = redis.store().await;
        let consumer = unique_consumer("many");
        let mut expected = HashSet::new();
        for i in 0..250 {
            let key = format!("k{i:03}");
            reserve(&store, &consumer, &key).await;
            expected.insert(key);
        }
        let listed = every_page(&store, in_progress(), 7).await;
        let keys: HashSet<String> = listed.iter().map(|r| r.id.key().to_owned()).collect();
        assert_eq!(keys, expected, "every record, once or more");
        assert!(listed.iter().all(|r| r.id.consumer() == consumer));
        let none = every_page(&store, ListQuery::completed(&consumer).expect("valid"), 7).await;
        assert!(none.is_empty(), "{none:?}");
        assert_eq!(
            store
                .stats(Deadline::default())
                .await
                .expect("stats")
                .in_progress,
            250,
            "cluster: {}",
            redis.cluster
        );
    }
}

#[tokio::test]
async fn a_listing_never_transfers_a_body() {
    let dir = temp_dir();
    let (child, port) = start_on_free_port(&dir, &[]);
    let _server = Server(child, dir);
    let url = format!("redis://127.0.0.1:{port}");
    let store = RedisStore::connect(&url).await.expect("connect");
    let consumer = unique_consumer("body");
    let body = vec![b'x'; 4 << 20];
    complete(
        &store,
        &consumer,
        "POST /uploads",
        "big",
        StoredResponse::new(207, body),
    )
    .await;
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let sent = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut conn = conn.clone();
        async move {
            let info: String = redis::cmd("INFO")
                .arg("stats")
                .query_async(&mut conn)
                .await
                .expect("info");
            info.lines()
                .find_map(|line| line.strip_prefix("total_net_output_bytes:"))
                .and_then(|n| n.trim().parse::<u64>().ok())
                .expect("total_net_output_bytes")
        }
    };

    let before = sent(&mut conn).await;
    let listed = every_page(&store, ListQuery::completed(&consumer).expect("valid"), 10).await;
    let stats = store.stats(Deadline::default()).await.expect("stats");
    let after = sent(&mut conn).await;
    assert!(matches!(
        listed.as_slice(),
        [Listed {
            state: ListedState::Completed { status: 207, .. },
            ..
        }]
    ));
    assert_eq!(stats.completed, 1);
    assert!(
        after - before < 64 * 1024,
        "{} bytes sent for a listing of one 4 MiB body",
        after - before
    );
}

#[tokio::test]
async fn a_record_that_does_not_decode_is_a_corrupt_record() {
    for redis in BOTH {
        for (field, value) in [
            ("st", b"9".as_slice()),
            ("v", b"2".as_slice()),
            ("dl", b"soon".as_slice()),
            ("id", b"someone\0POST /charges\0else".as_slice()),
            ("id", b"no triple".as_slice()),
        ] {
            let store = redis.store().await;
            let consumer = unique_consumer("corrupt");
            let id = reserve(&store, &consumer, "k").await;
            let changed: i64 = redis
                .raw(
                    redis::cmd("HSET")
                        .arg(store.key_of(&id))
                        .arg(field)
                        .arg(value),
                )
                .await;
            assert_eq!(changed, 0, "{field} existed and was overwritten");
            for query in [
                in_progress(),
                ListQuery::completed(&consumer).expect("valid"),
            ] {
                let selection = query.selection().clone();
                let listed = try_every_page(&store, query, 100).await;
                assert!(
                    matches!(listed, Err(Error::CorruptRecord(_))),
                    "{field}={value:?} on {selection:?}: {listed:?}"
                );
            }
            let stats = store.stats(Deadline::default()).await;
            assert!(matches!(stats, Err(Error::CorruptRecord(_))), "{stats:?}");
        }
    }
}

#[tokio::test]
async fn a_completed_record_without_a_response_is_a_corrupt_record() {
    for redis in BOTH {
        let store = redis.store().await;
        let consumer = unique_consumer("noresp");
        let id = complete(
            &store,
            &consumer,
            "POST /charges",
            "k",
            StoredResponse::new(201, "ok"),
        )
        .await;
        let removed: i64 = redis
            .raw(redis::cmd("HDEL").arg(store.key_of(&id)).arg("resp"))
            .await;
        assert_eq!(removed, 1);
        let query = ListQuery::completed(&consumer).expect("valid");
        let listed = try_every_page(&store, query, 100).await;
        assert!(matches!(listed, Err(Error::CorruptRecord(_))), "{listed:?}");
    }
}

/// A cursor is input: one that carries more leftover keys than a page ever leaves is refused,
/// and one within the bound is read a step at a time, so no call reads an unbounded number of
/// keys whatever cursor it is handed.
#[tokio::test]
async fn a_call_reads_a_bounded_number_of_keys_whatever_the_cursor_carries() {
    let store = RedisStore::builder()
        .prefix(&format!("bounded{}", FencingToken::generate()))
        .connect(&common::redis_url())
        .await
        .expect("connect");
    let cursor = |leftovers: usize| {
        let digest = "ab".repeat(32);
        let mut text = String::from("s.0");
        for _ in 0..leftovers {
            text.push('.');
            text.push_str(&digest);
        }
        idem_ops::Cursor::new(text)
    };
    let huge = ListQuery::in_progress(Duration::ZERO)
        .limit(1)
        .after(cursor(200_000));
    assert!(matches!(
        store.list(&huge, Deadline::default()).await,
        Err(Error::InvalidInput { .. })
    ));
    // 10 000 leftovers, none of them a record: each call reads a few steps' worth and hands
    // the rest on.
    let mut query = ListQuery::in_progress(Duration::ZERO)
        .limit(1)
        .after(cursor(10_000));
    let mut calls = 0;
    loop {
        let page = store.list(&query, Deadline::default()).await.expect("list");
        calls += 1;
        match page.next {
            Some(next) => query = query.after(next),
            None => break,
        }
        assert!(calls < 10_000, "the listing does not end");
    }
    assert!(calls >= 10_000 / (8 * 10), "{calls} calls read 10 000 keys");
}

/// The engine's own reads never look at what is kept for operators: a holder of a future
/// format, or a hostile one, neither turns a completion that landed into `LeaseLost` nor takes
/// a listing or the counts down; the record lists with its holder unreadable (bounded) and
/// `inspect` shows the same.
#[tokio::test]
async fn an_unreadable_holder_changes_no_decision_and_takes_no_listing_down() {
    use idem_ops::Noted;
    for redis in BOTH {
        let store = redis.store().await;
        let consumer = unique_consumer("holder");
        let idem = engine(&store);
        let req = request(&consumer, "odd-holder", b"{}");
        let Begin::Acquired(lease) = idem.begin(&req).await.expect("begin") else {
            panic!("a fresh key is acquired");
        };
        let hostile = format!("h2 {}", "\u{1b}[2J".repeat(5_000));
        // A reservation time that does not read is unknown, not an error, as the holder.
        let _: i64 = redis
            .raw(
                redis::cmd("HSET")
                    .arg(store.key_of(req.id()))
                    .arg("at")
                    .arg("-1"),
            )
            .await;
        let _: i64 = redis
            .raw(
                redis::cmd("HSET")
                    .arg(store.key_of(req.id()))
                    .arg("h")
                    .arg(&hostile),
            )
            .await;
        let in_flight = store
            .lookup(req.id(), Deadline::default())
            .await
            .expect("a protocol read");
        assert!(in_flight.is_some_and(|r| r.is_in_progress()));
        let pending = every_page(&store, in_progress(), 10).await;
        let row = pending
            .iter()
            .find(|r| &r.id == req.id())
            .expect("the record is still listed");
        let Noted::Unreadable(why) = &row.holder else {
            panic!("an unreadable holder: {row:?}");
        };
        assert!(why.len() < 400, "bounded: {why}");
        store
            .stats(Deadline::default())
            .await
            .expect("counts despite the holder");
        idem.complete(lease, StoredResponse::new(201, "ok"))
            .await
            .expect("the completion lands whatever the holder");
        let inspected = store
            .inspect(req.id(), Deadline::default())
            .await
            .expect("inspect")
            .expect("there");
        assert!(inspected.record.is_completed());
        assert!(matches!(inspected.provenance.holder, Noted::Unreadable(_)));
    }
}

/// C11 across processes: a takeover by another process (a second store on the same prefix with
/// another holder) records the taker and a later time; a start over after the retention clears
/// the completion time and records the new holder.
#[tokio::test]
async fn c11_a_takeover_by_another_process_records_the_taker() {
    for redis in BOTH {
        let prefix = format!("t{}", FencingToken::generate());
        let first = redis.connect(RedisStore::builder().prefix(&prefix)).await;
        let other = idem_ops::Holder::new("web-2.example", 4242, 7, Some(99));
        let second = redis
            .connect(RedisStore::builder().prefix(&prefix).holder(other.clone()))
            .await;
        idem_ops::testing::c11_a_takeover_and_a_start_over_record_the_new_holder(
            first, second, &other,
        )
        .await;
    }
}
