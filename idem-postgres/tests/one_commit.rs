//! One commit (C15) on a real server, beyond the shared scenarios: what a fresh key costs in
//! commits, measured in the server's write-ahead log, and duplicates from another store (its own
//! pool, as another process has) while the one transaction is open, also from an engine
//! expecting fresh keys (its reservations send `insert.sql` alone first, C4).

mod common;

use common::{
    bouncer_url, business_table, charges, expecting_fresh_keys, insert_charge, pg_url, store_on,
    SCHEMA,
};
use idem_core::store::Deadline;
use idem_core::{Answer, Begin, FencingToken, Idempotency, Outcome, Request};
use idem_core::{RunError, StoredResponse};
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool, Row};
use idem_postgres::{Isolation, PgIdempotency, PgStore, StatementMode};
use std::time::Duration;
use tokio::sync::oneshot;

/// What "at once" means here: a duplicate that waited for the open transaction would wait
/// until the test lets it go, far longer.
const AT_ONCE: Duration = Duration::from_secs(2);

async fn store(table: &str) -> PgStore {
    let store = PgStore::builder()
        .schema(SCHEMA)
        .table(table)
        .max_connections(4)
        .connect(&pg_url())
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    business_table(store.pool()).await;
    store
}

fn request(idem: &Idempotency<PgStore>, key: &str, body: &[u8]) -> Request {
    idem.request("acct_once", "POST", "/charges")
        .key(Some(key))
        .body(body)
        .build()
        .expect("request")
}

/// Runs `request` in one commit if `one_commit`, else two, its effect one business row for `intent`.
async fn charge(
    idem: &Idempotency<PgStore>,
    request: &Request,
    intent: &str,
    one_commit: bool,
) -> Result<Outcome, RunError<sqlx::Error>> {
    let intent = intent.to_owned();
    match one_commit {
        true => {
            idem.run_in_transaction(&request.clone().with_one_commit(true), move |tx, _| {
                insert_charge(tx, intent)
            })
            .await
        }
        false => {
            idem.run_in_transaction(request, move |tx, _| insert_charge(tx, intent))
                .await
        }
    }
}

/// The server's write-ahead log position now.
async fn wal_position(pool: &PgPool) -> String {
    let row = sqlx::query("SELECT pg_current_wal_insert_lsn()::text")
        .fetch_one(pool)
        .await
        .expect("lsn");
    row.try_get(0).expect("an lsn")
}

/// How many transactions committed since `from` (a WAL position) that wrote the store's
/// table: the COMMIT records of the log whose transaction logged a heap change on the table's
/// file. Other tests' transactions write other tables, and are not counted.
async fn commits_writing(pool: &PgPool, table: &str, from: &str) -> i64 {
    let query = format!(
        "WITH log AS (SELECT * FROM pg_get_wal_records_info_till_end_of_wal('{from}'::pg_lsn)), \
         writers AS (SELECT DISTINCT xid FROM log WHERE resource_manager LIKE 'Heap%' \
                     AND block_ref LIKE '%/' || pg_relation_filenode('{SCHEMA}.\"{table}\"') || ' %') \
         SELECT count(*) FROM log WHERE resource_manager = 'Transaction' \
                AND record_type = 'COMMIT' AND xid IN (SELECT xid FROM writers)"
    );
    let row = sqlx::raw_sql(AssertSqlSafe(query))
        .fetch_one(pool)
        .await
        .expect("the log's commits");
    row.try_get(0).expect("a count")
}

/// C15: a fresh key through one-commit `run_in_transaction` is one commit that writes the record
/// (reservation and completion in it), where `run_in_transaction` makes two (the reservation,
/// then the effect with its completion), read from the server's write-ahead log.
#[tokio::test]
async fn c15_a_fresh_key_costs_one_commit_and_two_with_two_commits() {
    let table = format!("once_{}", FencingToken::generate());
    let store = store(&table).await;
    // pg_walinspect reads the log (PostgreSQL 15+, a superuser's extension).
    let mut tx = store.pool().begin().await.expect("begin");
    sqlx::raw_sql(
        "SELECT pg_advisory_xact_lock(4243); CREATE EXTENSION IF NOT EXISTS pg_walinspect",
    )
    .execute(&mut *tx)
    .await
    .expect("pg_walinspect");
    tx.commit().await.expect("commit");
    let idem = Idempotency::new(store.clone());
    for (one_commit, expected) in [(true, 1), (false, 2)] {
        let key = format!("{one_commit}-{}", FencingToken::generate());
        let req = request(&idem, &key, b"{}");
        let from = wal_position(store.pool()).await;
        let outcome = charge(&idem, &req, &key, one_commit).await;
        assert!(matches!(outcome, Ok(Outcome::Executed(_))), "{outcome:?}");
        assert_eq!(
            commits_writing(store.pool(), &table, &from).await,
            expected,
            "{one_commit}: commits that wrote the record"
        );
        assert_eq!(charges(store.pool(), &key).await, 1);
    }
}

