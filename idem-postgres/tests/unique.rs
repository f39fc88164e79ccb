//! The unique-constraint alternative on PostgreSQL (`insert_or_fetch`): an order created once
//! under its partner reference in the caller's transaction, the same answer for every retry, a
//! reused reference answered 422, 32 concurrent creates giving one row (at READ COMMITTED and
//! SERIALIZABLE), a duplicate waiting for the first transaction, and another constraint's
//! violation kept an error. Needs `IDEM_PG_URL` (a failure, never a skip, without it).

mod common;

use idem_core::{Answer, Begin, Error, FencingToken, StoreErrorKind};
use idem_postgres::sqlx::postgres::{PgPoolOptions, PgRow};
use idem_postgres::sqlx::{self, AssertSqlSafe, FromRow, PgConnection, PgPool, Row};
use idem_postgres::{insert_or_fetch, unique_violation};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Order {
    id: i64,
    partner_ref: String,
    cents: i64,
    created_at: String,
}

impl FromRow<'_, PgRow> for Order {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        Ok(Order {
            id: row.try_get("id")?,
            partner_ref: row.try_get("partner_ref")?,
            cents: row.try_get("cents")?,
            created_at: row.try_get("created_at")?,
        })
    }
}

impl Order {
    /// Rendered from the row alone (references are `[A-Za-z0-9-]`, nothing to escape).
    fn to_json(&self) -> Vec<u8> {
        format!(
            r#"{{"id":{},"partner_ref":"{}","cents":{},"created_at":"{}"}}"#,
            self.id, self.partner_ref, self.cents, self.created_at
        )
        .into_bytes()
    }
}

/// An HTTP answer: status and body.
type Reply = (u16, Vec<u8>);

/// A table of orders of its own in `idem_test`, and the statements on it.
struct Shop {
    pool: PgPool,
    table: String,
    insert: String,
    fetch: String,
}

impl Shop {
    async fn new() -> Self {
        let pool = PgPoolOptions::new()
            .max_connections(40)
            .connect(&common::pg_url())
            .await
            .expect("connect");
        let name = format!("uo_{}", &FencingToken::generate().to_string()[..12]);
        let table = format!("{}.{name}", common::SCHEMA);
        // Concurrent CREATE SCHEMA IF NOT EXISTS can collide in the catalog: serialize them.
        let mut tx = pool.begin().await.expect("begin");
        sqlx::raw_sql(AssertSqlSafe(format!(
            "SELECT pg_advisory_xact_lock(4242); \
             CREATE SCHEMA IF NOT EXISTS {schema}; \
             CREATE TABLE {table} ( \
                 id bigserial PRIMARY KEY, \
                 partner_ref text NOT NULL CONSTRAINT {name}_ref UNIQUE, \
                 cents bigint NOT NULL, \
                 email text CONSTRAINT {name}_email UNIQUE, \
                 created_at timestamptz NOT NULL DEFAULT clock_timestamp())",
            schema = common::SCHEMA,
        )))
        .execute(&mut *tx)
        .await
        .expect("orders table");
        tx.commit().await.expect("commit");
        let columns = "id, partner_ref, cents, created_at::text AS created_at";
        Shop {
            insert: format!(
                "INSERT INTO {table} (partner_ref, cents, email) VALUES ($1, $2, $3) \
                 ON CONFLICT (partner_ref) DO NOTHING RETURNING {columns}"
            ),
            fetch: format!("SELECT {columns} FROM {table} WHERE partner_ref = $1"),
            pool,
            table,
        }
    }

    /// The constraint's name, as PostgreSQL reports it.
    fn constraint(&self, suffix: &str) -> String {
        let name = self.table.rsplit('.').next().unwrap_or_default();
        format!("{name}_{suffix}")
    }

