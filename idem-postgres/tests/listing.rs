//! What operators see on PostgreSQL beyond the conformance suite: a table from schema version 1
//! is migrated in place and its records list with an unknown age, and the listings can read an
//! index in their order, never sorting the table.

mod common;

use common::{pg_url, SCHEMA};
use idem_core::store::Deadline;
use idem_core::store::Store;
use idem_core::{FencingToken, StoredResponse};
use idem_ops::{ListQuery, ListedState, Operator};
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

/// A store on a new schema whose `idem_records` table is at schema version 1, as a release
/// before version 2 left it, with an in-progress row (lease until 2100) and a completed one.
async fn version_1_store() -> (PgStore, String) {
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

    (store, schema)
}

/// Whether the reservation-time index of `schema`.idem_records exists and is valid.
async fn index_is_valid(store: &PgStore, schema: &str) -> Option<bool> {
    sqlx::query_scalar("SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1)")
        .bind(format!("\"{schema}\".\"idem_records_reserved\""))
        .fetch_optional(store.pool())
        .await
        .expect("index")
}

#[tokio::test]
async fn a_version_1_table_is_migrated_and_its_records_list_without_an_age() {
    let (store, schema) = version_1_store().await;
    let pool = store.pool().clone();
    store
        .migrate()
        .await
        .expect("migrates version 1 to the current version");
    let pending = store
        .list(
            &ListQuery::in_progress(Duration::from_secs(365 * 24 * 3600)),
            Deadline::default(),
        )
        .await
        .expect("list");
    let [record] = pending.records.as_slice() else {
        panic!("{pending:?}");
    };
    assert_eq!(record.id.key(), "old-running");
    assert_eq!(record.reserved_at, None, "its age is unknown, so it is old");
    let done = store
        .list(
            &ListQuery::completed("acct").expect("consumer"),
            Deadline::default(),
        )
        .await
        .expect("list");
    assert_eq!(done.records.len(), 1);
    assert!(matches!(
        done.records[0].state,
        ListedState::Completed { status: 201, .. }
    ));
    let stats = store.stats(Deadline::default()).await.expect("stats");
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
    for (statement, index, literals) in [
        (
            include_str!("../sql/list_completed.sql"),
            "_pkey",
            ["'acct'", "''", "''", "''", "10"].as_slice(),
        ),
        // A lookup by key alone (`idem inspect KEY`) reads the key index in its order.
        (
            include_str!("../sql/list_key.sql"),
            "_key",
            ["'k'", "''", "''", "10"].as_slice(),
        ),
        // An operator's page of the records in doubt.
        (
            include_str!("../sql/list_in_doubt.sql"),
            "_in_doubt",
            ["false", "-1", "''", "''", "''", "10"].as_slice(),
        ),
    ] {
        let plan = plan(&store, statement, literals).await;
        assert!(plan.contains(index), "{plan}");
        assert!(!plan.contains("Sort"), "a listing sorts:\n{plan}");
        assert!(!plan.contains("Seq Scan"), "{plan}");
    }
    // A page of pending records reads the reservation-time index (it may sort the in-progress
    // ones it finds there: the index holds the completed records too, so that no index is on a
    // column the completion changes); a reconciler's page of the records in doubt that are due
    // reads the in-doubt index (it may sort the due ones it finds there); a record's audit trail
    // reads its newest entries along the trail's index and sorts only those; the purge finds
    // expired entries through the other.
    for (statement, index, literals) in [
        (
            include_str!("../sql/list_in_progress.sql"),
            "_reserved",
            ["0", "-1", "''", "''", "''", "10"].as_slice(),
        ),
        (
            include_str!("../sql/list_in_doubt.sql"),
            "_in_doubt",
            ["true", "-1", "''", "''", "''", "10"].as_slice(),
        ),
        (
            include_str!("../sql/reconciliations_query.sql"),
            "_trail_record",
            ["'acct'", "'POST /charges'", "'k'", "100"].as_slice(),
        ),
        (
            include_str!("../sql/reconciliations_purge.sql"),
            "_trail_kept",
            ["10"].as_slice(),
        ),
    ] {
        let plan = plan(&store, statement, literals).await;
        assert!(plan.contains(index), "{plan}");
        assert!(!plan.contains("Seq Scan"), "{plan}");
    }
}

