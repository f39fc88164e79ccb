//! The opt-in bounded wait on the money path (C5, `Policy::wait_in_flight`): a duplicate of a
//! `run_in_transaction` still running waits for it, holding neither the writer nor a reader,
//! and gets its replay; a duplicate of one that rolled back runs its own effect, once. The
//! shared waiting scenarios (closure and guard styles, in this process and another) run in
//! `conformance.rs`.

mod common;

use common::{charges, store, with_charges};
use idem_core::{Answer, Idempotency, Outcome, Policy, Request, StoredResponse};
use idem_sqlite::{SqliteIdempotency, SqliteStore};
use std::sync::mpsc;
use std::time::{Duration, Instant};

async fn engine() -> Idempotency<SqliteStore> {
    let store = store().await;
    with_charges(&store).await;
    let policy = Policy::default().wait_in_flight(Duration::from_secs(5));
    Idempotency::with_policy(store, policy).expect("policy")
}

fn charge_request(idem: &Idempotency<SqliteStore>, intent: &str) -> Request {
    idem.request("acct_wait", "POST", "/charges")
        .key(Some(intent))
        .body(br#"{"cents":500}"#)
        .build()
        .expect("valid request")
}

fn insert_charge(tx: &rusqlite::Transaction<'_>, intent: &str) -> rusqlite::Result<i64> {
    tx.execute(
        "INSERT INTO charges (intent, cents) VALUES (?1, 500)",
        rusqlite::params![intent],
    )?;
    Ok(tx.last_insert_rowid())
}

/// Starts the original: its effect inserts the charge, then holds the writer until `finish`,
/// then commits (`commit`) or fails (rolled back, the key given back).
fn original(
    idem: &Idempotency<SqliteStore>,
    request: &Request,
    intent: &str,
    commit: bool,
) -> (mpsc::Sender<()>, tokio::task::JoinHandle<Instant>) {
    let (finish_tx, finish_rx) = mpsc::channel::<()>();
    let (idem, request, intent) = (idem.clone(), request.clone(), intent.to_owned());
    let task = tokio::spawn(async move {
        let _ = idem
            .run_in_transaction(&request, move |tx, _| {
                insert_charge(tx, &intent)?;
                let _ = finish_rx.recv_timeout(Duration::from_secs(10));
                if commit {
                    Ok(StoredResponse::new(201, "ch_original"))
                } else {
                    Err(rusqlite::Error::InvalidQuery)
                }
            })
            .await;
        Instant::now()
    });
    (finish_tx, task)
}

fn unique(name: &str) -> String {
    format!("{name}-{}", idem_core::FencingToken::generate())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c05_a_duplicate_of_a_running_transaction_waits_for_its_replay() {
    let idem = engine().await;
    let intent = unique("wait");
    let request = charge_request(&idem, &intent);
    let done = charge_request(&idem, &unique("done"));
    let completed = idem
        .run_in_transaction(&done, |_, _| {
            Ok::<_, rusqlite::Error>(StoredResponse::new(201, "ch_done"))
        })
        .await
        .expect("another key, completed");
    assert!(matches!(completed, Outcome::Executed(_)));
    let (finish, original) = original(&idem, &request, &intent, true);
    // The original holds the key (its effect waits on the writer).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let duplicate = {
        let (idem, request, intent) = (idem.clone(), request.clone(), intent.clone());
        tokio::spawn(async move {
            let outcome = idem
                .run_in_transaction(&request, move |tx, _| {
                    insert_charge(tx, &intent)?;
                    Ok::<_, rusqlite::Error>(StoredResponse::new(201, "ch_duplicate"))
                })
                .await
                .expect("the duplicate is answered");
            (outcome, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(!duplicate.is_finished(), "the duplicate did not wait");
    // Waiting holds no reader: a replay of another key is answered meanwhile.
    let replay = tokio::time::timeout(Duration::from_secs(2), idem.begin(&done))
        .await
        .expect("another key is answered while the duplicate waits")
        .expect("begin");
    assert_eq!(
        replay,
        idem_core::Begin::Answered(Answer::Replay(StoredResponse::new(201, "ch_done")))
    );
    finish.send(()).expect("the original waits");
    let ended = original.await.expect("the original");
    let (outcome, answered) = duplicate.await.expect("the duplicate");
    assert_eq!(
        outcome,
        Outcome::Answered(Answer::Replay(StoredResponse::new(201, "ch_original")))
    );
    assert!(
        answered.saturating_duration_since(ended) < Duration::from_millis(200),
        "answered {:?} after the original",
        answered.saturating_duration_since(ended)
    );
    assert_eq!(charges(idem.store(), &intent).await, 1, "one charge");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c05_a_duplicate_of_a_rolled_back_transaction_runs_its_own_effect_once() {
    let idem = engine().await;
    let intent = unique("rolled-back");
    let request = charge_request(&idem, &intent);
    let (finish, original) = original(&idem, &request, &intent, false);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let duplicate = {
        let (idem, request, intent) = (idem.clone(), request.clone(), intent.clone());
        tokio::spawn(async move {
            idem.run_in_transaction(&request, move |tx, _| {
                insert_charge(tx, &intent)?;
                Ok::<_, rusqlite::Error>(StoredResponse::new(201, "ch_duplicate"))
            })
            .await
            .expect("the duplicate is answered")
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!duplicate.is_finished(), "the duplicate did not wait");
    finish.send(()).expect("the original waits");
    original.await.expect("the original");
    let outcome = tokio::time::timeout(Duration::from_secs(3), duplicate)
        .await
        .expect("answered after the original rolled back")
        .expect("the duplicate");
    assert_eq!(
        outcome,
        Outcome::Executed(StoredResponse::new(201, "ch_duplicate"))
    );
    assert_eq!(
        charges(idem.store(), &intent).await,
        1,
        "the duplicate's charge only"
    );
}
