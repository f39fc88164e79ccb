//! The listings' milliseconds since the epoch (C11): `floor(date_part('epoch', t) * 1000 +
//! 0.0005)`, a double, is the same integer as the exact `floor(extract(epoch FROM t) * 1000)`, a
//! numeric, for every microsecond checked from 1970 to 2100. Without the half microsecond the
//! double is a millisecond short on some exact millisecond boundaries (the test shows it), and
//! a deadline read one millisecond early could answer a live record as expired.

mod common;

use common::pg_url;
use idem_postgres::sqlx::{self, PgPool};

/// The expression the listings use, on `t` (a decision's instants come as `timestamptz_send`).
const FAST: &str = "floor(date_part('epoch', t) * 1000 + 0.0005)::bigint";
const EXACT: &str = "floor(extract(epoch FROM t) * 1000)::bigint";
const PLAIN: &str = "floor(date_part('epoch', t) * 1000)::bigint";

/// 200 seconds spread from 1970 to 2100, and in each the microseconds around every millisecond
/// boundary (0 – 2, 498 – 502 and 997 – 999 of each millisecond): 2.2 million instants.
const INSTANTS: &str = "SELECT 'epoch'::timestamptz + b * interval '1 second' \
     + (ms * 1000 + us) * interval '1 microsecond' AS t \
     FROM generate_series(0, 4102444800, 20512224) b, generate_series(0, 999) ms, \
     unnest(ARRAY[0, 1, 2, 498, 499, 500, 501, 502, 997, 998, 999]) us";

async fn disagreements(pool: &PgPool, expression: &str) -> i64 {
    let sql = format!(
        "SELECT count(*) FROM ({INSTANTS}) i WHERE {} <> {}",
        expression, EXACT
    );
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .expect("the comparison")
}

#[tokio::test]
async fn c11_milliseconds_from_a_double_are_the_exact_ones() {
    let pool = PgPool::connect(&pg_url()).await.expect("connect");
    assert_eq!(disagreements(&pool, FAST).await, 0);
    assert!(
        disagreements(&pool, PLAIN).await > 0,
        "without the half microsecond some boundaries come out a millisecond short"
    );
}

#[test]
fn c11_decisions_read_instants_as_sent_and_listings_the_checked_expression() {
    // What the engine decides on comes as `timestamptz_send` (the store rounds it down to the
    // millisecond); nothing computes milliseconds from a double without the half microsecond.
    for (name, sql) in [
        ("reserve.sql", include_str!("../sql/reserve.sql")),
        ("insert.sql", include_str!("../sql/insert.sql")),
        ("read.sql", include_str!("../sql/read.sql")),
        (
            "replace_reservation.sql",
            include_str!("../sql/replace_reservation.sql"),
        ),
        ("renew.sql", include_str!("../sql/renew.sql")),
        (
            "select_record.sql",
            include_str!("../sql/select_record.sql"),
        ),
        (
            "select_settled.sql",
            include_str!("../sql/select_settled.sql"),
        ),
        (
            "select_inspected.sql",
            include_str!("../sql/select_inspected.sql"),
        ),
    ] {
        let code: String = sql
            .lines()
            .map(|line| line.split("--").next().unwrap_or(""))
            .collect();
        assert!(code.contains("timestamptz_send("), "{name}");
        assert!(!code.contains("date_part("), "{name}");
    }
    for (name, sql) in [
        (
            "list_completed.sql",
            include_str!("../sql/list_completed.sql"),
        ),
        (
            "list_in_doubt.sql",
            include_str!("../sql/list_in_doubt.sql"),
        ),
        (
            "list_in_progress.sql",
            include_str!("../sql/list_in_progress.sql"),
        ),
        ("list_key.sql", include_str!("../sql/list_key.sql")),
    ] {
        assert!(!sql.contains("floor(extract("), "{name}");
        assert!(sql.contains("* 1000 + 0.0005)::bigint"), "{name}");
    }
}