/// The plan of one of the store's statements on `store`'s table, with `literals` for `$1..`.
async fn plan(store: &PgStore, statement: &str, literals: &[&str]) -> String {
    let table = store.table();
    let trail = format!("{}_reconciliations\"", &table[..table.len() - 1]);
    let mut sql = statement
        .replace("idem_records_reconciliations", &trail)
        .replace("idem_records", &table);
    for (i, literal) in literals.iter().enumerate().rev() {
        sql = sql.replace(&format!("${}", i + 1), literal);
    }
    // A tiny table is cheaper to scan: forbid that, to see whether an index serves.
    in_schema(
        store.pool(),
        SCHEMA,
        &format!("SET enable_seqscan = off; EXPLAIN {sql}; RESET enable_seqscan"),
    )
    .await
    .iter()
    .map(|row| row.get::<String, _>(0))
    .collect::<Vec<_>>()
    .join("\n")
}

/// C5 while migrating: a migration on a live table never makes reads queue for long behind it,
/// even when another transaction holds the table for seconds (its ALTER waits at most 100 ms
/// at a time, then lets go and tries again), and the index is built concurrently afterwards.
#[tokio::test]
async fn migrating_a_live_table_never_holds_reads_long() {
    let (store, schema) = version_1_store().await;
    let id = idem_core::RecordId::new(
        idem_core::Scope::new("acct", "POST /charges").expect("scope"),
        idem_core::IdempotencyKey::new("absent").expect("key"),
    );
    // Another session's transaction that read the table, open for two seconds.
    let mut other = store.pool().begin().await.expect("begin");
    sqlx::raw_sql(AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{schema}\".idem_records"
    )))
    .execute(&mut *other)
    .await
    .expect("read");
    let migrating = {
        let store = store.clone();
        tokio::spawn(async move { store.migrate().await })
    };
    let mut slowest = Duration::ZERO;
    let until = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < until {
        let started = std::time::Instant::now();
        tokio::time::timeout(
            Duration::from_secs(1),
            store.lookup(&id, Deadline::default()),
        )
        .await
        .expect("a lookup waited a second behind the migration")
        .expect("lookup");
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !migrating.is_finished(),
        "the migration cannot finish while the table is held"
    );
    other.commit().await.expect("commit");
    migrating.await.expect("join").expect("migrate");
    assert!(
        slowest < Duration::from_millis(500),
        "a lookup waited {slowest:?} behind the migration"
    );
    assert_eq!(index_is_valid(&store, &schema).await, Some(true));
}

/// An index build that was interrupted (dropped, or left invalid by a crash or a cancel) is
/// built again by the next migrate.
#[tokio::test]
async fn an_interrupted_index_build_is_built_again() {
    let (store, schema) = version_1_store().await;
    store.migrate().await.expect("migrate");
    assert_eq!(index_is_valid(&store, &schema).await, Some(true));
    let index = format!("\"{schema}\".\"idem_records_reserved\"");
    sqlx::raw_sql(AssertSqlSafe(format!("DROP INDEX {index}")))
        .execute(store.pool())
        .await
        .expect("drop");
    store.migrate().await.expect("migrate");
    assert_eq!(
        index_is_valid(&store, &schema).await,
        Some(true),
        "built again"
    );
    // What an interrupted CREATE INDEX CONCURRENTLY leaves: the index, marked invalid.
    sqlx::query("UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass($1)")
        .bind(&index)
        .execute(store.pool())
        .await
        .expect("invalidate");
    assert_eq!(index_is_valid(&store, &schema).await, Some(false));
    store.migrate().await.expect("migrate");
    assert_eq!(index_is_valid(&store, &schema).await, Some(true), "rebuilt");
}

