//! Effects' transactions cut off (C6, C13): a `run_in_transaction` whose caller is gone, or
//! whose budget ends, mid-transaction leaves its connection to roll the transaction back and
//! settle into the store's stack for effects, rather than closing it: nothing of it commits,
//! and under load with short budgets the store keeps serving fresh keys on about as many
//! connections as it has, instead of opening one per cut-off.

mod common;
mod support;

use common::{business_table, charges, insert_charge, pg_url, request, SCHEMA};
use fault_proxy::{Fault, Hold, COMMIT_QUERY};
use idem_core::{Failure, Lease, Reply};
use idem_core::{FencingToken, Idempotency, Outcome, Policy, StoredResponse};
use idem_postgres::sqlx;
use idem_postgres::{PgEffect, PgIdempotency, PgStore, PgStoreBuilder};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::short_budgets::hammer;

/// A store on `url` and a new table, `connections` for its statements and as many for
/// effects, built on `builder`.
async fn store(builder: PgStoreBuilder, url: &str, connections: u32) -> Idempotency<PgStore> {
    let store = builder
        .schema(SCHEMA)
        .table(&a_table())
        .max_connections(connections)
        .acquire_timeout(Duration::from_secs(2))
        .connect(url)
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    business_table(store.pool()).await;
    Idempotency::with_policy(store, Policy::default()).expect("policy")
}

fn a_table() -> String {
    format!("ec_{}", FencingToken::generate())
}

/// The backend of the effect's connection, and one charge for `intent` written by it.
async fn charge_on(tx: &mut sqlx::PgConnection, intent: &str) -> Result<i32, sqlx::Error> {
    sqlx::query("INSERT INTO idem_test.charges (intent) VALUES ($1)")
        .bind(intent)
        .execute(&mut *tx)
        .await?;
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *tx)
        .await
}

/// C6, C13: an effect's completion cut off by the request's store budget (another session
/// holds the record's row): nothing of the transaction commits, its charge included, and the
/// next effect runs on the same session, in a transaction of its own, instead of on a new
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c06_an_effect_cut_off_is_rolled_back_and_its_connection_serves_the_next() {
    let idem = store(PgStore::builder(), &pg_url(), 1).await;
    let table = idem.store().table();
    let run = FencingToken::generate().to_string();
    let (cut, next) = (format!("{run}-cut"), format!("{run}-next"));
    let cut_pid = Arc::new(AtomicI32::new(0));
    let charged = Arc::new(tokio::sync::Notify::new());
    // Once the effect has charged, another session holds the record's row for 800 ms: the
    // completion waits for it past the request's budget.
    let holder = {
        let (pool, charged) = (idem.store().pool().clone(), Arc::clone(&charged));
        let (lock, key) = (
            format!("SELECT 1 FROM {table} WHERE key = $1 FOR UPDATE"),
            cut.clone(),
        );
        tokio::spawn(async move {
            charged.notified().await;
            let mut tx = pool.begin().await.expect("begin");
            let held = sqlx::query(sqlx::AssertSqlSafe(lock))
                .bind(key)
                .fetch_all(&mut *tx)
                .await
                .expect("the record's row");
            assert_eq!(held.len(), 1, "the record's row");
            tokio::time::sleep(Duration::from_millis(800)).await;
            tx.commit().await.expect("commit");
        })
    };
    let asked = request(&idem, &cut).with_store_budget(Duration::from_millis(300));
    let (pid, intent, notify) = (Arc::clone(&cut_pid), cut.clone(), Arc::clone(&charged));
    let outcome = idem
        .run_in_transaction(&asked, move |tx, _| {
            Box::pin(async move {
                pid.store(charge_on(tx, &intent).await?, Ordering::SeqCst);
                notify.notify_one();
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok::<_, sqlx::Error>(StoredResponse::new(201, "charged"))
            })
        })
        .await;
    assert!(
        !matches!(outcome, Ok(Outcome::Executed(_))),
        "completed past its budget: {outcome:?}"
    );
    let cut_pid = cut_pid.load(Ordering::SeqCst);
    assert_ne!(cut_pid, 0, "the effect never charged");
    holder.await.expect("the row's holder");
    // The cut-off completion ends, its transaction is rolled back, the connection settles.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let asked = request(&idem, &next);
    let intent = next.clone();
    let outcome = idem
        .run_in_transaction(&asked, move |tx, _| {
            Box::pin(async move {
                let pid = charge_on(tx, &intent).await?;
                Ok::<_, sqlx::Error>(StoredResponse::new(201, pid.to_string()))
            })
        })
        .await
        .expect("the next effect");
    let Outcome::Executed(response) = outcome else {
        panic!("not executed: {outcome:?}");
    };
    assert_eq!(
        response.body,
        cut_pid.to_string().into_bytes(),
        "a new connection: the cut-off one was closed, not settled"
    );
    let pool = idem.store().pool();
    assert_eq!(charges(pool, &cut).await, 0, "the cut-off effect committed");
    assert_eq!(charges(pool, &next).await, 1);
}

