//! The unique-constraint alternative on SQLite (`insert_or_fetch`): an order created once under
//! its partner reference, the same answer for every retry, a reused reference answered 422, 32
//! concurrent creates over several connections giving one row, and another constraint's
//! violation kept an error.

use idem_core::{Answer, Begin, Error, StoreErrorKind};
use idem_sqlite::rusqlite::{
    self, params, Connection, OptionalExtension, Row, TransactionBehavior,
};
use idem_sqlite::{insert_or_fetch, unique_violation, SqliteStore};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const SCHEMA: &str = "CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    partner_ref TEXT NOT NULL,
    cents INTEGER NOT NULL,
    email TEXT,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    UNIQUE (partner_ref),
    UNIQUE (email)
)";

const INSERT: &str = "INSERT INTO orders (partner_ref, cents, email) VALUES (?1, ?2, ?3) \
     ON CONFLICT (partner_ref) DO NOTHING RETURNING id, partner_ref, cents, created_at";
const FETCH: &str = "SELECT id, partner_ref, cents, created_at FROM orders WHERE partner_ref = ?1";

#[derive(Debug, Clone, PartialEq, Eq)]
struct Order {
    id: i64,
    partner_ref: String,
    cents: i64,
    created_at: String,
}

impl Order {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Order {
            id: row.get(0)?,
            partner_ref: row.get(1)?,
            cents: row.get(2)?,
            created_at: row.get(3)?,
        })
    }

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

/// `POST /orders` in the caller's connection: the insert-or-fetch and the answer.
fn create_order(
    db: &Connection,
    partner_ref: &str,
    cents: i64,
    email: Option<&str>,
) -> Result<Reply, Error> {
    assert!(partner_ref
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    let created = insert_or_fetch(
        db,
        |db| {
            db.query_row(INSERT, params![partner_ref, cents, email], Order::from_row)
                .optional()
        },
        |db| {
            db.query_row(FETCH, params![partner_ref], Order::from_row)
                .optional()
        },
        |order| order.cents == cents,
    )?;
    Ok(match created {
        Begin::Acquired(order) => (201, order.to_json()),
        Begin::Answered(Answer::Replay(order)) => (200, order.to_json()),
        Begin::Answered(_) => (
            422,
            br#"{"error":"partner_ref was used for another order"}"#.to_vec(),
        ),
    })
}

/// The same in a write transaction of its own, committed.
fn create_order_in_tx(
    db: &mut Connection,
    behavior: TransactionBehavior,
    partner_ref: &str,
    cents: i64,
) -> Result<Reply, Error> {
    let fail = |e| Error::store("sqlite", StoreErrorKind::Other, e);
    let tx = db.transaction_with_behavior(behavior).map_err(fail)?;
    let answer = create_order(&tx, partner_ref, cents, None)?;
    tx.commit().map_err(fail)?;
    Ok(answer)
}

/// A store on a database file of its own, with the orders table.
async fn shop() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("shop.db"))
        .await
        .expect("open");
    store
        .try_call(|db| db.execute_batch(SCHEMA))
        .await
        .expect("orders table");
    (dir, store)
}

async fn rows(store: &SqliteStore, partner_ref: &str) -> i64 {
    let partner_ref = partner_ref.to_owned();
    store
        .try_call(move |db| {
            db.query_row(
                "SELECT COUNT(*) FROM orders WHERE partner_ref = ?1",
                [partner_ref],
                |row| row.get(0),
            )
        })
        .await
        .expect("count")
}

async fn post(store: &SqliteStore, partner_ref: &str, cents: i64) -> Result<Reply, Error> {
    let partner_ref = partner_ref.to_owned();
    store
        .call(move |db| create_order_in_tx(db, TransactionBehavior::Immediate, &partner_ref, cents))
        .await?
}

#[tokio::test]
async fn a_new_order_is_inserted_and_answered_201() {
    let (_dir, store) = shop().await;
    let (status, body) = post(&store, "PO-1001", 2500).await.expect("create");
    assert_eq!(status, 201);
    let body = String::from_utf8(body).expect("utf-8");
    assert!(
        body.starts_with(r#"{"id":1,"partner_ref":"PO-1001","cents":2500,"created_at":""#),
        "{body}"
    );
    assert_eq!(rows(&store, "PO-1001").await, 1);
}

#[tokio::test]
async fn the_same_order_again_answers_200_with_the_same_body() {
    let (_dir, store) = shop().await;
    let first = post(&store, "PO-1002", 2500).await.expect("create");
    // Later, so a body rebuilt from the request instead of the row would differ.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    for _ in 0..3 {
        let again = post(&store, "PO-1002", 2500).await.expect("retry");
        assert_eq!(again.0, 200);
        assert_eq!(again.1, first.1, "byte-identical JSON");
    }
    assert_eq!(first.0, 201);
    assert_eq!(rows(&store, "PO-1002").await, 1);
}