    /// `POST /orders` in the caller's transaction: the insert-or-fetch and the answer.
    async fn create(
        &self,
        conn: &mut PgConnection,
        partner_ref: &str,
        cents: i64,
        email: Option<&str>,
    ) -> Result<Reply, Error> {
        assert!(partner_ref
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-'));
        let created = insert_or_fetch(
            conn,
            || {
                sqlx::query_as(AssertSqlSafe(self.insert.clone()))
                    .bind(partner_ref)
                    .bind(cents)
                    .bind(email)
            },
            || sqlx::query_as(AssertSqlSafe(self.fetch.clone())).bind(partner_ref),
            |order: &Order| order.cents == cents,
        )
        .await?;
        Ok(match created {
            Begin::Acquired(order) => (201, order.to_json()),
            Begin::Answered(Answer::Replay(order)) => (200, order.to_json()),
            Begin::Answered(_) => (
                422,
                br#"{"error":"partner_ref was used for another order"}"#.to_vec(),
            ),
        })
    }

    /// The same in a transaction of its own (`begin` at an isolation level), committed.
    async fn post_with(
        &self,
        begin: &'static str,
        partner_ref: &str,
        cents: i64,
        email: Option<&str>,
    ) -> Result<Reply, Error> {
        let mut tx = self.pool.begin_with(begin).await.map_err(fail)?;
        let answer = self.create(&mut tx, partner_ref, cents, email).await?;
        tx.commit().await.map_err(fail)?;
        Ok(answer)
    }

    async fn post(&self, partner_ref: &str, cents: i64) -> Result<Reply, Error> {
        self.post_with("BEGIN", partner_ref, cents, None).await
    }

    async fn rows(&self, partner_ref: &str) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM {} WHERE partner_ref = $1",
            self.table
        )))
        .bind(partner_ref)
        .fetch_one(&self.pool)
        .await
        .expect("count")
    }

    async fn drop_table(self) {
        sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE {}", self.table)))
            .execute(&self.pool)
            .await
            .expect("drop");
        self.pool.close().await;
    }
}

/// A sqlx error of the test's own statements (BEGIN, COMMIT), with PostgreSQL's conflicts kept.
fn fail(error: sqlx::Error) -> Error {
    let code = error
        .as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned());
    let kind = match code.as_deref() {
        Some("40001" | "40P01") => StoreErrorKind::TransactionConflict,
        _ => StoreErrorKind::Other,
    };
    Error::store("postgres", kind, error)
}

fn is_conflict(error: &Error) -> bool {
    error
        .as_store()
        .is_some_and(|e| e.kind() == StoreErrorKind::TransactionConflict)
}

#[tokio::test]
async fn a_new_order_is_inserted_and_answered_201() {
    let shop = Shop::new().await;
    let (status, body) = shop.post("PO-1001", 2500).await.expect("create");
    assert_eq!(status, 201);
    let body = String::from_utf8(body).expect("utf-8");
    assert!(
        body.starts_with(r#"{"id":1,"partner_ref":"PO-1001","cents":2500,"created_at":""#),
        "{body}"
    );
    assert_eq!(shop.rows("PO-1001").await, 1);
    shop.drop_table().await;
}

#[tokio::test]
async fn the_same_order_again_answers_200_with_the_same_body() {
    let shop = Shop::new().await;
    let first = shop.post("PO-1002", 2500).await.expect("create");
    // Later, so a body rebuilt from the request instead of the row would differ.
    tokio::time::sleep(Duration::from_millis(5)).await;
    for _ in 0..3 {
        let again = shop.post("PO-1002", 2500).await.expect("retry");
        assert_eq!(again.0, 200);
        assert_eq!(again.1, first.1, "byte-identical JSON");
    }
    // On a bare connection (each statement committing on its own) too.
    let mut conn = shop.pool.acquire().await.expect("acquire");
    let again = shop
        .create(&mut conn, "PO-1002", 2500, None)
        .await
        .expect("retry");
    assert_eq!(again, (200, first.1.clone()));
    drop(conn);
    assert_eq!(first.0, 201);
    assert_eq!(shop.rows("PO-1002").await, 1);
    shop.drop_table().await;
}

#[tokio::test]
async fn the_same_number_with_another_amount_is_a_mismatch_and_the_row_is_kept() {
    let shop = Shop::new().await;
    let first = shop.post("PO-1003", 2500).await.expect("create");
    let reused = shop.post("PO-1003", 9900).await.expect("reuse");
    assert_eq!(reused.0, 422);
    assert_ne!(reused.1, first.1);
    let again = shop.post("PO-1003", 2500).await.expect("retry");
    assert_eq!(again, (200, first.1));
    let cents: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT cents FROM {} WHERE partner_ref = 'PO-1003'",
        shop.table
    )))
    .fetch_one(&shop.pool)
    .await
    .expect("cents");
    assert_eq!(cents, 2500);
    assert_eq!(shop.rows("PO-1003").await, 1);
    shop.drop_table().await;
}

