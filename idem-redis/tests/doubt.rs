//! Records in doubt on Redis beyond the conformance suite (store rules 6 and 7, Operator rule 4;
//! docs/state-machine.md, "Records in doubt"), on one Redis and on the Cluster: a decision is
//! fenced on the token and the mark it read and pushes nothing to the audit trail when it loses;
//! the trail shares its record's hash slot and outlives it; each entry is read for its own
//! retention; a foreign value under the trail's key fails the decision with nothing written; an
//! unreadable mark takes no listing down; a completion without doubt clears a mark.

mod common;

use common::Redis;
use idem_core::store::Deadline;
use idem_core::store::Store;
use idem_core::testing::{request, unique_consumer};
use idem_core::{
    Begin, Error, Failure, FencingToken, Idempotency, Policy, Request, StoredResponse,
};
use idem_ops::reconcile::{Decided, Finding, InDoubt};
use idem_ops::Noted;
use idem_ops::{ListQuery, Listed, Operator};
use idem_redis::redis;
use idem_redis::RedisStore;
use std::time::Duration;

const BOTH: [Redis; 2] = [Redis { cluster: false }, Redis { cluster: true }];

fn engine(store: &RedisStore, policy: Policy) -> Idempotency<RedisStore> {
    Idempotency::with_policy(store.clone(), policy).expect("valid policy")
}

fn policy() -> Policy {
    Policy::default().lease(Duration::from_secs(60))
}

/// Runs `request` to an unknown outcome: its record keeps the key with an answer in doubt (C8).
async fn into_doubt(idem: &Idempotency<RedisStore>, request: &Request) {
    let result = idem
        .run(request, |_ctx| async {
            Err::<StoredResponse, _>(Failure::unknown("the provider timed out").noting("auth 1"))
        })
        .await;
    assert!(result.is_err(), "an unknown outcome: {result:?}");
}

async fn case(idem: &Idempotency<RedisStore>, request: &Request) -> InDoubt {
    idem_ops::reconcile::in_doubt(idem, request.id())
        .await
        .expect("read")
        .expect("the record is in doubt")
}

/// How many elements the audit trail of `request` holds, read behind the store's back.
async fn trail_len(redis: &Redis, store: &RedisStore, request: &Request) -> i64 {
    redis
        .raw(redis::cmd("LLEN").arg(store.audit_key_of(request.id())))
        .await
}

/// The record's fields, read behind the store's back.
async fn fields(redis: &Redis, store: &RedisStore, request: &Request) -> Vec<(String, Vec<u8>)> {
    let mut fields: Vec<(String, Vec<u8>)> = redis
        .raw(redis::cmd("HGETALL").arg(store.key_of(request.id())))
        .await;
    fields.sort();
    fields
}

/// Every page of `query` (a scan's pages may be short or empty before the end).
async fn every_page(store: &RedisStore, query: ListQuery) -> Vec<Listed> {
    let mut query = query.limit(100);
    let mut all = Vec::new();
    for _ in 0..100_000 {
        let page = store.list(&query, Deadline::default()).await.expect("list");
        all.extend(page.records);
        match page.next {
            Some(next) => query = query.after(next),
            None => return all,
        }
    }
    panic!("the listing does not end");
}

/// Store rule 7: a decision applies only while the record carries the token and exactly the
/// mark it was read with; one that lost (another decider changed the mark, or it names another
/// execution) writes nothing, pushes nothing to the audit trail, and the record stays as the
/// winner left it.
#[tokio::test]
async fn c06_a_decision_on_a_mark_that_changed_writes_nothing() {
    for redis in BOTH {
        let store = redis.store().await;
        let idem = engine(&store, policy());
        let charge = request(&unique_consumer("fenced"), "k", b"{}");
        into_doubt(&idem, &charge).await;
        let stale = case(&idem, &charge).await;
        let read = case(&idem, &charge).await;
        assert_eq!(trail_len(&redis, &store, &charge).await, 0);

        let deferred =
            idem_ops::reconcile::resolve(&idem, &read, Finding::still_unknown(), "reconciler a")
                .await
                .expect("resolve");
        assert!(
            matches!(deferred, Some(Decided::StillUnknown { attempt: 1, .. })),
            "{deferred:?}"
        );
        assert_eq!(trail_len(&redis, &store, &charge).await, 1);
        let after_win = fields(&redis, &store, &charge).await;

        let current = case(&idem, &charge).await;
        let mut other_execution = current.clone();
        other_execution.token = FencingToken::generate();
        for (what, loser) in [
            ("a stale mark", &stale),
            ("another token", &other_execution),
        ] {
            for finding in [
                Finding::settled(StoredResponse::new(201, "late")),
                Finding::not_happened(),
                Finding::still_unknown(),
            ] {
                let lost = idem_ops::reconcile::resolve(&idem, loser, finding, "reconciler b")
                    .await
                    .expect("resolve");
                assert_eq!(lost, None, "cluster {}: {what}", redis.cluster);
            }
        }
        assert_eq!(
            trail_len(&redis, &store, &charge).await,
            1,
            "cluster {}: nothing pushed by the losers",
            redis.cluster
        );
        assert_eq!(
            fields(&redis, &store, &charge).await,
            after_win,
            "cluster {}: the record is as the winner left it",
            redis.cluster
        );
        let trail = store
            .reconciliations(charge.id(), Deadline::default())
            .await
            .expect("trail");
        assert_eq!(trail.len(), 1, "{trail:?}");
        assert_eq!(trail[0].by, "reconciler a");
    }
}

