//! The replay cache across a failover behind PgBouncer (C7, C13): docs/architecture.md says
//! the cache is emptied when the store's generation moves, and that PostgreSQL's counts "a new
//! server start time (a restart, a failover, behind PgBouncer too)". The start time is read
//! only by the reservation's statements; every other store call that succeeds (a purge, a
//! completion, a renewal, a release, an announcement) confirms the old generation, and the
//! cache keeps answering from before the failover records the new primary never had, while
//! the store holds another answer for the same key.

mod common;
mod support;

use idem_core::StoredResponse;
use idem_core::{Answer, Begin, FencingToken, Idempotency, Outcome, Policy, ReplayCache};
use idem_postgres::sqlx::{self, AssertSqlSafe};
use idem_postgres::{PgIdempotency, PgStore, StatementMode};
use std::time::Duration;
use support::pg_pair::PgPair;
use support::private_bouncer::PrivateBouncer;

async fn store(url: &str, table: &str) -> PgStore {
    PgStore::builder()
        .table(table)
        .max_connections(2)
        .statements(StatementMode::Simple)
        .change_feed(false)
        .acquire_timeout(Duration::from_secs(2))
        .connect(url)
        .await
        .expect("connect through the pooler")
}

fn policy() -> Policy {
    Policy::default().store_timeout(Duration::from_secs(2))
}

async fn charge(idem: &Idempotency<PgStore>, key: &str) -> Outcome {
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some(key))
        .body(b"{\"cents\":2500}")
        .build()
        .expect("request");
    idem.run_in_transaction(&request, |tx, _lease| {
        Box::pin(async move {
            let (id,): (i64,) = sqlx::query_as(AssertSqlSafe(
                "INSERT INTO cache_charges DEFAULT VALUES RETURNING id",
            ))
            .fetch_one(&mut *tx)
            .await?;
            Ok::<_, sqlx::Error>(StoredResponse::new(201, format!("charge {id} by a")))
        })
    })
    .await
    .expect("charged")
}

fn body(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Executed(r) | Outcome::Answered(Answer::Replay(r)) => {
            String::from_utf8_lossy(&r.body).into_owned()
        }
        other => format!("{other:?}"),
    }
}

/// C7, C13: after a failover behind the pooler that lost a completion, the cache never
/// replays it once the store holds another answer for the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c07_c13_the_replay_cache_forgets_a_failover_behind_a_pooler() {
    let pair = PgPair::start_async().await;
    let bouncer = PrivateBouncer::start(&PgPair::url(pair.primary_port), "postgres", 4).await;
    let table = format!("c_{}", FencingToken::generate());
    let cached = store(bouncer.url(), &table).await;
    cached.migrate().await.expect("migrate");
    sqlx::raw_sql("CREATE TABLE cache_charges (id bigserial PRIMARY KEY)")
        .execute(cached.pool())
        .await
        .expect("the charges table");
    let a = Idempotency::builder(cached)
        .policy(policy())
        .replay_cache(ReplayCache::new(1_000, 1 << 20))
        .build()
        .expect("engine with a cache");
    // Wait for the standby to have the tables.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The standby stops; the first charge of the key commits on the primary only.
    pair.stop_standby().await;
    let key = "lost-in-the-failover";
    let first = charge(&a, key).await;
    assert!(matches!(first, Outcome::Executed(_)), "{first:?}");
    let again = charge(&a, key).await;
    assert_eq!(body(&again), body(&first), "replayed");

    // The primary dies; the standby, which never had the charge, is promoted at its address.
    pair.kill_primary().await;
    pair.promote_standby_at_the_primary_s_address().await;

    // Another process (an engine without a cache) charges the key on the new primary.
    let b = Idempotency::with_policy(store(bouncer.url(), &table).await, policy()).expect("b");
    let mut other = None;
    for _ in 0..50 {
        match b
            .run_in_transaction(
                &b.request("acct", "POST", "/charges")
                    .key(Some(key))
                    .body(b"{\"cents\":2500}")
                    .build()
                    .expect("request"),
                |tx, _lease| {
                    Box::pin(async move {
                        let (id,): (i64,) = sqlx::query_as(AssertSqlSafe(
                            "INSERT INTO cache_charges DEFAULT VALUES RETURNING id",
                        ))
                        .fetch_one(&mut *tx)
                        .await?;
                        Ok::<_, sqlx::Error>(StoredResponse::new(201, format!("charge {id} by b")))
                    })
                },
            )
            .await
        {
            Ok(outcome) => {
                other = Some(outcome);
                break;
            }
            Err(error) => {
                eprintln!("b: {error:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let other = other.expect("charged by the other process");
    eprintln!(
        "first {}, the other process after the failover: {other:?}",
        body(&first)
    );

    // More than a second without a store call of the cached process: its cache would ask the
    // store again. It purges expired records (operations.md: periodically), then a client
    // retries the key there.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut purged = Err(None);
    for _ in 0..50 {
        match a.purge_expired().await {
            Ok(n) => {
                purged = Ok(n);
                break;
            }
            Err(e) => {
                purged = Err(Some(e));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    eprintln!("purge on the new primary: {purged:?}");
    let request = a
        .request("acct", "POST", "/charges")
        .key(Some(key))
        .body(b"{\"cents\":2500}")
        .build()
        .expect("request");
    let retry = a.begin(&request).await.expect("begin");
    let answered = match &retry {
        Begin::Answered(Answer::Replay(r)) => String::from_utf8_lossy(&r.body).into_owned(),
        other => format!("{other:?}"),
    };
    eprintln!("retry on the cached process: {answered}");
    assert_eq!(
        answered,
        body(&other),
        "the retry is answered what the store holds ({}), not the answer the failover lost \
         ({})",
        body(&other),
        body(&first)
    );
}
