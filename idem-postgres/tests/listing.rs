//! What operators see on PostgreSQL beyond the conformance suite: a table from schema version 1
//! is migrated in place and its records list with an unknown age, and the listings can read an
//! index in their order, never sorting the table.

mod common;

use common::{pg_url, SCHEMA};
use idem_core::store::{ListQuery, ListedState, Store};
use idem_core::{FencingToken, StoredResponse};
use idem_postgres::sqlx::{self, AssertSqlSafe, Row};
use idem_postgres::{PgStore, SCHEMA_VERSION};
use std::time::Duration;

/// Runs `sql` with `search_path` set to `schema`, on one connection.
async fn in_schema(pool: &sqlx::PgPool, schema: &str, sql: &str) -> Vec<sqlx::postgres::PgRow> {
    let mut conn = pool.acquire().await.expect("connection");
    sqlx::raw_sql(AssertSqlSafe(format!("SET search_path = \"{schema}\"")))
        .execute(&mut *conn)
        .await
        .expect("search_path");
    let rows = sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .fetch_all(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    sqlx::raw_sql(AssertSqlSafe("RESET search_path".to_owned()))
        .execute(&mut *conn)
        .await
        .expect("reset");
    rows
}

#[tokio::test]
async fn a_version_1_table_is_migrated_and_its_records_list_without_an_age() {
    let schema = format!("v1_{}", FencingToken::generate());
    let store = PgStore::builder()
        .schema(&schema)
        .connect(&pg_url())
        .await
        .expect("connect");
    let pool = store.pool().clone();
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE SCHEMA \"{schema}\"")))
        .execute(&pool)
        .await
        .expect("schema");
    let done = StoredResponse::new(201, "{}").encode().expect("encode");
    let hex: String = done.iter().map(|b| format!("{b:02x}")).collect();
    in_schema(
        &pool,
        &schema,
        &format!(
            "{};\n{}\n\
             INSERT INTO idem_schema_migrations (table_name, version) VALUES ('{schema}.idem_records', 1);\n\
             INSERT INTO idem_records (consumer, route, key, fingerprint, token, state, deadline, response) VALUES \
             ('acct', 'POST /charges', 'old-running', '\\x00', '\\x00', 0, '2100-01-01', NULL), \
             ('acct', 'POST /charges', 'old-done', '\\x00', '\\x00', 1, '2100-01-01', '\\x{hex}');",
            include_str!("../sql/migrations_table.sql"),
            include_str!("../sql/migrations/0001_create_records.sql"),
        ),
    )
    .await;

    store
        .migrate()
        .await
        .expect("migrates version 1 to the current version");
    let pending = store
        .list(&ListQuery::in_progress(Duration::from_secs(
            365 * 24 * 3600,
        )))
        .await
        .expect("list");
    let [record] = pending.records.as_slice() else {
        panic!("{pending:?}");
    };
    assert_eq!(record.id.key(), "old-running");
    assert_eq!(record.reserved_at, None, "its age is unknown, so it is old");
    let done = store
        .list(&ListQuery::completed("acct").expect("consumer"))
        .await
        .expect("list");
    assert_eq!(done.records.len(), 1);
    assert!(matches!(
        done.records[0].state,
        ListedState::Completed { status: 201, .. }
    ));
    let stats = store.stats().await.expect("stats");
    assert_eq!((stats.in_progress, stats.completed), (1, 1));
    assert_eq!(stats.oldest_in_progress, None);
    let version: i64 = in_schema(
        &pool,
        &schema,
        "SELECT max(version) FROM idem_schema_migrations",
    )
    .await[0]
        .get(0);
    assert_eq!(version, SCHEMA_VERSION);
}

#[tokio::test]
async fn listings_read_an_index_in_their_order() {
    let store = PgStore::builder()
        .schema(SCHEMA)
        .table(&format!("plan_{}", FencingToken::generate()))
        .connect(&pg_url())
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    let table = store.table();
    for (statement, index, literals) in [
        (
            include_str!("../sql/list_in_progress.sql"),
            "_in_progress",
            ["0", "-1", "''", "''", "''", "10"].as_slice(),
        ),
        (
            include_str!("../sql/list_completed.sql"),
            "_pkey",
            ["'acct'", "''", "''", "''", "10"].as_slice(),
        ),
    ] {
        let mut sql = statement.replace("idem_records", &table);
        for (i, literal) in literals.iter().enumerate().rev() {
            sql = sql.replace(&format!("${}", i + 1), literal);
        }
        // A tiny table is cheaper to scan: forbid that, to see whether an index serves.
        let plan = in_schema(
            store.pool(),
            SCHEMA,
            &format!("SET enable_seqscan = off; EXPLAIN {sql}; RESET enable_seqscan"),
        )
        .await
        .iter()
        .map(|row| row.get::<String, _>(0))
        .collect::<Vec<_>>()
        .join("\n");
        assert!(plan.contains(index), "{plan}");
        assert!(!plan.contains("Sort"), "a listing sorts:\n{plan}");
        assert!(!plan.contains("Seq Scan"), "{plan}");
    }
}