/// C5, C3, C15: while a one-commit execution's transaction is open (its reservation not
/// committed), duplicates through another store over the same table (its own pool) are
/// answered at once, never wait for it: in flight for the same request, mismatch for another
/// body, through one-commit `run_in_transaction`, `run_in_transaction` and `begin` (the two-commit
/// reservation) alike. After the commit, both stores replay; one business row.
#[tokio::test]
async fn c05_another_store_is_answered_at_once_while_one_commit_runs() {
    another_store_while_one_commit_runs(false).await;
}

/// C5, C4, C15: the same with the other engine expecting fresh keys: each of its reservations
/// sends the insert alone first, which never waits for the holder (the gate).
#[tokio::test]
async fn c05_c04_expecting_fresh_keys_another_store_is_answered_at_once_while_one_commit_runs() {
    another_store_while_one_commit_runs(true).await;
}

/// The other engine is brought back into expecting fresh keys before each of its calls
/// (answers move it out) when `warm`.
async fn another_store_while_one_commit_runs(warm: bool) {
    let table = format!("once_{}", FencingToken::generate());
    let (here, there) = (store(&table).await, store(&table).await);
    let (idem, other) = (Idempotency::new(here.clone()), Idempotency::new(there));
    let warm_up = || async {
        if warm {
            expecting_fresh_keys(&other).await;
        }
    };
    let intent = format!("two-stores-{}", FencingToken::generate());
    let req = request(&idem, &intent, b"{\"cents\":1}");
    let other_body = request(&other, &intent, b"{\"cents\":2}");
    let same = request(&other, &intent, b"{\"cents\":1}");

    let (started, on_start) = oneshot::channel::<()>();
    let (go, on_go) = oneshot::channel::<()>();
    let (engine, owned, held_intent) = (idem.clone(), req.clone(), intent.clone());
    let first = tokio::spawn(async move {
        engine
            .run_in_transaction(&owned.clone().with_one_commit(true), move |tx, _| {
                Box::pin(async move {
                    sqlx::query("INSERT INTO idem_test.charges (intent) VALUES ($1)")
                        .bind(held_intent)
                        .execute(&mut *tx)
                        .await?;
                    let _ = started.send(());
                    let _ = on_go.await;
                    Ok::<_, sqlx::Error>(StoredResponse::new(201, "held"))
                })
            })
            .await
    });
    on_start.await.expect("the effect started");

    for one_commit in [true, false] {
        warm_up().await;
        let answer =
            tokio::time::timeout(AT_ONCE, charge(&other, &same, &intent, one_commit)).await;
        assert!(
            matches!(answer, Ok(Ok(Outcome::Answered(Answer::InFlight { .. })))),
            "{one_commit}: a duplicate was not in flight at once: {answer:?}"
        );
        warm_up().await;
        let answer =
            tokio::time::timeout(AT_ONCE, charge(&other, &other_body, &intent, one_commit)).await;
        assert!(
            matches!(answer, Ok(Ok(Outcome::Answered(Answer::Mismatch)))),
            "{one_commit}: another body was not a mismatch at once: {answer:?}"
        );
    }
    warm_up().await;
    let begun = tokio::time::timeout(AT_ONCE, other.begin(&same)).await;
    assert!(
        matches!(begun, Ok(Ok(Begin::Answered(Answer::InFlight { retry_after })))
            if retry_after <= Duration::from_secs(1)),
        "a two-commit reservation was not in flight at once: {begun:?}"
    );
    warm_up().await;
    let begun = tokio::time::timeout(AT_ONCE, other.begin(&other_body)).await;
    assert!(
        matches!(begun, Ok(Ok(Begin::Answered(Answer::Mismatch)))),
        "a two-commit reservation of another body was not a mismatch at once: {begun:?}"
    );
    assert_eq!(
        charges(here.pool(), &intent).await,
        0,
        "nothing committed yet"
    );

    go.send(()).expect("the effect waits");
    let first = first.await.expect("the first execution");
    assert!(matches!(first, Ok(Outcome::Executed(_))), "{first:?}");
    let begun = other.begin(&same).await;
    assert!(
        matches!(&begun, Ok(Begin::Answered(Answer::Replay(r))) if r.body == b"held"[..]),
        "another store after the commit: {begun:?}"
    );
    for engine in [&idem, &other] {
        let again = charge(engine, &same, &intent, true).await;
        assert!(
            matches!(&again, Ok(Outcome::Answered(Answer::Replay(r))) if r.body == b"held"[..]),
            "{again:?}"
        );
    }
    assert_eq!(charges(here.pool(), &intent).await, 1);
}

