//! `SqliteStore::complete_in_transaction` (C6, C8): for a caller that holds a lease, the effect
//! and its completion in one transaction on the writer, one flat result.

mod common;

use common::{charges, db_path, with_charges};
use idem_core::store::Lease;
use idem_core::{
    Answer, Begin, Error, FencingToken, Idempotency, ManualClock, Policy, Request, StoredResponse,
    Timestamp,
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

/// The charge for `intent`, inserted in the transaction.
async fn charge(
    idem: &Idempotency<SqliteStore>,
    lease: &Lease,
    intent: &str,
    fail: bool,
) -> Result<idem_core::Completion, BoxError> {
    let intent = intent.to_owned();
    idem.store()
        .complete_in_transaction(idem, lease, move |tx| {
            tx.execute(
                "INSERT INTO charges (intent, cents) VALUES (?1, 2500)",
                [&intent],
            )?;
            if fail {
                return Err(BoxError::from("declined after the insert"));
            }
            Ok(StoredResponse::new(201, "charged").with_header("set-cookie", "s=1"))
        })
        .await
}

fn unique(name: &str) -> String {
    format!("{name}-{}", FencingToken::generate())
}

#[tokio::test]
async fn c06_complete_in_transaction_commits_the_effect_with_its_completion() {
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
async fn c08_an_effects_error_rolls_back_and_is_returned_as_it_is() {
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    let idem = engine(&clock).await;
    let intent = unique("fail");
    let lease = acquire(&idem, &intent).await;
    let error = charge(&idem, &lease, &intent, true)
        .await
        .expect_err("the effect failed");
    assert_eq!(error.to_string(), "declined after the insert");
    assert_eq!(charges(idem.store(), &intent).await, 0, "rolled back");
    // Nothing completed: the lease still holds, for the caller to release.
    idem.release(lease).await.expect("released");
    let again = acquire(&idem, &intent).await;
    charge(&idem, &again, &intent, false)
        .await
        .expect("the retry runs");
    assert_eq!(charges(idem.store(), &intent).await, 1);
}

#[tokio::test]
async fn c06_a_lease_lost_to_a_takeover_rolls_the_effect_back() {
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    let idem = engine(&clock).await;
    let intent = unique("lost");
    let stale = acquire(&idem, &intent).await;
    clock.advance(Duration::from_secs(2));
    let _takeover = acquire(&idem, &intent).await;
    let error = charge(&idem, &stale, &intent, false)
        .await
        .expect_err("fenced out");
    assert!(
        matches!(error.downcast_ref::<Error>(), Some(Error::LeaseLost)),
        "{error}"
    );
    assert_eq!(
        charges(idem.store(), &intent).await,
        0,
        "the effect vanished with it"
    );
}