/// The audit trail lives in its record's hash slot (one script changes both on a Cluster),
/// outlives its record, and lives as long as its longest-kept entry; each entry is read only
/// for its own retention.
#[tokio::test]
async fn the_trail_shares_its_records_slot_and_keeps_each_entry_for_its_own_retention() {
    for redis in BOTH {
        let store = redis.store().await;
        let charge = request(&unique_consumer("trail"), "k", b"{}");
        let (record_key, trail_key) = (store.key_of(charge.id()), store.audit_key_of(charge.id()));
        assert_eq!(trail_key, format!("{{{record_key}}}:audit"));
        if redis.cluster {
            let slot = |key: &str| redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).clone();
            let record_slot: i64 = redis.raw(&slot(&record_key)).await;
            let trail_slot: i64 = redis.raw(&slot(&trail_key)).await;
            assert_eq!(record_slot, trail_slot);
        }

        let long = engine(&store, policy().audit_retention(Duration::from_secs(3600)));
        let short = engine(&store, policy().audit_retention(Duration::from_secs(1)));
        into_doubt(&long, &charge).await;
        let first = case(&long, &charge).await;
        let deferred =
            idem_ops::reconcile::resolve(&long, &first, Finding::still_unknown(), "kept long")
                .await
                .expect("resolve");
        assert!(
            matches!(deferred, Some(Decided::StillUnknown { .. })),
            "{deferred:?}"
        );
        let second = case(&short, &charge).await;
        let released =
            idem_ops::reconcile::resolve(&short, &second, Finding::not_happened(), "kept short")
                .await
                .expect("resolve");
        assert_eq!(released, Some(Decided::Released));
        assert!(store
            .lookup(charge.id(), Deadline::default())
            .await
            .expect("lookup")
            .is_none());

        let trail = store
            .reconciliations(charge.id(), Deadline::default())
            .await
            .expect("trail");
        let by: Vec<&str> = trail.iter().map(|e| e.by.as_str()).collect();
        assert_eq!(by, ["kept long", "kept short"], "oldest first");
        let ttl: i64 = redis.raw(redis::cmd("PTTL").arg(&trail_key)).await;
        assert!(
            ttl > 3_000_000,
            "the longest-kept entry sets the trail's life: {ttl}"
        );

        tokio::time::sleep(Duration::from_millis(1200)).await;
        let trail = store
            .reconciliations(charge.id(), Deadline::default())
            .await
            .expect("trail");
        let by: Vec<&str> = trail.iter().map(|e| e.by.as_str()).collect();
        assert_eq!(by, ["kept long"], "the short entry's time has passed");
        assert_eq!(trail_len(&redis, &store, &charge).await, 2, "still stored");

        // The trail is a list beside the records: never listed or counted as one.
        assert!(every_page(&store, ListQuery::key("k").expect("key"))
            .await
            .is_empty());
        assert_eq!(
            store
                .stats(Deadline::default())
                .await
                .expect("stats")
                .total(),
            0
        );
    }
}

