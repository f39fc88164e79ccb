//! `Idempotency::complete_transaction` on SQLite (C6, C8): for a caller that holds a lease
//! (the guard style, a handler under the HTTP layer), the effect and its completion in one
//! transaction on the writer; the engine says what the end means for the key.

mod common;

use common::{charges, db_path, with_charges};
use idem_core::store::Lease;
use idem_core::{
    Answer, Begin, Error, FencingToken, Idempotency, ManualClock, Policy, Request, RunError,
    StoredResponse, Timestamp,
};
use idem_sqlite::SqliteStore;
use std::time::Duration;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn engine(clock: &ManualClock) -> Idempotency<SqliteStore> {
    let store = SqliteStore::builder(db_path())
        .clock(clock.clone())
        .open()
        .await
        .expect("open store");
    with_charges(&store).await;
    Idempotency::with_policy(store, Policy::default().lease(Duration::from_secs(1)))
        .expect("policy")
}

fn request(idem: &Idempotency<SqliteStore>, intent: &str) -> Request {
    idem.request("acct_in_tx", "POST", "/charges")
        .key(Some(intent))
        .body(b"{}")
        .build()
        .expect("a request")
}

async fn acquire(idem: &Idempotency<SqliteStore>, intent: &str) -> Lease {
    match idem.begin(&request(idem, intent)).await.expect("begin") {
        Begin::Acquired(lease) => lease,
        Begin::Answered(answer) => panic!("expected to acquire {intent}: {answer:?}"),
    }
}

/// The charge for `intent`, inserted in the transaction; then `after` runs in it.
async fn charge_then(
    idem: &Idempotency<SqliteStore>,
    lease: &Lease,
    intent: &str,
    after: fn(&rusqlite::Transaction<'_>) -> Result<(), BoxError>,
) -> Result<idem_core::Completion, RunError<BoxError>> {
    let intent = intent.to_owned();
    idem.complete_transaction(
        lease,
        Box::new(move |tx: &rusqlite::Transaction<'_>, _: &Lease| {
            tx.execute(
                "INSERT INTO charges (intent, cents) VALUES (?1, 2500)",
                [&intent],
            )?;
            after(tx)?;
            Ok(StoredResponse::new(201, "charged").with_header("set-cookie", "s=1"))
        }),
    )
    .await
}

/// The charge for `intent`, failing after the insert when `fail`.
async fn charge(
    idem: &Idempotency<SqliteStore>,
    lease: &Lease,
    intent: &str,
    fail: bool,
) -> Result<idem_core::Completion, RunError<BoxError>> {
    let after: fn(&rusqlite::Transaction<'_>) -> Result<(), BoxError> = if fail {
        |_| Err(BoxError::from("declined after the insert"))
    } else {
        |_| Ok(())
    };
    charge_then(idem, lease, intent, after).await
}

fn unique(name: &str) -> String {
    format!("{name}-{}", FencingToken::generate())
}

#[tokio::test]
async fn c06_complete_transaction_commits_the_effect_with_its_completion() {
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    let idem = engine(&clock).await;
    let intent = unique("commit");
    let lease = acquire(&idem, &intent).await;
    let completion = charge(&idem, &lease, &intent, false)
        .await
        .expect("committed");
    idem.committed(&completion);
    assert_eq!(completion.response().status, 201);
    assert_eq!(completion.response().header("set-cookie"), None, "C7");
    assert_eq!(charges(idem.store(), &intent).await, 1);
    match idem.begin(&request(&idem, &intent)).await.expect("begin") {
        Begin::Answered(Answer::Replay(replay)) => assert_eq!(replay.body, b"charged"),
        other => panic!("expected the replay: {other:?}"),
    }
}

#[tokio::test]
async fn c08_an_effects_error_rolls_back_and_gives_the_key_back() {
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    let idem = engine(&clock).await;
    let intent = unique("fail");
    let lease = acquire(&idem, &intent).await;
    match charge(&idem, &lease, &intent, true).await {
        Err(RunError::Released(error)) => {
            assert_eq!(error.to_string(), "declined after the insert")
        }
        other => panic!("expected the effect's error, key given back: {other:?}"),
    }
    assert_eq!(charges(idem.store(), &intent).await, 0, "rolled back");
    // Nothing happened: the engine gave the key back, so the retry acquires at once.
    let again = acquire(&idem, &intent).await;
    charge(&idem, &again, &intent, false)
        .await
        .expect("the retry runs");
    assert_eq!(charges(idem.store(), &intent).await, 1);
}

/// An effect that commits by itself may have happened: the key is kept with the 500 of an
/// unknown outcome, never given back, and the retry replays it instead of charging again.
#[tokio::test]
async fn c08_an_effect_that_commits_by_itself_keeps_the_key() {
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    let idem = engine(&clock).await;
    let intent = unique("self-commit");
    let lease = acquire(&idem, &intent).await;
    let ended = charge_then(&idem, &lease, &intent, |tx| Ok(tx.execute_batch("COMMIT")?)).await;
    assert!(matches!(ended, Err(RunError::InDoubt(_))), "{ended:?}");
    assert_eq!(charges(idem.store(), &intent).await, 1);
    for _ in 0..2 {
        match idem.begin(&request(&idem, &intent)).await.expect("begin") {
            Begin::Answered(Answer::Replay(replay)) => assert_eq!(replay.status, 500),
            other => panic!("expected the answer in doubt: {other:?}"),
        }
    }
}

#[tokio::test]
async fn c06_a_lease_lost_to_a_takeover_rolls_the_effect_back() {
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    let idem = engine(&clock).await;
    let intent = unique("lost");
    let stale = acquire(&idem, &intent).await;
    clock.advance(Duration::from_secs(2));
    let _takeover = acquire(&idem, &intent).await;
    let ended = charge(&idem, &stale, &intent, false).await;
    assert!(
        matches!(ended, Err(RunError::Idem(Error::LeaseLost))),
        "{ended:?}"
    );
    assert_eq!(
        charges(idem.store(), &intent).await,
        0,
        "the effect vanished with it"
    );
}