#[tokio::test]
async fn any_age_can_be_asked_and_long_table_names_are_refused() {
    let (store, _schema) = version_1_store().await;
    store.migrate().await.expect("migrate");
    // A record of unknown age counts as reserved at the epoch, as on every store.
    let ages = [
        (Duration::from_secs(50 * 365 * 24 * 3600), 1),
        (Duration::from_secs(10_000 * 366 * 24 * 3600), 0),
        (Duration::MAX, 0),
    ];
    for (age, listed) in ages {
        let page = store
            .list(&ListQuery::in_progress(age), Deadline::default())
            .await
            .expect("any age can be asked");
        assert_eq!(page.records.len(), listed, "{age:?}");
    }
    // The longest derived name is the audit trail's, `<table>_reconciliations`.
    let longest = "t".repeat(47);
    let too_long = "t".repeat(48);
    assert!(idem_postgres::schema_sql("public", &longest).is_ok());
    assert!(idem_postgres::schema_sql("public", &too_long).is_err());
    let refused = PgStore::builder()
        .table(&too_long)
        .connect(&pg_url())
        .await
        .expect_err("an index name would be cut");
    assert!(refused.to_string().contains("too long"), "{refused}");
}

/// Rolling back to a release of schema version 1 means deleting the version-2 row (the
/// column and index stay); the next upgrade records version 2 again.
#[tokio::test]
async fn a_table_rolled_back_to_version_1_upgrades_again() {
    let (store, schema) = version_1_store().await;
    store.migrate().await.expect("migrate");
    in_schema(
        store.pool(),
        &schema,
        "DELETE FROM idem_schema_migrations WHERE version = 2",
    )
    .await;
    store.migrate().await.expect("upgrades again");
    let version: i64 = in_schema(
        store.pool(),
        &schema,
        "SELECT max(version) FROM idem_schema_migrations",
    )
    .await[0]
        .get(0);
    assert_eq!(version, SCHEMA_VERSION);
    assert_eq!(index_is_valid(&store, &schema).await, Some(true));
}

/// `schema_sql` is one script a migration tool runs in a transaction, twice if it likes; a
/// store on the table it made migrates without changing anything.
#[tokio::test]
async fn the_schema_script_runs_in_a_transaction_and_again() {
    let schema = format!("hand_{}", FencingToken::generate());
    let store = PgStore::builder()
        .schema(&schema)
        .connect(&pg_url())
        .await
        .expect("connect");
    let script = idem_postgres::schema_sql(&schema, "idem_records").expect("valid names");
    for _ in 0..2 {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE SCHEMA IF NOT EXISTS \"{schema}\"; BEGIN; {script} COMMIT;"
        )))
        .execute(store.pool())
        .await
        .expect("applies in a transaction");
    }
    store.migrate().await.expect("migrate");
    assert_eq!(index_is_valid(&store, &schema).await, Some(true));
    assert_eq!(
        store
            .stats(Deadline::default())
            .await
            .expect("stats")
            .total(),
        0
    );
}

/// C11 across processes: a takeover by another process (a second store on the same table with
/// another holder) records the taker and a later time; a start over after the retention clears
/// the completion time and records the new holder.
#[tokio::test]
async fn c11_a_takeover_by_another_process_records_the_taker() {
    let table = format!("holders_{}", FencingToken::generate());
    let first = PgStore::builder()
        .schema(SCHEMA)
        .table(&table)
        .connect(&pg_url())
        .await
        .expect("connect");
    first.migrate().await.expect("migrate");
    let other = idem_ops::Holder::new("web-2.example", 4242, 7, Some(99));
    let second = PgStore::builder()
        .schema(SCHEMA)
        .table(&table)
        .holder(other.clone())
        .connect(&pg_url())
        .await
        .expect("connect");
    idem_ops::testing::c11_a_takeover_and_a_start_over_record_the_new_holder(first, second, &other)
        .await;
}