/// C9, C5, C15: a one-commit execution that takes an orphan over holds the record's row (its
/// compare-and-set, uncommitted) until it commits; another store's duplicates meanwhile see
/// the orphan, try to take it over, skip the locked row and are answered in flight at once.
/// After the commit they replay the taker's answer.
#[tokio::test]
async fn c09_a_one_commit_takeover_keeps_others_in_flight_until_it_commits() {
    let table = format!("once_{}", FencingToken::generate());
    let (here, there) = (store(&table).await, store(&table).await);
    let policy = idem_core::Policy::default().lease(Duration::from_millis(300));
    let idem = Idempotency::with_policy(here.clone(), policy.clone()).expect("policy");
    let other = Idempotency::with_policy(there, policy).expect("policy");
    let intent = format!("takeover-{}", FencingToken::generate());
    let req = request(&idem, &intent, b"{}");
    let same = request(&other, &intent, b"{}");
    let Ok(Begin::Acquired(_orphaned)) = other.begin(&same).await else {
        panic!("the orphan's reservation")
    };
    tokio::time::sleep(Duration::from_millis(400)).await;

    let (started, on_start) = oneshot::channel::<()>();
    let (go, on_go) = oneshot::channel::<()>();
    let (engine, owned, held_intent) = (idem.clone(), req.clone(), intent.clone());
    let first = tokio::spawn(async move {
        engine
            .run_in_transaction(&owned.clone().with_one_commit(true), move |tx, lease| {
                let acquired = lease.acquired();
                Box::pin(async move {
                    sqlx::query("INSERT INTO idem_test.charges (intent) VALUES ($1)")
                        .bind(held_intent)
                        .execute(&mut *tx)
                        .await?;
                    let _ = started.send(());
                    let _ = on_go.await;
                    Ok::<_, sqlx::Error>(StoredResponse::new(201, format!("{acquired:?}")))
                })
            })
            .await
    });
    on_start.await.expect("the effect started");
    let begun = tokio::time::timeout(AT_ONCE, other.begin(&same)).await;
    assert!(
        matches!(begun, Ok(Ok(Begin::Answered(Answer::InFlight { .. })))),
        "a two-commit duplicate during the takeover: {begun:?}"
    );
    let answer = tokio::time::timeout(AT_ONCE, charge(&other, &same, &intent, true)).await;
    assert!(
        matches!(answer, Ok(Ok(Outcome::Answered(Answer::InFlight { .. })))),
        "a one-commit duplicate during the takeover: {answer:?}"
    );
    go.send(()).expect("the effect waits");
    let first = first.await.expect("the taker");
    let Ok(Outcome::Executed(taken)) = first else {
        panic!("the takeover: {first:?}")
    };
    assert!(
        String::from_utf8_lossy(&taken.body).contains("TakenOver"),
        "acquired by a takeover: {taken:?}"
    );
    let begun = other.begin(&same).await;
    assert!(
        matches!(&begun, Ok(Begin::Answered(Answer::Replay(r))) if *r == taken),
        "after the commit: {begun:?}"
    );
    assert_eq!(charges(here.pool(), &intent).await, 1);
}

