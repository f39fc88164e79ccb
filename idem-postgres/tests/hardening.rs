//! What an adversarial review of the store found, each now a test: long effects at strict
//! isolation levels, takeovers that never wait, purge through the index, a stricter default
//! isolation, racing migrations, dead idle connections, drain, infinite deadlines, answers
//! while every connection for transactions runs an effect.

mod common;

use common::{charges, pg_url, request, select_one, store_on, SCHEMA};
use idem_core::store::Deadline;
use idem_core::{Answer, Begin, Error, Idempotency, Outcome, Policy, Store, StoredResponse};
use idem_postgres::sqlx::{self, AssertSqlSafe, Row};
use idem_postgres::{Isolation, PgIdempotency, PgStore, StatementMode};
use std::time::{Duration, Instant};

async fn sql(store: &PgStore, statement: String) {
    sqlx::raw_sql(AssertSqlSafe(statement))
        .execute(store.pool())
        .await
        .expect("sql");
}

/// C6, C9: at REPEATABLE READ and SERIALIZABLE an effect longer than a third of the lease still
/// commits (a heartbeat renewing the record would turn the completion into a serialization
/// failure, every retry alike).
#[tokio::test]
async fn c06_long_effects_commit_at_every_isolation_level() {
    for isolation in [
        Isolation::ReadCommitted,
        Isolation::RepeatableRead,
        Isolation::Serializable,
    ] {
        let store = store_on(&pg_url(), StatementMode::Prepared, isolation).await;
        let idem =
            Idempotency::with_policy(store, Policy::default().lease(Duration::from_millis(900)))
                .expect("policy");
        let intent = format!("long-{isolation:?}-{}", idem_core::FencingToken::generate());
        let i = intent.clone();
        let outcome = idem
            .run_in_transaction(&request(&idem, &intent), move |tx, _| {
                Box::pin(async move {
                    sqlx::query("INSERT INTO idem_test.charges (intent) VALUES ($1)")
                        .bind(i)
                        .execute(&mut *tx)
                        .await?;
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    Ok::<_, sqlx::Error>(StoredResponse::new(201, "ok"))
                })
            })
            .await;
        assert!(
            matches!(outcome, Ok(Outcome::Executed(_))),
            "{isolation:?}: {outcome:?}"
        );
        assert_eq!(charges(idem.store().pool(), &intent).await, 1);
    }
}

/// C5: after the lease passed, the old holder has run its completion UPDATE and not committed:
/// a retry that would take the record over is answered in flight at once, never waiting for
/// that commit (nor holding a connection while it waits).
#[tokio::test]
async fn c05_a_takeover_never_waits_for_a_late_completion() {
    let store = store_on(&pg_url(), StatementMode::Prepared, Isolation::ReadCommitted).await;
    let idem = Idempotency::with_policy(
        store.clone(),
        Policy::default().lease(Duration::from_millis(200)),
    )
    .expect("policy");
    let req = request(&idem, "late");
    let Begin::Acquired(lease) = idem.begin(&req).await.expect("begin") else {
        panic!("fresh");
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut tx = store.pool().begin().await.expect("tx");
    store
        .complete_in(
            &mut tx,
            &idem.completion(&lease, StoredResponse::new(201, "late")),
        )
        .await
        .expect("late completion, not committed");
    for _ in 0..5 {
        let started = Instant::now();
        let answer = idem.begin(&req).await.expect("begin");
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "waited {:?}",
            started.elapsed()
        );
        assert!(
            matches!(answer, Begin::Answered(Answer::InFlight { .. })),
            "{answer:?}"
        );
    }
    tx.commit().await.expect("commit");
    assert_eq!(
        idem.begin(&req).await.expect("begin"),
        Begin::Answered(Answer::Replay(StoredResponse::new(201, "late")))
    );
}