/// A foreign value under the trail's key (a hand edit) fails the decision before anything is
/// written: the record stays in doubt, as read, and the value stays.
#[tokio::test]
async fn c12_a_foreign_value_under_the_trails_key_fails_the_decision_with_nothing_written() {
    for redis in BOTH {
        let store = redis.store().await;
        let idem = engine(&store, policy());
        let charge = request(&unique_consumer("foreign-trail"), "k", b"{}");
        into_doubt(&idem, &charge).await;
        let read = case(&idem, &charge).await;
        let before = fields(&redis, &store, &charge).await;
        let () = redis
            .raw(
                redis::cmd("SET")
                    .arg(store.audit_key_of(charge.id()))
                    .arg("not a trail"),
            )
            .await;
        let failed =
            idem_ops::reconcile::resolve(&idem, &read, Finding::not_happened(), "operator").await;
        assert!(
            matches!(&failed, Err(Error::CorruptRecord(why)) if why.contains("WRONGTYPE")),
            "cluster {}: {failed:?}",
            redis.cluster
        );
        assert_eq!(fields(&redis, &store, &charge).await, before);
        let read_trail = store
            .reconciliations(charge.id(), Deadline::default())
            .await;
        assert!(
            matches!(read_trail, Err(Error::CorruptRecord(_))),
            "{read_trail:?}"
        );
        let kept: String = redis
            .raw(redis::cmd("GET").arg(store.audit_key_of(charge.id())))
            .await;
        assert_eq!(kept, "not a trail");
    }
}

/// A mark that does not decode (a hand edit, a newer release) takes no listing down: it lists
/// as unreadable, still in doubt and counted, while `inspect` (what a decision reads) says the
/// record is corrupt; an element of the trail that does not parse is corrupt too.
#[tokio::test]
async fn c12_an_unreadable_mark_lists_as_unreadable_and_inspect_says_corrupt() {
    for redis in BOTH {
        let store = redis.store().await;
        let idem = engine(&store, policy());
        let charge = request(&unique_consumer("odd-mark"), "k", b"{}");
        into_doubt(&idem, &charge).await;
        let _: i64 = redis
            .raw(
                redis::cmd("HSET")
                    .arg(store.key_of(charge.id()))
                    .arg("dbt")
                    .arg(b"D\x09garbage".as_slice())
                    .arg("dca")
                    .arg("not a time"),
            )
            .await;
        let listed = every_page(&store, ListQuery::in_doubt()).await;
        let [row] = listed.as_slice() else {
            panic!("the record is still listed in doubt: {listed:?}");
        };
        assert!(matches!(&row.doubt, Some(Noted::Unreadable(_))), "{row:?}");
        assert_eq!(row.check_at, None);
        assert_eq!(
            every_page(&store, ListQuery::due_for_reconciliation())
                .await
                .len(),
            1,
            "a mark without a readable check time is due"
        );
        assert_eq!(
            store
                .stats(Deadline::default())
                .await
                .expect("stats")
                .in_doubt,
            1
        );
        let inspected = store.inspect(charge.id(), Deadline::default()).await;
        assert!(
            matches!(inspected, Err(Error::CorruptRecord(_))),
            "{inspected:?}"
        );

        let _: i64 = redis
            .raw(
                redis::cmd("RPUSH")
                    .arg(store.audit_key_of(charge.id()))
                    .arg("no times here"),
            )
            .await;
        let trail = store
            .reconciliations(charge.id(), Deadline::default())
            .await;
        assert!(matches!(trail, Err(Error::CorruptRecord(_))), "{trail:?}");
    }
}

/// Store rule 6: a completion without doubt clears any mark the record carries (here one
/// written by hand on the reservation), and one in doubt marks the record due at once.
#[tokio::test]
async fn a_completion_without_doubt_clears_a_mark() {
    for redis in BOTH {
        let store = redis.store().await;
        let idem = engine(&store, policy());
        let charge = request(&unique_consumer("clear"), "k", b"{}");
        let Begin::Acquired(lease) = idem.begin(&charge).await.expect("begin") else {
            panic!("a fresh key is acquired");
        };
        let _: i64 = redis
            .raw(
                redis::cmd("HSET")
                    .arg(store.key_of(charge.id()))
                    .arg("dbt")
                    .arg("stale")
                    .arg("dca")
                    .arg("1"),
            )
            .await;
        idem.complete(lease, StoredResponse::new(201, "ok"))
            .await
            .expect("complete");
        let names: Vec<String> = fields(&redis, &store, &charge)
            .await
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        assert!(
            !names.iter().any(|n| n == "dbt" || n == "dca"),
            "cluster {}: {names:?}",
            redis.cluster
        );
        let inspected = store
            .inspect(charge.id(), Deadline::default())
            .await
            .expect("inspect")
            .expect("there");
        assert_eq!((inspected.doubt, inspected.check_at), (None, None));

        let doubtful = request(&unique_consumer("clear"), "d", b"{}");
        into_doubt(&idem, &doubtful).await;
        let inspected = store
            .inspect(doubtful.id(), Deadline::default())
            .await
            .expect("inspect")
            .expect("there");
        let (Some(check_at), Some(completed_at)) =
            (inspected.check_at, inspected.provenance.completed_at)
        else {
            panic!("due for a check when it completed: {inspected:?}");
        };
        assert_eq!(check_at, completed_at);
    }
}