/// What the effect's transaction runs under, in one commit or two: its isolation and timeouts.
async fn effect_settings(idem: &Idempotency<PgStore>, one_commit: bool) -> String {
    let key = format!("iso-{}", FencingToken::generate());
    let req = request(idem, &key, b"{}");
    let effect: idem_postgres::PgEffect<sqlx::Error> = Box::new(move |tx, _lease| {
        Box::pin(async move {
            let row = sqlx::raw_sql(
                "SELECT current_setting('transaction_isolation') || ' / statement_timeout=' \
                 || current_setting('statement_timeout') || ' / lock_timeout=' \
                 || current_setting('lock_timeout')",
            )
            .fetch_one(&mut *tx)
            .await?;
            let seen: String = row.try_get(0)?;
            Ok(StoredResponse::new(201, seen))
        })
    });
    match idem
        .transact(&req.with_one_commit(one_commit), effect)
        .await
    {
        Ok(Outcome::Executed(r)) => String::from_utf8_lossy(&r.body).into_owned(),
        other => panic!("{one_commit}: {other:?}"),
    }
}

/// C15, C6: the effect of a one-commit execution runs in the transaction the store's isolation
/// says, with none of the store's own statement settings, as with two commits: in both
/// statement modes directly, and through PgBouncer. (The reservation's session settings, sent
/// in its transaction, had made a REPEATABLE READ effect READ COMMITTED, with the store's
/// statement and lock timeouts until COMMIT.)
#[tokio::test]
async fn c15_the_effect_runs_at_the_stores_isolation_and_settings_with_one_commit() {
    // PgBouncer in transaction mode takes simple statements only.
    let sides = [
        (pg_url(), StatementMode::Simple),
        (pg_url(), StatementMode::Prepared),
        (bouncer_url(), StatementMode::Simple),
    ];
    for (url, mode) in sides {
        for isolation in [Isolation::RepeatableRead, Isolation::ReadCommitted] {
            let idem = Idempotency::new(store_on(&url, mode, isolation).await);
            let two = effect_settings(&idem, false).await;
            let one = effect_settings(&idem, true).await;
            assert_eq!(one, two, "{isolation:?}, {mode:?}");
            assert!(
                one.ends_with("statement_timeout=0 / lock_timeout=0"),
                "{isolation:?}, {mode:?}: {one}"
            );
        }
    }
}

/// C15: one commit is refused at SERIALIZABLE, before anything runs: the reservation's read in
/// the execution's serializable transaction made concurrent fresh keys fail each other's
/// commits (35 of 40 in a storm of 8).
#[tokio::test]
async fn c15_one_commit_at_serializable_is_refused_and_runs_nothing() {
    let store = store_on(&pg_url(), StatementMode::Prepared, Isolation::Serializable).await;
    let idem = Idempotency::new(store);
    let req = request(&idem, &format!("ser-{}", FencingToken::generate()), b"{}");
    let outcome = idem
        .run_in_transaction(&req.clone().with_one_commit(true), |_tx, _lease| {
            Box::pin(async { Ok::<_, sqlx::Error>(StoredResponse::new(201, "ran")) })
        })
        .await;
    let Err(RunError::Idem(idem_core::Error::Store(error))) = outcome else {
        panic!("not refused: {outcome:?}");
    };
    assert_eq!(error.kind(), idem_core::StoreErrorKind::Misconfigured);
    assert!(
        idem_core::Store::lookup(idem.store(), req.id(), Deadline::default())
            .await
            .expect("lookup")
            .is_none()
    );
}

/// C2, C15: two stores on two tables of one database are unrelated: a one-commit execution of
/// a key in one leaves the same key of the other fresh (the gate's locks are the table's).
#[tokio::test]
async fn c02_a_one_commit_execution_in_another_table_leaves_its_keys_alone() {
    let a = store_on(&pg_url(), StatementMode::Prepared, Isolation::ReadCommitted).await;
    let b = store_on(&pg_url(), StatementMode::Prepared, Isolation::ReadCommitted).await;
    assert_ne!(a.table(), b.table());
    let (ia, ib) = (Idempotency::new(a), Idempotency::new(b));
    let key = format!("tables-{}", FencingToken::generate());
    let (started, on_start) = oneshot::channel::<()>();
    let (go, on_go) = oneshot::channel::<()>();
    let (engine, owned) = (ia.clone(), request(&ia, &key, b"{}"));
    let first = tokio::spawn(async move {
        engine
            .run_in_transaction(&owned.clone().with_one_commit(true), move |_tx, _| {
                Box::pin(async move {
                    let _ = started.send(());
                    let _ = on_go.await;
                    Ok::<_, sqlx::Error>(StoredResponse::new(201, "held"))
                })
            })
            .await
    });
    on_start.await.expect("the effect started");
    let in_b = ib
        .run_in_transaction(
            &request(&ib, &key, b"{\"other\":1}").with_one_commit(true),
            |_tx, _| Box::pin(async { Ok::<_, sqlx::Error>(StoredResponse::new(201, "b")) }),
        )
        .await;
    let fresh_in_b = ib.begin(&request(&ib, &format!("{key}-2"), b"{}")).await;
    go.send(()).expect("go");
    let first = first.await.expect("first");
    assert!(
        matches!(in_b, Ok(Outcome::Executed(_))),
        "table B: {in_b:?}"
    );
    assert!(
        matches!(fresh_in_b, Ok(Begin::Acquired(_))),
        "{fresh_in_b:?}"
    );
    assert!(matches!(first, Ok(Outcome::Executed(_))), "{first:?}");
}