#[tokio::test]
async fn the_same_number_with_another_amount_is_a_mismatch_and_the_row_is_kept() {
    let (_dir, store) = shop().await;
    let first = post(&store, "PO-1003", 2500).await.expect("create");
    let reused = post(&store, "PO-1003", 9900).await.expect("reuse");
    assert_eq!(reused.0, 422);
    assert_ne!(reused.1, first.1);
    // The row is the first request's, and a retry of the first still answers it.
    let again = post(&store, "PO-1003", 2500).await.expect("retry");
    assert_eq!(again, (200, first.1));
    let cents: i64 = store
        .try_call(|db| {
            db.query_row(
                "SELECT cents FROM orders WHERE partner_ref = 'PO-1003'",
                [],
                |row| row.get(0),
            )
        })
        .await
        .expect("cents");
    assert_eq!(cents, 2500);
    assert_eq!(rows(&store, "PO-1003").await, 1);
}

/// Four ways in: the store's writer queue, and connections of their own in an IMMEDIATE
/// transaction, a DEFERRED one, or none (each statement committing on its own).
#[derive(Clone, Copy, Debug)]
enum Way {
    StoreWriter,
    Immediate,
    Deferred,
    Autocommit,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_over_several_connections_give_one_row_and_32_identical_answers() {
    const TASKS: usize = 32;
    const ROUNDS: usize = 5;
    let (_dir, store) = shop().await;
    let ways = [
        Way::StoreWriter,
        Way::Immediate,
        Way::Deferred,
        Way::Autocommit,
    ];
    for round in 0..ROUNDS {
        let partner_ref = format!("PO-2000-{round}");
        let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                let way = ways[task % ways.len()];
                let (store, barrier, partner_ref) =
                    (store.clone(), Arc::clone(&barrier), partner_ref.clone());
                tokio::spawn(async move {
                    let own = match way {
                        Way::StoreWriter => None,
                        _ => Some(store.connect()?),
                    };
                    barrier.wait().await;
                    let answer = match (way, own) {
                        (Way::StoreWriter, _) | (_, None) => {
                            store
                                .call(move |db| {
                                    create_order_in_tx(
                                        db,
                                        TransactionBehavior::Immediate,
                                        &partner_ref,
                                        4200,
                                    )
                                })
                                .await??
                        }
                        (way, Some(mut db)) => tokio::task::spawn_blocking(move || match way {
                            Way::Deferred => create_order_in_tx(
                                &mut db,
                                TransactionBehavior::Deferred,
                                &partner_ref,
                                4200,
                            ),
                            Way::Autocommit => create_order(&db, &partner_ref, 4200, None),
                            _ => create_order_in_tx(
                                &mut db,
                                TransactionBehavior::Immediate,
                                &partner_ref,
                                4200,
                            ),
                        })
                        .await
                        .expect("join")?,
                    };
                    Ok::<_, Error>((way, answer))
                })
            })
            .collect();
        let mut answers = Vec::new();
        for task in tasks {
            let (way, answer) = task.await.expect("join").expect("create");
            answers.push((way, answer));
        }
        assert_eq!(rows(&store, &partner_ref).await, 1, "round {round}");
        let created: Vec<_> = answers.iter().filter(|(_, (s, _))| *s == 201).collect();
        assert_eq!(created.len(), 1, "round {round}: {created:?}");
        assert_eq!(
            answers.iter().filter(|(_, (s, _))| *s == 200).count(),
            TASKS - 1,
            "round {round}"
        );
        let bodies: BTreeSet<_> = answers.iter().map(|(_, (_, body))| body.clone()).collect();
        assert_eq!(bodies.len(), 1, "round {round}: 32 identical bodies");
    }
}