/// Charges `key` once through `run_in_transaction` within `budget`; the answer, printed.
async fn charge(idem: &Idempotency<PgStore>, key: &str, budget: Duration, one: bool) -> String {
    let asked = request(idem, key)
        .with_store_budget(budget)
        .with_one_commit(one);
    let intent = key.to_owned();
    let outcome = idem
        .run_in_transaction(&asked, move |tx, _| insert_charge(tx, intent))
        .await;
    format!("{outcome:?}")
}

/// C8: a COMMIT held on its way past the request's budget, then let through by the settling
/// connection that sent it: the first call is answered in doubt, retries meanwhile never run
/// the effect again, and once the COMMIT lands a retry replays the one charge, with one commit
/// (C15) or two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c08_a_commit_held_on_its_way_charges_once() {
    for one in [false, true] {
        let (proxy, through) = support::proxied(&pg_url()).await;
        let idem = store(PgStore::builder(), &through, 2).await;
        let key = format!("{}-held", FencingToken::generate());
        // Connections opened first: the held call's budget is spent on its COMMIT alone.
        let warm = charge(&idem, &format!("{key}-warm"), Duration::from_secs(2), one).await;
        assert!(warm.contains("Executed"), "{warm}");
        proxy.set(Fault::from(Hold::to(COMMIT_QUERY)));
        let first = charge(&idem, &key, Duration::from_millis(500), one).await;
        assert!(first.contains("InDoubt"), "one commit {one}: {first}");
        for _ in 0..3 {
            let again = charge(&idem, &key, Duration::from_millis(300), one).await;
            assert!(!again.contains("Executed"), "one commit {one}: {again}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        proxy.set(Fault::PassThrough);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = charge(&idem, &key, Duration::from_secs(2), one).await;
        assert!(after.contains("Replay"), "one commit {one}: {after}");
        assert_eq!(
            charges(idem.store().pool(), &key).await,
            1,
            "one commit {one}"
        );
    }
}

/// Whether another session can take the advisory lock `key` (given back at once if so).
async fn lock_free(pool: &sqlx::PgPool, key: i64) -> bool {
    let mut conn = pool.acquire().await.expect("a pool connection");
    let free: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(key)
        .fetch_one(&mut *conn)
        .await
        .expect("try the lock");
    if free {
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(key)
            .execute(&mut *conn)
            .await
            .expect("unlock");
    }
    free
}

/// How an effect that holds an advisory lock ends before it gives it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// It panics.
    Panics,
    /// It runs past the transaction timeout.
    Abandoned,
    /// Its caller is dropped while it runs (the guard form has no task to finish it).
    Dropped,
}