/// C4, C15: duplicates of fresh keys from two engines expecting fresh keys (two pools, several
/// connections each), in one commit and in two, all at once: one execution per key, every
/// other caller answered.
#[tokio::test]
async fn c04_expecting_fresh_keys_concurrent_duplicates_execute_once() {
    let table = format!("fresh_{}", FencingToken::generate());
    let (here, there) = (store(&table).await, store(&table).await);
    let engines = [Idempotency::new(here.clone()), Idempotency::new(there)];
    for round in 0..10 {
        // A round's answers make an engine leave the mode: back into it first.
        for engine in &engines {
            expecting_fresh_keys(engine).await;
        }
        let intent = format!("race-{round}-{}", FencingToken::generate());
        let mut callers = Vec::new();
        for n in 0..16 {
            let engine = engines[n % 2].clone();
            let intent = intent.clone();
            callers.push(tokio::spawn(async move {
                let req = request(&engine, &intent, b"{\"cents\":1}");
                charge(&engine, &req, &intent, n % 4 < 2).await
            }));
        }
        let mut executed = 0;
        for caller in callers {
            match caller.await.expect("a caller") {
                Ok(Outcome::Executed(_)) => executed += 1,
                Ok(Outcome::Answered(Answer::InFlight { .. } | Answer::Replay(_))) => {}
                other => panic!("round {round}: {other:?}"),
            }
        }
        assert_eq!(executed, 1, "round {round}");
        assert_eq!(charges(here.pool(), &intent).await, 1, "round {round}");
    }
}