/// C10: purge finds expired rows through the reservation-time index, not by scanning the table.
#[tokio::test]
async fn c10_purge_uses_the_reserved_index() {
    let store = store_on(&pg_url(), StatementMode::Prepared, Isolation::ReadCommitted).await;
    let table = store.table();
    sql(
        &store,
        format!(
            "INSERT INTO {table} (consumer, route, key, fingerprint, token, state, deadline) \
         SELECT 'c', 'r', g::text, '\\x00'::bytea, '\\x00'::bytea, 0, now() + interval '1 hour' \
         FROM generate_series(1, 20000) g; ANALYZE {table}"
        ),
    )
    .await;
    let purge = include_str!("../sql/purge_expired.sql")
        .lines()
        .filter(|l| !l.starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("idem_records", &table)
        .replace("$1", "1000")
        .replace("$2", "-1")
        .replace("$3", "''")
        .replace("$4", "''")
        .replace("$5", "''");
    let plan: Vec<String> = sqlx::raw_sql(AssertSqlSafe(format!("EXPLAIN {purge}")))
        .fetch_all(store.pool())
        .await
        .expect("explain")
        .iter()
        .map(|row| row.try_get::<String, _>(0).expect("plan line"))
        .collect();
    let plan = plan.join("\n");
    assert!(
        plan.contains("_reserved") && !plan.contains("Seq Scan"),
        "purge does not use the reservation-time index:\n{plan}"
    );
}

/// The completion is a HOT update (schema version 5): no index is on a column it changes, so
/// it writes no index entry. Counted by the server on the completion's connection (counters
/// that connection has not reported yet, read before and after).
#[tokio::test]
async fn the_completion_is_a_hot_update() {
    let store = store_on(&pg_url(), StatementMode::Prepared, Isolation::ReadCommitted).await;
    let idem = Idempotency::new(store.clone());
    let counters = "SELECT pg_stat_get_xact_tuples_updated(to_regclass($1)), \
                    pg_stat_get_xact_tuples_hot_updated(to_regclass($1))";
    for n in 0..20 {
        let req = request(&idem, &format!("hot-{n}"));
        let Begin::Acquired(lease) = idem.begin(&req).await.expect("begin") else {
            panic!("fresh");
        };
        let mut tx = store.pool().begin().await.expect("tx");
        let before: (i64, i64) = sqlx::query_as(counters)
            .bind(store.table())
            .fetch_one(&mut *tx)
            .await
            .expect("counters");
        store
            .complete_in(
                &mut tx,
                &idem.completion(&lease, StoredResponse::new(201, "done")),
            )
            .await
            .expect("completion");
        let after: (i64, i64) = sqlx::query_as(counters)
            .bind(store.table())
            .fetch_one(&mut *tx)
            .await
            .expect("counters");
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (1, 1),
            "completion {n}: one update, HOT"
        );
        tx.commit().await.expect("commit");
    }
}

/// C5: a database whose default isolation is SERIALIZABLE still answers concurrent duplicates
/// (the store pins READ COMMITTED on its own connections): one acquires, the others are
/// answered, none gets a serialization failure; with `run_in_transaction` too, where each
/// effect runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c05_a_stricter_default_isolation_does_not_turn_answers_into_errors() {
    let admin = PgStore::connect(&pg_url()).await.expect("connect");
    let database = format!(
        "idem_ser_{}",
        &idem_core::FencingToken::generate().to_string()[..12]
    );
    sql(&admin, format!("CREATE DATABASE {database}")).await;
    sql(
        &admin,
        format!("ALTER DATABASE {database} SET default_transaction_isolation = 'serializable'"),
    )
    .await;
    let url = pg_url().replacen("/postgres", &format!("/{database}"), 1);
    let store = PgStore::builder()
        .max_connections(8)
        .connect(&url)
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    let idem = Idempotency::new(store);
    for round in 0..10 {
        let req = request(&idem, &format!("round-{round}"));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (idem, req) = (idem.clone(), req.clone());
                tokio::spawn(async move { idem.begin(&req).await })
            })
            .collect();
        let mut acquired = 0;
        for task in tasks {
            match task.await.expect("task") {
                Ok(Begin::Acquired(_)) => acquired += 1,
                Ok(Begin::Answered(_)) => {}
                Err(error) => panic!("round {round}: {error}"),
            }
        }
        assert_eq!(acquired, 1, "round {round}");
    }
    // The money path: the conformance suite's storm of 16 transactional executions of one key
    // (one executes and writes one business row, the others are answered), on this database.
    let harness = common::Pg {
        url,
        ..common::Pg::direct(Isolation::ReadCommitted)
    };
    for _ in 0..10 {
        idem_core::testing::txc_c04_concurrent_executions_of_one_key_write_one_row(&harness, false)
            .await;
    }
}

/// Start-up: many stores migrating different tables into a schema that does not exist yet.
#[tokio::test]
async fn concurrent_migrations_into_a_new_schema_all_succeed() {
    let schema = format!(
        "s_{}",
        &idem_core::FencingToken::generate().to_string()[..12]
    );
    let mut stores = Vec::new();
    for i in 0..6 {
        stores.push(
            PgStore::builder()
                .schema(&schema)
                .table(&format!("t{i}"))
                .max_connections(2)
                .connect(&pg_url())
                .await
                .expect("connect"),
        );
    }
    let migrations: Vec<_> = stores
        .iter()
        .cloned()
        .map(|store| tokio::spawn(async move { store.migrate().await }))
        .collect();
    for migration in migrations {
        migration.await.expect("task").expect("migrate");
    }
}

