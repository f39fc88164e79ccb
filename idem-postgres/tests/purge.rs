//! Purge (C10) through the index by reservation time: records of a longer retention reserved
//! first never hold back the purge of the expired ones reserved after them.

mod common;

use common::store_on;
use idem_core::store::Deadline;
use idem_core::{Begin, Idempotency, Policy, Store, StoredResponse};
use idem_postgres::sqlx::{self, AssertSqlSafe};
use idem_postgres::{Isolation, StatementMode};
use std::time::Duration;

#[tokio::test]
async fn c10_expired_records_behind_longer_kept_ones_are_purged() {
    let store = store_on(
        &common::pg_url(),
        StatementMode::Prepared,
        Isolation::ReadCommitted,
    )
    .await;
    let policy = |retention| Policy::default().retention(retention);
    let long =
        Idempotency::with_policy(store.clone(), policy(Duration::from_secs(3600))).expect("policy");
    let short = Idempotency::with_policy(store.clone(), policy(Duration::from_millis(200)))
        .expect("policy");
    // Reserved first and kept an hour: they fill every window of the oldest records.
    for (engine, prefix, count) in [(&long, "kept", 30), (&short, "gone", 10)] {
        for i in 0..count {
            let request = engine
                .request("acct", "POST", "/charges")
                .key(Some(&format!("{prefix}-{i}")))
                .body(b"{}")
                .build()
                .expect("request");
            let Begin::Acquired(lease) = engine.begin(&request).await.expect("begin") else {
                panic!("fresh")
            };
            engine
                .complete(lease, StoredResponse::new(201, "ok"))
                .await
                .expect("complete");
        }
        // Later reservation times for the next records.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut purged = 0;
    for _ in 0..20 {
        purged += store
            .purge_expired(2, Deadline::default())
            .await
            .expect("purge");
    }
    assert_eq!(
        purged, 10,
        "every expired record, however many were kept before them"
    );
    let count = format!("SELECT count(*) FROM {}", store.table());
    let left: i64 = sqlx::query_scalar(AssertSqlSafe(count))
        .fetch_one(store.pool())
        .await
        .expect("count");
    assert_eq!(left, 30, "the records kept an hour stay");
}

/// A row whose reservation time is out of every range (`infinity`, written by hand or a bad
/// restore) is one corrupt record, never a stop to the purge: the expired records around it
/// are deleted, batch after batch, and so is it once its deadline has passed (C10, C12), with
/// prepared statements and with the simple protocol (the idem command's, PgBouncer's).
#[tokio::test]
async fn c10_a_reservation_time_of_infinity_never_stops_the_purge() {
    for mode in [StatementMode::Prepared, StatementMode::Simple] {
        infinite_reservation_times_are_purged(mode).await;
    }
}

async fn infinite_reservation_times_are_purged(mode: StatementMode) {
    let store = store_on(&common::pg_url(), mode, Isolation::ReadCommitted).await;
    let idem = Idempotency::with_policy(
        store.clone(),
        Policy::default().retention(Duration::from_millis(100)),
    )
    .expect("policy");
    for i in 0..6 {
        let request = idem
            .request("acct", "POST", "/charges")
            .key(Some(&format!("gone-{i}")))
            .body(b"{}")
            .build()
            .expect("request");
        let Begin::Acquired(lease) = idem.begin(&request).await.expect("begin") else {
            panic!("fresh")
        };
        idem.complete(lease, StoredResponse::new(201, "ok"))
            .await
            .expect("complete");
    }
    let table = store.table();
    for (key, reserved_at) in [("odd-late", "infinity"), ("odd-early", "-infinity")] {
        let insert = format!(
            "INSERT INTO {table} (consumer, route, key, fingerprint, token, state, deadline, \
             response, reserved_at) SELECT consumer, route, '{key}', fingerprint, token, state, \
             deadline, response, '{reserved_at}' FROM {table} WHERE key = 'gone-0'"
        );
        sqlx::query(AssertSqlSafe(insert))
            .execute(store.pool())
            .await
            .expect("the odd row");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut purged = 0;
    for _ in 0..10 {
        purged += store
            .purge_expired(2, Deadline::default())
            .await
            .unwrap_or_else(|e| panic!("{mode:?}: a purge despite the odd rows: {e:?}"));
    }
    assert_eq!(
        purged, 8,
        "{mode:?}: every expired record, the odd ones too"
    );
}
