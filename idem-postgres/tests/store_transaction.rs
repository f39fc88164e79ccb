//! `PgStore::transaction`: the guard form's transaction on the store's own connections. It
//! commits or rolls back with the effect and the completion (C6), its connection is reused
//! after a transaction that ended cleanly, and one dropped mid-transaction is closed, never
//! reused, with nothing committed (C13).

mod common;

use common::{charges, pg_url, store_on};
use idem_core::{Answer, Begin, FencingToken, Idempotency, StoredResponse};
use idem_postgres::sqlx::{self, Row};
use idem_postgres::{Isolation, PgStore, PgTransaction, StatementMode};

async fn backend(tx: &mut PgTransaction<'_>) -> i32 {
    let row = sqlx::query("SELECT pg_backend_pid()")
        .fetch_one(&mut **tx)
        .await
        .expect("backend pid");
    row.try_get(0).expect("a pid")
}

async fn charge(tx: &mut PgTransaction<'_>, intent: &str) {
    sqlx::query("INSERT INTO idem_test.charges (intent) VALUES ($1)")
        .bind(intent)
        .execute(&mut **tx)
        .await
        .expect("charge");
}

async fn one_connection_store() -> PgStore {
    let store = store_on(&pg_url(), StatementMode::Prepared, Isolation::ReadCommitted).await;
    // A store of one connection per stack, on the same table.
    let one = PgStore::builder()
        .schema(common::SCHEMA)
        .table(
            store
                .table()
                .rsplit('.')
                .next()
                .expect("table")
                .trim_matches('"'),
        )
        .max_connections(1)
        .connect(&pg_url())
        .await
        .expect("connect");
    one.migrate().await.expect("migrate");
    one
}

#[tokio::test]
async fn c6_the_effect_and_the_completion_commit_together_on_the_stores_transaction() {
    let store = one_connection_store().await;
    let idem = Idempotency::new(store.clone());
    let intent = format!("guard-{}", FencingToken::generate());
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some(&intent))
        .body(b"{}")
        .build()
        .expect("request");
    let Ok(Begin::Acquired(lease)) = idem.begin(&request).await else {
        panic!("a fresh key is acquired")
    };
    let mut tx = store.transaction().await.expect("transaction");
    charge(&mut tx, &intent).await;
    let completion = idem.completion(&lease, StoredResponse::new(201, "charged"));
    store
        .complete_in(&mut tx, &completion)
        .await
        .expect("complete_in");
    tx.commit().await.expect("commit");
    assert_eq!(charges(store.pool(), &intent).await, 1);
    let again = idem.begin(&request).await.expect("begin again");
    assert!(
        matches!(again, Begin::Answered(Answer::Replay(_))),
        "{again:?}"
    );
}

#[tokio::test]
async fn c13_a_dropped_transaction_commits_nothing_and_its_connection_is_not_reused() {
    let store = one_connection_store().await;
    let intent = format!("dropped-{}", FencingToken::generate());

    let mut tx = store.transaction().await.expect("transaction");
    let first = backend(&mut tx).await;
    tx.commit().await.expect("commit");
    let mut tx = store.transaction().await.expect("transaction");
    assert_eq!(
        backend(&mut tx).await,
        first,
        "a connection whose transaction committed is given back and reused"
    );
    tx.rollback().await.expect("rollback");

    let mut tx = store.transaction().await.expect("transaction");
    assert_eq!(backend(&mut tx).await, first, "and after a rollback");
    charge(&mut tx, &intent).await;
    drop(tx);
    assert_eq!(
        charges(store.pool(), &intent).await,
        0,
        "a dropped transaction commits nothing"
    );
    let mut tx = store.transaction().await.expect("transaction");
    assert_ne!(
        backend(&mut tx).await,
        first,
        "the connection of a dropped transaction is closed, a new one opened"
    );
    tx.rollback().await.expect("rollback");
}