/// 32 tasks, each in a transaction of its own on its own connection, create one order at once;
/// the one that inserts holds its transaction a little, so the others meet its uncommitted row.
/// A transaction conflict (REPEATABLE READ, SERIALIZABLE) is retried whole, as a client would.
async fn concurrent_creates(begin: &'static str) -> usize {
    const TASKS: usize = 32;
    const ROUNDS: usize = 3;
    let shop = Arc::new(Shop::new().await);
    let conflicts = Arc::new(AtomicUsize::new(0));
    for round in 0..ROUNDS {
        let partner_ref = format!("PO-2000-{round}");
        let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let (shop, barrier, conflicts, partner_ref) = (
                    Arc::clone(&shop),
                    Arc::clone(&barrier),
                    Arc::clone(&conflicts),
                    partner_ref.clone(),
                );
                tokio::spawn(async move {
                    let mut first = true;
                    loop {
                        let mut tx = shop.pool.begin_with(begin).await.map_err(fail)?;
                        if first {
                            barrier.wait().await;
                            first = false;
                        }
                        let answer = match shop.create(&mut tx, &partner_ref, 4200, None).await {
                            Ok(answer) => answer,
                            Err(e) if is_conflict(&e) => {
                                conflicts.fetch_add(1, Ordering::Relaxed);
                                continue; // the transaction rolls back as it drops
                            }
                            Err(e) => return Err(e),
                        };
                        if answer.0 == 201 {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        match tx.commit().await.map_err(fail) {
                            Ok(()) => return Ok::<_, Error>(answer),
                            Err(e) if is_conflict(&e) => {
                                conflicts.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => return Err(e),
                        }
                    }
                })
            })
            .collect();
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.expect("join").expect("create"));
        }
        assert_eq!(shop.rows(&partner_ref).await, 1, "{begin}, round {round}");
        assert_eq!(
            answers.iter().filter(|(s, _)| *s == 201).count(),
            1,
            "{begin}, round {round}"
        );
        assert_eq!(
            answers.iter().filter(|(s, _)| *s == 200).count(),
            TASKS - 1,
            "{begin}, round {round}"
        );
        let bodies: BTreeSet<_> = answers.iter().map(|(_, body)| body.clone()).collect();
        assert_eq!(
            bodies.len(),
            1,
            "{begin}, round {round}: 32 identical bodies"
        );
    }
    if let Ok(shop) = Arc::try_unwrap(shop) {
        shop.drop_table().await;
    }
    conflicts.load(Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_at_read_committed_give_one_row_and_32_identical_answers() {
    let conflicts = concurrent_creates("BEGIN ISOLATION LEVEL READ COMMITTED").await;
    // At READ COMMITTED a duplicate waits for the first transaction and reads its row.
    assert_eq!(conflicts, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_at_serializable_give_one_row_and_32_identical_answers() {
    concurrent_creates("BEGIN ISOLATION LEVEL SERIALIZABLE").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_at_repeatable_read_give_one_row_and_32_identical_answers() {
    concurrent_creates("BEGIN ISOLATION LEVEL REPEATABLE READ").await;
}

/// Waits until a backend waits for a lock while inserting into `table`.
async fn until_an_insert_waits(pool: &PgPool, table: &str) {
    let name = table.rsplit('.').next().unwrap_or_default().to_owned();
    for _ in 0..500 {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity \
             WHERE wait_event_type = 'Lock' AND query LIKE '%INSERT INTO%' AND query LIKE '%' || $1 || '%'",
        )
        .bind(&name)
        .fetch_one(pool)
        .await
        .expect("pg_stat_activity");
        if waiting > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no INSERT into {table} ever waited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_waits_for_the_first_transaction_then_answers_its_row() {
    let shop = Arc::new(Shop::new().await);
    let mut first_tx = shop.pool.begin().await.expect("begin");
    let first = shop
        .create(&mut first_tx, "PO-6001", 2500, None)
        .await
        .expect("create");
    assert_eq!(first.0, 201);
    let duplicate = tokio::spawn({
        let shop = Arc::clone(&shop);
        async move { shop.post("PO-6001", 2500).await }
    });
    until_an_insert_waits(&shop.pool, &shop.table).await;
    assert!(!duplicate.is_finished(), "the duplicate waits on the row");
    first_tx.commit().await.expect("commit");
    let again = duplicate.await.expect("join").expect("duplicate");
    assert_eq!(again, (200, first.1));
    assert_eq!(shop.rows("PO-6001").await, 1);
    if let Ok(shop) = Arc::try_unwrap(shop) {
        shop.drop_table().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_of_a_transaction_that_rolls_back_inserts() {
    let shop = Arc::new(Shop::new().await);
    let mut first_tx = shop.pool.begin().await.expect("begin");
    let first = shop
        .create(&mut first_tx, "PO-6002", 2500, None)
        .await
        .expect("create");
    assert_eq!(first.0, 201);
    let duplicate = tokio::spawn({
        let shop = Arc::clone(&shop);
        async move { shop.post("PO-6002", 2500).await }
    });
    until_an_insert_waits(&shop.pool, &shop.table).await;
    first_tx.rollback().await.expect("rollback");
    let (status, _) = duplicate.await.expect("join").expect("duplicate");
    assert_eq!(status, 201, "the key was free again");
    assert_eq!(shop.rows("PO-6002").await, 1);
    if let Ok(shop) = Arc::try_unwrap(shop) {
        shop.drop_table().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_repeatable_read_a_duplicate_of_a_row_it_cannot_see_is_a_conflict_and_the_retry_answers_it(
) {
    let shop = Arc::new(Shop::new().await);
    let mut first_tx = shop.pool.begin().await.expect("begin");
    let first = shop
        .create(&mut first_tx, "PO-6003", 2500, None)
        .await
        .expect("create");
    let duplicate = tokio::spawn({
        let shop = Arc::clone(&shop);
        async move {
            shop.post_with(
                "BEGIN ISOLATION LEVEL REPEATABLE READ",
                "PO-6003",
                2500,
                None,
            )
            .await
        }
    });
    until_an_insert_waits(&shop.pool, &shop.table).await;
    first_tx.commit().await.expect("commit");
    let err = duplicate
        .await
        .expect("join")
        .expect_err("the row is not in the snapshot");
    assert!(is_conflict(&err), "{err:?}");
    assert!(err.is_retryable());
    let again = shop
        .post_with(
            "BEGIN ISOLATION LEVEL REPEATABLE READ",
            "PO-6003",
            2500,
            None,
        )
        .await
        .expect("the retry");
    assert_eq!(again, (200, first.1));
    if let Ok(shop) = Arc::try_unwrap(shop) {
        shop.drop_table().await;
    }
}

#[tokio::test]
async fn another_unique_constraint_is_an_error_not_a_duplicate() {
    let shop = Shop::new().await;
    let first = shop
        .post_with("BEGIN", "PO-3001", 2500, Some("buyer@example.com"))
        .await
        .expect("create");
    assert_eq!(first.0, 201);
    // Another order, the same email: the email's constraint, not the partner reference's.
    let mut tx = shop.pool.begin().await.expect("begin");
    let err = shop
        .create(&mut tx, "PO-3002", 2500, Some("buyer@example.com"))
        .await
        .expect_err("a violation of the email's constraint");
    let store_err = err.as_store().expect("a store error");
    assert_eq!(store_err.backend(), "postgres");
    assert_eq!(store_err.kind(), StoreErrorKind::Other);
    assert!(!err.is_retryable());
    assert_eq!(
        unique_violation(&err),
        Some(shop.constraint("email").as_str())
    );
    let code = store_err
        .source_ref()
        .downcast_ref::<sqlx::Error>()
        .and_then(|e| e.as_database_error())
        .and_then(|e| e.code())
        .map(|c| c.into_owned());
    assert_eq!(code.as_deref(), Some("23505"));
    tx.rollback().await.expect("rollback");
    assert_eq!(shop.rows("PO-3002").await, 0);
    assert_eq!(shop.rows("PO-3001").await, 1);
    // A duplicate of the first is still a duplicate, with its email.
    let again = shop
        .post_with("BEGIN", "PO-3001", 2500, Some("buyer@example.com"))
        .await
        .expect("retry");
    assert_eq!(again, (200, first.1));
    // The key's own violation, from a plain INSERT, is named too.
    let plain = sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {} (partner_ref, cents) VALUES ('PO-3001', 1)",
        shop.table
    )))
    .execute(&shop.pool)
    .await
    .expect_err("a duplicate key");
    let plain = Error::store("postgres", StoreErrorKind::Other, plain);
    assert_eq!(
        unique_violation(&plain),
        Some(shop.constraint("ref").as_str())
    );
    shop.drop_table().await;
}

#[tokio::test]
async fn a_bare_on_conflict_that_swallows_another_violation_is_misconfigured_not_a_duplicate() {
    let shop = Shop::new().await;
    shop.post_with("BEGIN", "PO-4001", 2500, Some("taken@example.com"))
        .await
        .expect("create");
    let bare = format!(
        "INSERT INTO {} (partner_ref, cents, email) VALUES ($1, 2500, 'taken@example.com') \
         ON CONFLICT DO NOTHING RETURNING id, partner_ref, cents, created_at::text AS created_at",
        shop.table
    );
    let mut tx = shop.pool.begin().await.expect("begin");
    let err = insert_or_fetch(
        &mut tx,
        || sqlx::query_as::<_, Order>(AssertSqlSafe(bare.clone())).bind("PO-4002"),
        || sqlx::query_as(AssertSqlSafe(shop.fetch.clone())).bind("PO-4002"),
        |_| true,
    )
    .await
    .expect_err("no row under the key");
    assert_eq!(
        err.as_store().map(|e| e.kind()),
        Some(StoreErrorKind::Misconfigured)
    );
    assert_eq!(unique_violation(&err), None);
    tx.rollback().await.expect("rollback");
    assert_eq!(shop.rows("PO-4002").await, 0);
    shop.drop_table().await;
}

#[tokio::test]
async fn a_row_deleted_between_the_insert_and_the_fetch_is_inserted_again() {
    let shop = Shop::new().await;
    shop.post("PO-5001", 2500).await.expect("create");
    // The first fetch deletes the row (as another transaction would between the two
    // statements) and finds nothing; the INSERT then runs again and inserts.
    let delete_then_find_nothing = format!(
        "WITH gone AS (DELETE FROM {} WHERE partner_ref = $1 RETURNING 1) \
         SELECT 0::bigint AS id, '' AS partner_ref, 0::bigint AS cents, '' AS created_at \
         FROM gone WHERE false",
        shop.table
    );
    let (inserts, fetches) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let mut tx = shop.pool.begin().await.expect("begin");
    let created = insert_or_fetch(
        &mut tx,
        || {
            inserts.fetch_add(1, Ordering::SeqCst);
            sqlx::query_as::<_, Order>(AssertSqlSafe(shop.insert.clone()))
                .bind("PO-5001")
                .bind(2500_i64)
                .bind(None::<String>)
        },
        || {
            let sql = if fetches.fetch_add(1, Ordering::SeqCst) == 0 {
                delete_then_find_nothing.clone()
            } else {
                shop.fetch.clone()
            };
            sqlx::query_as(AssertSqlSafe(sql)).bind("PO-5001")
        },
        |_| true,
    )
    .await
    .expect("insert_or_fetch");
    tx.commit().await.expect("commit");
    let Begin::Acquired(created) = created else {
        panic!("inserted on the retry: {created:?}");
    };
    assert_eq!(created.partner_ref, "PO-5001");
    assert_eq!(inserts.load(Ordering::SeqCst), 2);
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    assert_eq!(shop.rows("PO-5001").await, 1);
    shop.drop_table().await;
}

#[tokio::test]
async fn store_errors_keep_their_nature() {
    let shop = Shop::new().await;
    let mut conn = shop.pool.acquire().await.expect("acquire");
    let err = insert_or_fetch(
        &mut conn,
        || {
            sqlx::query_as::<_, (i64,)>(
                "INSERT INTO idem_test.nowhere (k) VALUES (1) ON CONFLICT (k) DO NOTHING RETURNING k",
            )
        },
        || sqlx::query_as("SELECT k FROM idem_test.nowhere"),
        |_| true,
    )
    .await
    .expect_err("no such table");
    assert_eq!(
        err.as_store().map(|e| (e.backend(), e.kind())),
        Some(("postgres", StoreErrorKind::Misconfigured))
    );
    assert_eq!(unique_violation(&err), None);
    drop(conn);
    shop.drop_table().await;
}