#[tokio::test]
async fn another_unique_constraint_is_an_error_not_a_duplicate() {
    let (_dir, store) = shop().await;
    let first = store
        .call(|db| create_order(db, "PO-3001", 2500, Some("buyer@example.com")))
        .await
        .expect("call")
        .expect("create");
    assert_eq!(first.0, 201);
    // Another order, the same email: the email's constraint, not the partner reference's.
    let err = store
        .call(|db| create_order(db, "PO-3002", 2500, Some("buyer@example.com")))
        .await
        .expect("call")
        .expect_err("a violation of the email's constraint");
    let store_err = err.as_store().expect("a store error");
    assert_eq!(store_err.backend(), "sqlite");
    assert_eq!(store_err.kind(), StoreErrorKind::Other);
    assert!(!err.is_retryable());
    assert_eq!(unique_violation(&err), Some("orders.email"));
    let source = store_err
        .source_ref()
        .downcast_ref::<rusqlite::Error>()
        .expect("the rusqlite error");
    assert!(matches!(
        source,
        rusqlite::Error::SqliteFailure(f, _) if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
    ));
    assert_eq!(rows(&store, "PO-3002").await, 0);
    assert_eq!(rows(&store, "PO-3001").await, 1);
    // A duplicate of the first is still a duplicate, with its email.
    let again = store
        .call(|db| create_order(db, "PO-3001", 2500, Some("buyer@example.com")))
        .await
        .expect("call")
        .expect("retry");
    assert_eq!(again, (200, first.1));
}

#[tokio::test]
async fn a_bare_on_conflict_that_swallows_another_violation_is_misconfigured_not_a_duplicate() {
    let (_dir, store) = shop().await;
    post(&store, "PO-4001", 2500).await.expect("create");
    store
        .try_call(|db| {
            db.execute(
                "UPDATE orders SET email = 'taken@example.com' WHERE partner_ref = 'PO-4001'",
                [],
            )
        })
        .await
        .expect("email");
    let err = store
        .call(|db| {
            insert_or_fetch(
                db,
                |db| {
                    // No conflict target: the email's violation is skipped too.
                    db.query_row(
                        "INSERT INTO orders (partner_ref, cents, email) VALUES ('PO-4002', 2500, 'taken@example.com') \
                         ON CONFLICT DO NOTHING RETURNING id, partner_ref, cents, created_at",
                        [],
                        Order::from_row,
                    )
                    .optional()
                },
                |db| {
                    db.query_row(FETCH, ["PO-4002"], Order::from_row)
                        .optional()
                },
                |_| true,
            )
        })
        .await
        .expect("call")
        .expect_err("no row under the key");
    assert_eq!(
        err.as_store().map(|e| e.kind()),
        Some(StoreErrorKind::Misconfigured)
    );
    assert_eq!(unique_violation(&err), None);
    assert_eq!(rows(&store, "PO-4002").await, 0);
}

#[tokio::test]
async fn a_row_deleted_between_the_insert_and_the_fetch_is_inserted_again() {
    let (_dir, store) = shop().await;
    post(&store, "PO-5001", 2500).await.expect("create");
    let (inserts, fetches) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (i, f) = (Arc::clone(&inserts), Arc::clone(&fetches));
    let created = store
        .call(move |db| {
            insert_or_fetch(
                db,
                |db| {
                    i.fetch_add(1, Ordering::SeqCst);
                    db.query_row(
                        INSERT,
                        params!["PO-5001", 2500, None::<String>],
                        Order::from_row,
                    )
                    .optional()
                },
                |db| {
                    if f.fetch_add(1, Ordering::SeqCst) == 0 {
                        // Another connection deletes the order between the two statements.
                        db.execute("DELETE FROM orders WHERE partner_ref = 'PO-5001'", [])?;
                    }
                    db.query_row(FETCH, ["PO-5001"], Order::from_row).optional()
                },
                |_| true,
            )
        })
        .await
        .expect("call")
        .expect("insert_or_fetch");
    let Begin::Acquired(created) = created else {
        panic!("inserted on the retry: {created:?}");
    };
    assert_eq!(created.partner_ref, "PO-5001");
    assert_eq!(inserts.load(Ordering::SeqCst), 2);
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    assert_eq!(rows(&store, "PO-5001").await, 1);
}

#[tokio::test]
async fn store_errors_keep_their_nature() {
    let (_dir, store) = shop().await;
    let err = store
        .call(|db| {
            insert_or_fetch(
                db,
                |db| {
                    db.query_row(
                        "INSERT INTO nowhere (k) VALUES (1) ON CONFLICT (k) DO NOTHING RETURNING k",
                        [],
                        |row| row.get::<_, i64>(0),
                    )
                    .optional()
                },
                |db| {
                    db.query_row("SELECT k FROM nowhere", [], |row| row.get(0))
                        .optional()
                },
                |_| true,
            )
        })
        .await
        .expect("call")
        .expect_err("no such table");
    assert_eq!(
        err.as_store().map(|e| (e.backend(), e.kind())),
        Some(("sqlite", StoreErrorKind::Misconfigured))
    );
    assert_eq!(unique_violation(&err), None);
}
