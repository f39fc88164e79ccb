//! Real concurrency against one server (C4, C5): 64 tasks on one key over a pool of 16
//! connections, 20 rounds, one business row per round; and a duplicate that arrives while the
//! first request's business transaction holds the record is answered at once.

mod common;

use common::{charges, store_on};
use idem_core::store::Deadline;
use idem_core::{Answer, Begin, Idempotency, Outcome, Policy, StoredResponse};
use idem_postgres::sqlx::{self, AssertSqlSafe};
use idem_postgres::{Isolation, PgIdempotency, PgStore, StatementMode};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c04_64_concurrent_same_key_over_16_connections_one_row_per_round() {
    const TASKS: usize = 64;
    const ROUNDS: usize = 20;
    let first = store_on(
        &common::pg_url(),
        StatementMode::Prepared,
        Isolation::ReadCommitted,
    )
    .await;
    // A second store on the same table with a pool of 16.
    let store = PgStore::builder()
        .schema(common::SCHEMA)
        .table(
            first
                .table()
                .split('.')
                .nth(1)
                .expect("table")
                .trim_matches('"'),
        )
        .max_connections(16)
        .connect(&common::pg_url())
        .await
        .expect("connect");
    let idem = Arc::new(Idempotency::with_policy(store, Policy::default()).expect("policy"));
    let run = idem_core::FencingToken::generate().to_string();
    for round in 0..ROUNDS {
        let intent = format!("{run}-{round}");
        let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let (idem, intent, barrier) = (Arc::clone(&idem), intent.clone(), Arc::clone(&barrier));
                tokio::spawn(async move {
                    let request = idem
                        .request("acct_conc", "POST", "/charges")
                        .key(Some(&intent))
                        .body(b"{\"cents\":1234}")
                        .build()
                        .expect("request");
                    barrier.wait().await;
                    idem.run_in_transaction(&request, move |tx, _| {
                        Box::pin(async move {
                            let (id,): (i64,) = sqlx::query_as(
                                "INSERT INTO idem_test.charges (intent, cents) VALUES ($1, 1234) RETURNING id",
                            )
                            .bind(intent)
                            .fetch_one(&mut *tx)
                            .await?;
                            Ok::<_, sqlx::Error>(StoredResponse::new(201, format!("row {id}")))
                        })
                    })
                    .await
                })
            })
            .collect();
        let (mut executed, mut answered) = (Vec::new(), Vec::new());
        for task in tasks {
            match task.await.expect("task").expect("run") {
                Outcome::Executed(r) => executed.push(r),
                Outcome::Answered(Answer::Replay(r)) => answered.push(r),
                Outcome::Answered(Answer::InFlight { .. }) => {}
                Outcome::Answered(Answer::Mismatch) => panic!("round {round}: mismatch"),
                Outcome::Refused(r) => panic!("round {round}: refused with {}", r.status),
            }
        }
        assert_eq!(executed.len(), 1, "round {round}: executed");
        for replay in answered {
            assert_eq!(replay, executed[0], "round {round}: a replay differs");
        }
        assert_eq!(
            charges(idem.store().pool(), &intent).await,
            1,
            "round {round}: rows"
        );
    }
}

/// C5: the first request's business transaction has run its completion UPDATE on the record and
/// not committed. A duplicate is answered in flight at once (the reservation reads without a
/// lock), a mismatch too; after the commit, the duplicate gets the replay.
#[tokio::test]
async fn c05_a_duplicate_never_waits_for_the_business_transaction() {
    let store = store_on(
        &common::pg_url(),
        StatementMode::Prepared,
        Isolation::ReadCommitted,
    )
    .await;
    let idem = Idempotency::new(store.clone());
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some("held"))
        .body(b"{}")
        .build()
        .expect("request");
    let Begin::Acquired(lease) = idem.begin(&request).await.expect("begin") else {
        panic!("fresh");
    };
    let mut tx = store.pool().begin().await.expect("begin tx");
    sqlx::raw_sql(AssertSqlSafe(
        "INSERT INTO idem_test.charges (intent) VALUES ('held-tx')",
    ))
    .execute(&mut *tx)
    .await
    .expect("effect");
    let completion = idem.completion(&lease, StoredResponse::new(201, "charged"));
    store
        .complete_in(&mut tx, &completion)
        .await
        .expect("completion, not committed");

    let other = idem
        .request("acct", "POST", "/charges")
        .key(Some("held"))
        .body(b"{\"other\":1}")
        .build()
        .expect("request");
    for (req, what) in [(&request, "in flight"), (&other, "mismatch")] {
        let started = Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(2), idem.begin(req))
            .await
            .unwrap_or_else(|_| panic!("{what}: the duplicate waited for the business transaction"))
            .expect("begin");
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{what}: {:?}",
            started.elapsed()
        );
        match what {
            "in flight" => assert!(
                matches!(answer, Begin::Answered(Answer::InFlight { .. })),
                "{answer:?}"
            ),
            _ => assert_eq!(answer, Begin::Answered(Answer::Mismatch)),
        }
    }
    tx.commit().await.expect("commit");
    assert_eq!(
        idem.begin(&request).await.expect("begin"),
        Begin::Answered(Answer::Replay(StoredResponse::new(201, "charged")))
    );
}

/// C10: purge deletes a bounded batch and skips a row a transaction holds, never waiting for it.
#[tokio::test]
async fn c10_purge_never_waits_for_a_held_row() {
    let store = store_on(
        &common::pg_url(),
        StatementMode::Prepared,
        Isolation::ReadCommitted,
    )
    .await;
    let idem = Idempotency::with_policy(
        store.clone(),
        Policy::default().lease(Duration::from_millis(50)),
    )
    .expect("policy");
    let mut held = Vec::new();
    for i in 0..3 {
        let req = idem
            .request("acct", "POST", "/charges")
            .key(Some(&format!("orphan-{i}")))
            .body(b"{}")
            .build()
            .expect("request");
        let Begin::Acquired(lease) = idem.begin(&req).await.expect("begin") else {
            panic!("fresh")
        };
        held.push(lease);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Another transaction locks the first orphan's row (its holder renewing, say).
    let mut tx = store.pool().begin().await.expect("tx");
    let lock = format!(
        "SELECT 1 FROM {} WHERE key = 'orphan-0' FOR UPDATE",
        store.table()
    );
    sqlx::raw_sql(AssertSqlSafe(lock))
        .execute(&mut *tx)
        .await
        .expect("lock");
    let started = Instant::now();
    let purged = idem_core::Store::purge_expired(&store, 100, Deadline::default())
        .await
        .expect("purge");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "purge waited"
    );
    assert_eq!(purged, 2, "the held row is skipped");
    tx.rollback().await.expect("rollback");
    assert_eq!(
        idem_core::Store::purge_expired(&store, 100, Deadline::default())
            .await
            .expect("purge"),
        1
    );
}