/// A record whose operator-only instants are out of every range (reservation, completion and
/// check times of `infinity`: a hand-made or restored row) is still shown by `inspect` and
/// listed by the support listings, those instants unknown, as unreadable values are
/// (docs/operations.md): one odd row never hides itself, nor the records listed with it.
#[tokio::test]
async fn c12_infinite_operator_instants_are_unknown_never_a_failed_read() {
    let store = common::store_on(
        &pg_url(),
        idem_postgres::StatementMode::Prepared,
        idem_postgres::Isolation::ReadCommitted,
    )
    .await;
    let idem = idem_core::Idempotency::new(store.clone());
    for key in ["odd", "plain"] {
        let request = idem
            .request("acct_inf", "POST", "/charges")
            .key(Some(key))
            .body(b"{}")
            .build()
            .expect("request");
        let _ = idem
            .run(&request, |_ctx| async {
                Err::<StoredResponse, _>(idem_core::Failure::unknown(std::io::Error::other(
                    "timed out",
                )))
            })
            .await;
    }
    let odd = format!(
        "UPDATE {} SET reserved_at = 'infinity', completed_at = 'infinity', \
         doubt_check_at = 'infinity' WHERE key = 'odd'",
        store.table()
    );
    let changed = sqlx::query(AssertSqlSafe(odd))
        .execute(store.pool())
        .await
        .expect("the odd row");
    assert_eq!(changed.rows_affected(), 1);
    let request = idem
        .request("acct_inf", "POST", "/charges")
        .key(Some("odd"))
        .body(b"{}")
        .build()
        .expect("request");
    let inspected = store
        .inspect(request.id(), Deadline::default())
        .await
        .expect("inspect reads the odd row")
        .expect("a record");
    assert_eq!(inspected.provenance.reserved_at, None);
    assert_eq!(inspected.provenance.completed_at, None);
    assert!(inspected.doubt.is_some(), "still in doubt");
    for query in [
        ListQuery::completed("acct_inf").expect("consumer"),
        ListQuery::key("odd").expect("key"),
    ] {
        let page = store
            .list(&query, Deadline::default())
            .await
            .unwrap_or_else(|e| panic!("{query:?}: {e}"));
        let odd = page
            .records
            .iter()
            .find(|r| r.id.key() == "odd")
            .unwrap_or_else(|| panic!("{query:?}: the odd row is listed"));
        assert_eq!((odd.reserved_at, odd.completed_at), (None, None));
    }
}

/// The counts read every record: an in-progress one reserved at `infinity` (a hand-made row)
/// is counted, and the oldest reservation is read among the finite ones (C12).
#[tokio::test]
async fn c12_stats_count_an_in_progress_record_reserved_at_infinity() {
    let store = common::store_on(
        &pg_url(),
        idem_postgres::StatementMode::Prepared,
        idem_postgres::Isolation::ReadCommitted,
    )
    .await;
    let idem = idem_core::Idempotency::new(store.clone());
    let request = idem
        .request("acct_inf", "POST", "/charges")
        .key(Some("running"))
        .body(b"{}")
        .build()
        .expect("request");
    let begun = idem.begin(&request).await.expect("begin");
    assert!(matches!(begun, idem_core::Begin::Acquired(_)));
    let odd = format!("UPDATE {} SET reserved_at = 'infinity'", store.table());
    sqlx::query(AssertSqlSafe(odd))
        .execute(store.pool())
        .await
        .expect("the odd row");
    let stats = store
        .stats(Deadline::default())
        .await
        .expect("the counts despite the odd row");
    assert_eq!(stats.in_progress, 1);
    assert_eq!(stats.oldest_in_progress, None);
}
