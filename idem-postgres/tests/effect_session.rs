//! The session an effect of `run_in_transaction` runs in. A store built over the
//! application's pool (`PgStoreBuilder::pool`) runs the effects' transactions on that pool, set
//! up as that pool sets its connections up (a tenant for row-level security, a `search_path`, a
//! role: its `after_connect`); a store that opened its own connections runs them on its own.

mod common;

use common::{insert_charge, pg_url, SCHEMA};
use idem_core::{FencingToken, Idempotency, Outcome, StoredResponse};
use idem_postgres::sqlx::{self, postgres::PgPoolOptions};
use idem_postgres::{PgIdempotency, PgStore};
use std::sync::{Arc, Mutex};

#[tokio::test]
async fn c06_the_effect_runs_on_a_session_set_up_as_the_pool_you_passed_sets_it_up() {
    // The pool of your business code, whose sessions carry what your SQL relies on (a tenant
    // for row-level security, a search_path, a role), set when each connection opens.
    let pool = business_pool(&pg_url(), 2, Some("SET idem_review.tenant = 'acct_1'")).await;
    let store = store_over(&pool).await;
    let (on_the_pool,): (Option<String>,) =
        sqlx::query_as("SELECT current_setting('idem_review.tenant', true)")
            .fetch_one(&pool)
            .await
            .expect("the pool's session");
    assert_eq!(on_the_pool.as_deref(), Some("acct_1"));

    let idem = Idempotency::new(store);
    let (tenant,): (Option<String>,) = read_in_effect(
        &idem,
        "SELECT current_setting('idem_review.tenant', true)",
        "SELECT 1",
    )
    .await;
    assert_eq!(
        tenant.as_deref(),
        Some("acct_1"),
        "the effect ran on a connection opened with the pool's connect options only: the \
         pool's after_connect set-up (tenant, search_path, role) is missing from its session"
    );
}

/// Runs one fresh key through `run_in_transaction`, whose effect reads one row with `read`,
/// then runs `tamper` (say, a change of its session's settings), and commits: the row read.
async fn read_in_effect<T>(
    idem: &Idempotency<PgStore>,
    read: &'static str,
    tamper: &'static str,
) -> T
where
    T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Clone + Send + Unpin + 'static,
{
    let request = idem
        .request("acct_1", "POST", "/charges")
        .key(Some(&format!("effect-{}", FencingToken::generate())))
        .body(b"{}")
        .build()
        .expect("request");
    let seen = Arc::new(Mutex::new(None::<T>));
    let seen_in_effect = Arc::clone(&seen);
    let outcome = idem
        .run_in_transaction(&request, move |tx, _lease| {
            Box::pin(async move {
                let row: T = sqlx::query_as(read).fetch_one(&mut *tx).await?;
                sqlx::raw_sql(tamper).execute(&mut *tx).await?;
                *seen_in_effect.lock().expect("not poisoned") = Some(row);
                Ok::<_, sqlx::Error>(StoredResponse::new(201, "charged"))
            })
        })
        .await
        .expect("run_in_transaction");
    assert!(matches!(outcome, Outcome::Executed(_)), "{outcome:?}");
    let row = seen.lock().expect("not poisoned").clone();
    row.expect("the effect ran")
}