/// C13: connections that died while idle (a server restart, a failover) cost no failed
/// request: each is replaced and the call runs on a new one.
#[tokio::test]
async fn c13_dead_idle_connections_are_replaced_without_failing_a_call() {
    let name = format!(
        "dead_{}",
        &idem_core::FencingToken::generate().to_string()[..12]
    );
    let url = format!("{}?application_name={name}", pg_url());
    let store = store_on(&url, StatementMode::Prepared, Isolation::ReadCommitted).await;
    let idem = Idempotency::new(store.clone());
    let warm: Vec<_> = (0..8)
        .map(|i| {
            let (idem, req) = (idem.clone(), request(&idem, &format!("warm-{i}")));
            tokio::spawn(async move { idem.begin(&req).await })
        })
        .collect();
    for task in warm {
        let _ = task.await.expect("task").expect("begin");
    }
    // And connections for transactions.
    let charged: Vec<_> = (0..8)
        .map(|i| {
            let (idem, req) = (idem.clone(), request(&idem, &format!("warm-money-{i}")));
            tokio::spawn(async move { idem.run_in_transaction(&req, select_one).await })
        })
        .collect();
    for task in charged {
        let _ = task.await.expect("task").expect("run_in_transaction");
    }
    let admin = PgStore::connect(&pg_url()).await.expect("admin");
    sql(
        &admin,
        format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = '{name}' AND state = 'idle'"
        ),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    for i in 0..12 {
        let _ = idem
            .begin(&request(&idem, &format!("after-{i}")))
            .await
            .expect("no failed call");
    }
    for i in 0..12 {
        let outcome = idem
            .run_in_transaction(&request(&idem, &format!("money-after-{i}")), select_one)
            .await
            .expect("no failed call");
        assert!(matches!(outcome, Outcome::Executed(_)), "{outcome:?}");
    }
}

/// C8: drain waits for run_in_transaction executions whose callers went away.
#[tokio::test]
async fn c08_drain_waits_for_a_detached_transaction() {
    let store = store_on(&pg_url(), StatementMode::Prepared, Isolation::ReadCommitted).await;
    let idem = Idempotency::new(store);
    let intent = format!("drain-{}", idem_core::FencingToken::generate());
    let i = intent.clone();
    let dropped = tokio::time::timeout(
        Duration::from_millis(50),
        idem.run_in_transaction(&request(&idem, &intent), move |tx, _| {
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                sqlx::query("INSERT INTO idem_test.charges (intent) VALUES ($1)")
                    .bind(i)
                    .execute(&mut *tx)
                    .await?;
                Ok::<_, sqlx::Error>(StoredResponse::new(201, "ok"))
            })
        }),
    )
    .await;
    assert!(dropped.is_err(), "the caller went away");
    idem.drain().await;
    assert_eq!(
        charges(idem.store().pool(), &intent).await,
        1,
        "drain returned before the commit"
    );
}

/// C12: a record whose deadline is not a finite time is corrupt, not a store failure.
#[tokio::test]
async fn c12_an_infinite_deadline_is_a_corrupt_record() {
    let store = store_on(&pg_url(), StatementMode::Prepared, Isolation::ReadCommitted).await;
    let idem = Idempotency::new(store.clone());
    let req = request(&idem, "inf");
    let Begin::Acquired(_) = idem.begin(&req).await.expect("begin") else {
        panic!("fresh");
    };
    sql(
        &store,
        format!("UPDATE {} SET deadline = 'infinity'", store.table()),
    )
    .await;
    assert!(matches!(
        idem.begin(&req).await,
        Err(Error::CorruptRecord(_))
    ));
    assert!(matches!(
        store.lookup(req.id(), Deadline::default()).await,
        Err(Error::CorruptRecord(_))
    ));
    let _ = SCHEMA;
}

/// C5: a duplicate sent through `run_in_transaction` while every connection for transactions
/// runs an effect is answered at once: its reservation never waits for an effect to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c05_an_answer_never_waits_for_the_connections_effects_hold() {
    let store = PgStore::builder()
        .schema(SCHEMA)
        .table(&format!("busy_{}", idem_core::FencingToken::generate()))
        .max_connections(1)
        .read_first(false)
        .connect(&pg_url())
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    let idem = Idempotency::new(store);
    let done = request(&idem, "done");
    let first = idem.run_in_transaction(&done, select_one).await;
    assert!(matches!(first, Ok(Outcome::Executed(_))), "{first:?}");
    // The one connection for transactions, held by a slow effect.
    let (started, running) = tokio::sync::oneshot::channel::<()>();
    let slow = {
        let (idem, req) = (idem.clone(), request(&idem, "slow"));
        tokio::spawn(async move {
            idem.run_in_transaction(&req, move |tx, _| {
                Box::pin(async move {
                    let _ = started.send(());
                    sqlx::query("SELECT pg_sleep(2)").execute(&mut *tx).await?;
                    Ok::<_, sqlx::Error>(StoredResponse::new(201, "slow"))
                })
            })
            .await
        })
    };
    running.await.expect("the slow effect started");
    let asked = Instant::now();
    let replay = idem.run_in_transaction(&done, select_one).await;
    let waited = asked.elapsed();
    assert!(
        matches!(replay, Ok(Outcome::Answered(Answer::Replay(_)))),
        "{replay:?}"
    );
    assert!(waited < Duration::from_secs(1), "answered after {waited:?}");
    let slow = slow.await.expect("task");
    assert!(matches!(slow, Ok(Outcome::Executed(_))), "{slow:?}");
}