/// C5, C15: while one-commit executions hold every connection the store runs effects on, its
/// duplicates are still answered at once, on a connection no effect holds: a replay of a
/// completed key, in flight for a held one, a mismatch for another body; on the store's own
/// transaction connections and on the application's pool alike. (They waited for a
/// transaction connection, and got a 503 once the budget ran out.) A fresh key waits for one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c05_duplicates_are_answered_while_every_effect_connection_is_busy() {
    for on_pool in [false, true] {
        let table = format!("once_{}", FencingToken::generate());
        let builder = PgStore::builder().schema(SCHEMA).table(&table);
        let store = if on_pool {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(2)
                .test_before_acquire(false)
                .connect(&pg_url())
                .await
                .expect("pool");
            builder.pool(pool).expect("a store on the pool")
        } else {
            builder
                .max_connections(2)
                .connect(&pg_url())
                .await
                .expect("connect")
        };
        store.migrate().await.expect("migrate");
        business_table(store.pool()).await;
        let policy = idem_core::Policy::default().store_timeout(Duration::from_secs(10));
        let idem = Idempotency::with_policy(store.clone(), policy).expect("policy");
        let done = request(&idem, &format!("done-{table}"), b"{\"cents\":1}");
        let first = charge(&idem, &done, &format!("done-{table}"), true).await;
        assert!(matches!(first, Ok(Outcome::Executed(_))), "{first:?}");

        let mut holders = Vec::new();
        let mut gos = Vec::new();
        for n in 0..2 {
            let intent = format!("held-{n}-{table}");
            let held = request(&idem, &intent, b"{\"cents\":1}");
            let (holder, go) = common::hold(&idem, held, intent).await;
            holders.push(holder);
            gos.push(go);
        }

        let held = format!("held-0-{table}");
        let cases = [
            (done.clone(), "replay"),
            (request(&idem, &held, b"{\"cents\":1}"), "in flight"),
            (request(&idem, &held, b"{\"cents\":2}"), "mismatch"),
        ];
        for (duplicate, expected) in cases {
            let answer =
                tokio::time::timeout(AT_ONCE, charge(&idem, &duplicate, "never", true)).await;
            let found = match &answer {
                Ok(Ok(Outcome::Answered(Answer::Replay(_)))) => "replay",
                Ok(Ok(Outcome::Answered(Answer::InFlight { .. }))) => "in flight",
                Ok(Ok(Outcome::Answered(Answer::Mismatch))) => "mismatch",
                _ => "something else",
            };
            assert_eq!(found, expected, "on the pool: {on_pool}: {answer:?}");
        }
        let fresh = request(&idem, &format!("fresh-{table}"), b"{}");
        let fresh = tokio::spawn({
            let idem = idem.clone();
            async move { charge(&idem, &fresh, "fresh", true).await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!fresh.is_finished(), "a fresh key waits for a connection");

        for go in gos {
            go.send(()).expect("the effect waits");
        }
        for holder in holders {
            let held = holder.await.expect("a holder");
            assert!(matches!(held, Ok(Outcome::Executed(_))), "{held:?}");
        }
        let fresh = fresh.await.expect("the fresh key");
        assert!(matches!(fresh, Ok(Outcome::Executed(_))), "{fresh:?}");
        assert_eq!(charges(store.pool(), "never").await, 0);
        assert_eq!(charges(store.pool(), &held).await, 1);
    }
}

/// C5, C15: a duplicate answered beside busy effects takes the gate's locks of a key no row
/// holds yet only to look, never to reserve: a fresh one-commit reservation of that key in
/// another process at the same moment must still run, never be answered in flight for an
/// execution nobody holds. Here every duplicate comes from a store whose only effect
/// connection is held for good (each looks, then waits for it in vain and fails), so no
/// execution of a key exists but the fresh one's. A race: a look holds the record's key
/// shared for its statement only, so a round finds it now and then (a few rounds in 300 on a
/// loaded two-core machine; none before the looks).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c05_a_look_beside_busy_effects_never_answers_a_fresh_key_in_flight() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let table = format!("once_{}", FencingToken::generate());
    let here = store(&table).await;
    let idem = Idempotency::new(here.clone());
    // The other process: effects on a pool of one connection; its duplicates give up soon.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect(&pg_url())
        .await
        .expect("pool");
    let there = PgStore::builder()
        .schema(SCHEMA)
        .table(&table)
        .max_connections(8)
        .pool(pool)
        .expect("a store on the pool");
    let policy = idem_core::Policy::default().store_timeout(Duration::from_millis(4));
    let other = Idempotency::with_policy(there.clone(), policy).expect("policy");

    // A long effect holds the other process's only effect connection.
    let (started, on_start) = oneshot::channel::<()>();
    let (go, on_go) = oneshot::channel::<()>();
    let busy = request(&other, &format!("busy-{table}"), b"{}").with_one_commit(true);
    let engine = Idempotency::new(there);
    let holder = tokio::spawn(async move {
        engine
            .run_in_transaction(&busy, move |_, _| {
                Box::pin(async move {
                    let _ = started.send(());
                    let _ = on_go.await;
                    Ok::<_, sqlx::Error>(StoredResponse::new(201, "busy"))
                })
            })
            .await
    });
    on_start.await.expect("the effect started");

    // Each round, duplicates of a fresh key, then the key itself through another store.
    let mut in_flight = Vec::new();
    for round in 0..300 {
        let key = format!("fresh-{round}-{table}");
        let stop = Arc::new(AtomicBool::new(false));
        let mut duplicates = Vec::new();
        for _ in 0..32 {
            let (other, stop) = (other.clone(), Arc::clone(&stop));
            let duplicate = request(&other, &key, b"{}");
            duplicates.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let _ = charge(&other, &duplicate, "never", true).await;
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let fresh = charge(&idem, &request(&idem, &key, b"{}"), &key, true).await;
        stop.store(true, Ordering::Relaxed);
        for duplicate in duplicates {
            duplicate.await.expect("a duplicate");
        }
        if !matches!(fresh, Ok(Outcome::Executed(_))) {
            assert_eq!(charges(here.pool(), &key).await, 0, "{fresh:?}");
            in_flight.push(format!("{round}: {fresh:?}"));
        }
    }
    go.send(()).expect("the effect waits");
    let held = holder.await.expect("the holder");
    assert!(matches!(held, Ok(Outcome::Executed(_))), "{held:?}");
    assert_eq!(charges(here.pool(), "never").await, 0);
    assert!(
        in_flight.is_empty(),
        "{} fresh keys nobody else runs were not executed: {in_flight:?}",
        in_flight.len()
    );
}