/// C13: every effect's transaction is bounded by the store's idle deadline and runs at its
/// isolation level, on the store's own connections, with simple statements and on your pool:
/// the first transaction of a connection and the next ones on it alike, whatever an effect
/// before did to its session (`RESET ALL`, a `SET` of the deadline, committed), and nothing of
/// the store's is left in your pool's sessions.
#[tokio::test]
async fn c13_every_effects_transaction_carries_the_idle_deadline_and_isolation() {
    let idle = std::time::Duration::from_millis(2_750);
    let builder = || {
        PgStore::builder()
            .schema(SCHEMA)
            .table(&format!("t_{}", FencingToken::generate()))
            .max_connections(1)
            .idle_in_transaction_timeout(idle)
    };
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&pg_url())
        .await
        .expect("the business pool");
    let stores = [
        (
            "own connections",
            builder().connect(&pg_url()).await.expect("store"),
        ),
        (
            "own connections, simple statements",
            builder()
                .statements(idem_postgres::StatementMode::Simple)
                .connect(&pg_url())
                .await
                .expect("store"),
        ),
        ("your pool", builder().pool(pool.clone()).expect("store")),
    ];
    for (name, store) in stores {
        store.migrate().await.expect("migrate");
        let idem = Idempotency::new(store);
        let tampers = [
            "SELECT 1",
            "RESET ALL",
            "SET idle_in_transaction_session_timeout = 0",
            "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE",
            "SELECT 1",
        ];
        let mut sessions = Vec::new();
        for (round, tamper) in tampers.into_iter().enumerate() {
            let (timeout, isolation, session): (String, String, i32) = read_in_effect(
                &idem,
                "SELECT current_setting('idle_in_transaction_session_timeout'), \
                        current_setting('transaction_isolation'), pg_backend_pid()",
                tamper,
            )
            .await;
            assert_eq!(
                (timeout.as_str(), isolation.as_str()),
                ("2750ms", "read committed"),
                "{name}, transaction {round} of its connection"
            );
            sessions.push(session);
            if round == 0 && name == "your pool" {
                // SET LOCAL: nothing of the store's stays in the sessions of your pool (read
                // before any effect changed them).
                let (after,): (String,) =
                    sqlx::query_as("SELECT current_setting('idle_in_transaction_session_timeout')")
                        .fetch_one(&pool)
                        .await
                        .expect("the pool's session");
                assert_ne!(
                    after, "2750ms",
                    "the idle deadline leaked into your pool's session"
                );
            }
        }
        sessions.dedup();
        assert_eq!(
            sessions.len(),
            1,
            "{name}: the effects did not share one connection, so the test proves nothing \
             about a connection's later transactions"
        );
    }
}

/// C13: a restart of the server kills every idle connection of your pool at once. With
/// `test_before_acquire(false)` (as `PgStoreBuilder::pool` advises) your pool hands them out
/// one after another; each fails its `BEGIN` before the effect runs and is closed, and the
/// execution takes the next, until one answers: the first call after the restart is executed,
/// never a 503 for connections the store already knew to be dead.
#[tokio::test]
async fn c13_dead_idle_connections_of_your_pool_are_replaced_without_failing_a_call() {
    const CONNECTIONS: u32 = 6;
    let name = format!("pooldead_{}", &FencingToken::generate().to_string()[..12]);
    let pool = business_pool(
        &format!("{}?application_name={name}", pg_url()),
        CONNECTIONS,
        None,
    )
    .await;
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&pg_url())
        .await
        .expect("an admin pool");
    let store = store_over(&pool).await;
    common::business_table(&admin).await;
    let idem = Idempotency::new(store);
    for one_commit in [false, true] {
        all_idle(&pool, CONNECTIONS).await;
        let killed: Vec<(bool,)> = sqlx::query_as(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = $1 AND state = 'idle'",
        )
        .bind(&name)
        .fetch_all(&admin)
        .await
        .expect("terminate the idle connections");
        assert!(killed.len() >= CONNECTIONS as usize, "{killed:?}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert_eq!(
            pool.num_idle(),
            CONNECTIONS as usize,
            "the dead ones wait in the pool"
        );

        let intent = format!("after-restart-{}", FencingToken::generate());
        let request = charge(&idem, &intent, one_commit);
        let charged = intent.clone();
        let outcome = idem
            .run_in_transaction(&request, move |tx, _lease| insert_charge(tx, charged))
            .await
            .unwrap_or_else(|e| panic!("one commit {one_commit}: the first call failed: {e}"));
        assert!(matches!(outcome, Outcome::Executed(_)), "{outcome:?}");
        assert_eq!(common::charges(&admin, &intent).await, 1);
    }
}

/// A store on a new table, over `pool` (its effects' transactions run there), migrated.
async fn store_over(pool: &sqlx::PgPool) -> PgStore {
    let store = PgStore::builder()
        .schema(SCHEMA)
        .table(&format!("t_{}", FencingToken::generate()))
        .pool(pool.clone())
        .expect("a store on the business pool");
    store.migrate().await.expect("migrate");
    store
}

/// Your business pool on `url`: `connections` at most, none tested when taken (as
/// `PgStoreBuilder::pool` advises), each set up by `set_up` when it opens.
async fn business_pool(url: &str, connections: u32, set_up: Option<&'static str>) -> sqlx::PgPool {
    PgPoolOptions::new()
        .max_connections(connections)
        .test_before_acquire(false)
        .after_connect(move |conn, _meta| {
            Box::pin(async move {
                match set_up {
                    Some(statement) => sqlx::raw_sql(statement).execute(&mut *conn).await.map(drop),
                    None => Ok(()),
                }
            })
        })
        .connect(url)
        .await
        .expect("the business pool")
}