/// An effect that takes the advisory lock `key` and gives it back 3 s later, unless `cut`
/// panics first.
fn locking(key: i64, cut: Cut) -> PgEffect<sqlx::Error> {
    Box::new(move |tx: &mut sqlx::PgConnection, _: &Lease| {
        Box::pin(async move {
            sqlx::query("SELECT pg_advisory_lock($1)")
                .bind(key)
                .execute(&mut *tx)
                .await?;
            assert!(cut != Cut::Panics, "a bug in the effect");
            tokio::time::sleep(Duration::from_secs(3)).await;
            sqlx::query("SELECT pg_advisory_unlock($1)")
                .bind(key)
                .execute(&mut *tx)
                .await?;
            Ok(StoredResponse::new(201, "charged"))
        })
    })
}

/// C13: an effect that panics, runs past the transaction timeout, or is dropped while it runs,
/// its session holding what no rollback undoes (an advisory lock it would have given back at
/// its end): its connection is closed, never settled back for the next effect, so the lock
/// is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_an_effect_cut_off_while_it_ran_never_passes_its_session_on() {
    let builder = PgStore::builder().transaction_timeout(Duration::from_secs(1));
    let idem = store(builder, &pg_url(), 1).await;
    for cut in [Cut::Panics, Cut::Abandoned, Cut::Dropped] {
        let token = FencingToken::generate();
        let key = i64::from_le_bytes(token.as_bytes()[..8].try_into().expect("8 bytes"));
        let asked = request(&idem, &format!("{token}"));
        let engine = idem.clone();
        let ran = tokio::spawn(async move {
            if cut != Cut::Dropped {
                return format!(
                    "{:?}",
                    engine.run_in_transaction(&asked, locking(key, cut)).await
                );
            }
            // The guard form, through the engine's execution: its transaction dropped 300 ms
            // into the effect.
            let outcome = engine
                .run(&asked, move |ctx| async move {
                    let transaction = ctx
                        .idem()
                        .complete_transaction(&ctx.lease(), locking(key, cut));
                    let cut = tokio::time::timeout(Duration::from_millis(300), transaction).await;
                    assert!(cut.is_err(), "the effect ran to its end");
                    Err::<Reply, _>(Failure::nothing_happened("dropped"))
                })
                .await;
            format!("{outcome:?}")
        })
        .await;
        match (cut, ran) {
            (Cut::Panics, Err(panicked)) => assert!(panicked.is_panic(), "{panicked:?}"),
            (Cut::Abandoned, Ok(outcome)) => assert!(outcome.contains("InDoubt"), "{outcome}"),
            (Cut::Dropped, Ok(outcome)) => assert!(outcome.contains("Released"), "{outcome}"),
            (cut, ran) => panic!("{cut:?}: {ran:?}"),
        }
        // Past the effect's own end, and the host's share a settling connection waits.
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        assert!(
            lock_free(idem.store().pool(), key).await,
            "{cut:?}: the effect's session still holds its lock"
        );
    }
}

/// C13: 32 callers with budgets of 80 – 110 ms running fresh keys through
/// `run_in_transaction` on 8 connections, through a proxy that counts the connections opened.
/// On a loaded machine (a debug build, four busy loops beside it), closing each cut-off
/// effect's connection opened 218 – 375 connections in 3 s and served 69 – 758; settling them,
/// 18 – 74 and 706 – 1 723.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_short_budgets_on_fresh_keys_are_served_without_a_reconnection_storm() {
    let (proxy, through) = support::proxied(&pg_url()).await;
    let idem = store(PgStore::builder(), &through, 8).await;
    hammer(&idem, &proxy, 80, |idem, key, budget| async move {
        let asked = request(&idem, &key).with_store_budget(budget);
        let outcome = idem
            .run_in_transaction(&asked, move |tx, _| {
                Box::pin(async move {
                    sqlx::query("SELECT 1").execute(&mut *tx).await?;
                    Ok::<_, sqlx::Error>(StoredResponse::new(201, "charged"))
                })
            })
            .await;
        matches!(outcome, Ok(Outcome::Executed(_)))
    })
    .await
    .assert_at_least_served_at_most_opened(300, 150);
}
