//! C4 over several connections: 64 concurrent same-key requests, spread over four stores (a
//! writer and four readers each) on one database file, 20 rounds: exactly one business row per
//! round.

mod common;

use common::{charges, with_charges};
use idem_core::{Answer, Idempotency, Outcome, Policy, StoredResponse};
use idem_sqlite::{SqliteIdempotency, SqliteStore};
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c04_64_concurrent_same_key_over_several_connections_one_row_per_round() {
    const STORES: usize = 4;
    const TASKS: usize = 64;
    const ROUNDS: usize = 20;
    let mut engines = Vec::new();
    for _ in 0..STORES {
        let store = SqliteStore::builder(common::db_path())
            .readers(4)
            .open()
            .await
            .expect("open");
        engines.push(Arc::new(
            Idempotency::with_policy(store, Policy::default()).expect("policy"),
        ));
    }
    with_charges(engines[0].store()).await;
    let run_id = idem_core::FencingToken::generate().to_string();

    for round in 0..ROUNDS {
        let intent = format!("{run_id}-round-{round}");
        let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                let idem = Arc::clone(&engines[task % STORES]);
                let (intent, barrier) = (intent.clone(), Arc::clone(&barrier));
                tokio::spawn(async move {
                    let request = idem
                        .request("acct_conc", "POST", "/charges")
                        .key(Some(&intent))
                        .body(b"{\"cents\":1234}")
                        .build()
                        .expect("request");
                    barrier.wait().await;
                    idem.run_in_transaction(&request, move |tx, _| {
                        tx.execute(
                            "INSERT INTO charges (intent, cents) VALUES (?1, 1234)",
                            [&intent],
                        )?;
                        Ok::<_, rusqlite::Error>(StoredResponse::new(
                            201,
                            format!("row {}", tx.last_insert_rowid()),
                        ))
                    })
                    .await
                })
            })
            .collect();
        let (mut executed, mut answered) = (Vec::new(), Vec::new());
        for task in tasks {
            match task.await.expect("task").expect("run") {
                Outcome::Executed(r) => executed.push(r),
                Outcome::Answered(Answer::Replay(r)) => answered.push(Some(r)),
                Outcome::Answered(Answer::InFlight { .. }) => answered.push(None),
                Outcome::Answered(Answer::Mismatch) => {
                    panic!("round {round}: mismatch on the same body")
                }
                Outcome::Refused(r) => panic!("round {round}: refused with {}", r.status),
            }
        }
        assert_eq!(executed.len(), 1, "round {round}: executed");
        for replay in answered.into_iter().flatten() {
            assert_eq!(
                replay, executed[0],
                "round {round}: a replay differs from the response"
            );
        }
        assert_eq!(
            charges(engines[0].store(), &intent).await,
            1,
            "round {round}: business rows"
        );
    }
}