/// A charge of `key` for `acct_1`, in one commit or two.
fn charge(idem: &Idempotency<PgStore>, key: &str, one_commit: bool) -> idem_core::Request {
    idem.request("acct_1", "POST", "/charges")
        .key(Some(key))
        .body(b"{}")
        .build()
        .expect("request")
        .with_one_commit(one_commit)
}

/// Opens `count` connections of `pool` at once, then waits until all are idle (sqlx gives them
/// back on tasks of its own: until they are back, a kill would make sqlx close them itself).
async fn all_idle(pool: &sqlx::PgPool, count: u32) {
    let mut held = Vec::new();
    for _ in 0..count {
        held.push(pool.acquire().await.expect("a pool connection"));
    }
    drop(held);
    for _ in 0..200 {
        if pool.num_idle() == count as usize {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("{} of {count} connections idle", pool.num_idle());
}

/// C13: a server that refuses writes (a standby, a read-only setting) answers every connection
/// of your pool alike: a one-commit reservation refused on one is tried on a second, as any
/// failed step is, and the call answers 503, without closing the rest of the pool (its
/// connections still serve your reads).
#[tokio::test]
async fn c13_a_server_refusing_writes_does_not_empty_your_pool() {
    const CONNECTIONS: u32 = 6;
    let pool = business_pool(
        &pg_url(),
        CONNECTIONS,
        Some("SET default_transaction_read_only = on"),
    )
    .await;
    // The table is made on a writable connection.
    let table = format!("t_{}", FencingToken::generate());
    let writable = PgStore::builder()
        .schema(SCHEMA)
        .table(&table)
        .connect(&pg_url())
        .await
        .expect("a writable store");
    writable.migrate().await.expect("migrate");
    let store = PgStore::builder()
        .schema(SCHEMA)
        .table(&table)
        .pool(pool.clone())
        .expect("a store on the read-only pool");
    let idem = Idempotency::new(store);
    all_idle(&pool, CONNECTIONS).await;
    let key = format!("read-only-{}", FencingToken::generate());
    let request = charge(&idem, &key, true);
    let refused = idem
        .run_in_transaction(&request, |_tx, _lease| {
            Box::pin(async { Ok::<_, sqlx::Error>(StoredResponse::new(201, "charged")) })
        })
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(
        pool.size() >= CONNECTIONS - 2,
        "the refused call closed {} of the pool's {CONNECTIONS} connections",
        CONNECTIONS - pool.size()
    );
}

/// C12, C13: with simple statements the store reads its results in text, where `bytea` is
/// written as the session says. An effect that leaves `bytea_output = 'escape'` on its session
/// (or a database or role that sets it) made every later statement of the store on that
/// session read a corrupt record, a 500, while its reservation had committed; behind a pooler
/// every client of the server connection. The store sets what it reads with in each message.
#[tokio::test]
async fn c13_a_bytea_output_an_effect_leaves_does_not_break_the_stores_statements() {
    let store = PgStore::builder()
        .schema(SCHEMA)
        .table(&format!("t_{}", FencingToken::generate()))
        .statements(idem_postgres::StatementMode::Simple)
        .max_connections(1)
        .connect(&pg_url())
        .await
        .expect("store");
    store.migrate().await.expect("migrate");
    let idem = Idempotency::new(store);
    for one_commit in [true, false] {
        for round in 0..3 {
            let key = format!("bytea-{}", FencingToken::generate());
            let request = charge(&idem, &key, one_commit);
            let executed = idem
                .run_in_transaction(&request, |tx, _lease| {
                    Box::pin(async move {
                        sqlx::raw_sql("SET bytea_output = 'escape'")
                            .execute(&mut *tx)
                            .await?;
                        Ok::<_, sqlx::Error>(StoredResponse::new(201, "charged"))
                    })
                })
                .await;
            let what = format!("one commit {one_commit}, round {round}");
            assert!(
                matches!(executed, Ok(Outcome::Executed(_))),
                "{what}: {executed:?}"
            );
            let replayed = idem
                .run_in_transaction(&request, |_tx, _lease| {
                    Box::pin(async { Ok::<_, sqlx::Error>(StoredResponse::new(500, "ran again")) })
                })
                .await;
            assert!(
                matches!(replayed, Ok(Outcome::Answered(_))),
                "{what}: {replayed:?}"
            );
        }
    }
}
