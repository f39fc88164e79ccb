//! `PgStore::migrate` as a deploy runs it: several instances starting together on a new or a
//! version-1 table, through PgBouncer, and a table held by another transaction for longer than
//! a migration waits.

mod common;

use common::{bouncer_url, pg_url};
use idem_core::FencingToken;
use idem_postgres::sqlx::{self, AssertSqlSafe, Connection, PgConnection};
use idem_postgres::{PgStore, StatementMode};
use std::time::Duration;

async fn raw(url: &str, sql: &str) {
    let mut conn = PgConnection::connect(url).await.expect("connect");
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .execute(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// A new schema holding a version-1 `idem_records` with `rows` in-progress rows (what a
/// release before version 2 left), so that building the in-progress index takes a while.
async fn version_1_schema(rows: u32) -> String {
    let schema = format!("mig_{}", FencingToken::generate());
    let sql = format!(
        "CREATE SCHEMA \"{schema}\"; SET search_path = \"{schema}\";\n{};\n{}\n\
         INSERT INTO idem_schema_migrations (table_name, version) VALUES ('{schema}.idem_records', 1);\n\
         INSERT INTO idem_records (consumer, route, key, fingerprint, token, state, deadline, response) \
         SELECT 'acct_' || (g % 1000), 'POST /v1/charges', md5(g::text), '\\x00', '\\x00', 0, '2100-01-01', NULL \
         FROM generate_series(1, {rows}) g;",
        include_str!("../sql/migrations_table.sql"),
        include_str!("../sql/migrations/0001_create_records.sql"),
    );
    raw(&pg_url(), &sql).await;
    schema
}

async fn store(url: &str, schema: &str, mode: StatementMode) -> PgStore {
    PgStore::builder()
        .schema(schema)
        .statements(mode)
        .connect(url)
        .await
        .expect("connect")
}

/// Whether the listing indexes the migration builds concurrently exist and are valid: `Some`
/// of all valid when all exist, `None` while one is missing.
async fn index_state(schema: &str) -> Option<bool> {
    let mut conn = PgConnection::connect(&pg_url()).await.expect("connect");
    let mut valid = true;
    for index in [
        "idem_records_reserved",
        "idem_records_key",
        "idem_records_in_doubt",
    ] {
        let state: Option<bool> = sqlx::query_scalar(
            "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1)",
        )
        .bind(format!("\"{schema}\".\"{index}\""))
        .fetch_optional(&mut conn)
        .await
        .expect("index");
        valid &= state?;
    }
    Some(valid)
}

/// Several instances start together after a deploy and each calls `migrate()`: every one
/// succeeds (one builds the index, the others find it being built and return) and the index
/// ends valid, on a version-1 table with rows and on a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_starting_together_all_migrate_and_leave_a_valid_index() {
    let mut failures = Vec::new();
    for round in 0..4 {
        let schema = if round == 0 {
            version_1_schema(50_000).await
        } else {
            format!("mig_{}", FencingToken::generate())
        };
        let mut handles = Vec::new();
        for i in 0..5 {
            let mode = if i % 2 == 0 {
                StatementMode::Prepared
            } else {
                StatementMode::Simple
            };
            let store = store(&pg_url(), &schema, mode).await;
            handles.push(tokio::spawn(async move { store.migrate().await }));
        }
        for (i, handle) in handles.into_iter().enumerate() {
            if let Err(e) = handle.await.expect("join") {
                failures.push(format!("round {round} instance {i}: {e}"));
            }
        }
        // The instances that returned first left the build to another: wait for it.
        let mut state = index_state(&schema).await;
        for _ in 0..100 {
            if state == Some(true) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            state = index_state(&schema).await;
        }
        if state != Some(true) {
            failures.push(format!("round {round}: index {state:?}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Through PgBouncer (transaction mode, simple protocol): migrate a version-1 table, then check
/// no server connection kept the migration's lock_timeout.
#[tokio::test]
async fn through_pgbouncer_and_no_setting_leaks() {
    let schema = version_1_schema(20_000).await;
    let s = store(&bouncer_url(), &schema, StatementMode::Simple).await;
    s.migrate().await.expect("migrate through PgBouncer");
    assert_eq!(index_state(&schema).await, Some(true));
    s.migrate().await.expect("again");
    // Every server connection PgBouncer hands out: lock_timeout as configured (0).
    let mut conns = Vec::new();
    for _ in 0..8 {
        let mut c = PgConnection::connect(&bouncer_url())
            .await
            .expect("connect");
        let row = sqlx::raw_sql("SHOW lock_timeout")
            .fetch_one(&mut c)
            .await
            .expect("show");
        let v: String = sqlx::Row::get(&row, 0);
        assert_eq!(
            v, "0",
            "a migration's lock_timeout leaked onto a pooled connection"
        );
        conns.push(c);
    }
    // And the store's own sqlx pool.
    for _ in 0..4 {
        let row = sqlx::raw_sql("SHOW lock_timeout")
            .fetch_one(s.pool())
            .await
            .expect("show");
        let v: String = sqlx::Row::get(&row, 0);
        assert_eq!(v, "0");
    }
}

/// The lock_timeout retries end in a retryable error after about half a minute when another
/// transaction holds the table all along, and the table migrates once it is let go.
#[tokio::test]
async fn gives_up_with_an_error_when_the_table_stays_held() {
    let schema = version_1_schema(10).await;
    let mut other = PgConnection::connect(&pg_url()).await.expect("connect");
    sqlx::raw_sql(AssertSqlSafe(format!(
        "BEGIN; LOCK TABLE \"{schema}\".idem_records IN ACCESS SHARE MODE;"
    )))
    .execute(&mut other)
    .await
    .expect("hold");
    let s = store(&pg_url(), &schema, StatementMode::Prepared).await;
    let err = s.migrate().await.expect_err("cannot migrate while held");
    assert!(err.is_retryable(), "{err}");
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut other)
        .await
        .expect("rollback");
    s.migrate().await.expect("migrates once let go");
}
