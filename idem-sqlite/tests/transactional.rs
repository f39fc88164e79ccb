//! Completion inside the business transaction (C6): the effect and the record commit or vanish
//! together.

mod common;

use common::{charges, store, with_charges};
use idem_core::{
    Begin, Error, Idempotency, Outcome, Policy, Request, RunError, Store, StoredResponse,
};
use idem_sqlite::{SqliteIdempotency, SqliteStore};
use std::time::Duration;

async fn engine(policy: Policy) -> Idempotency<SqliteStore> {
    let store = store().await;
    with_charges(&store).await;
    Idempotency::with_policy(store, policy).expect("policy")
}

fn charge_request(idem: &Idempotency<SqliteStore>, intent: &str, cents: u32) -> Request {
    idem.request("acct_tx", "POST", "/charges")
        .key(Some(intent))
        .body(format!("{{\"cents\":{cents}}}").as_bytes())
        .build()
        .expect("valid request")
}

fn insert_charge(
    tx: &rusqlite::Transaction<'_>,
    intent: &str,
    cents: u32,
) -> rusqlite::Result<i64> {
    tx.execute(
        "INSERT INTO charges (intent, cents) VALUES (?1, ?2)",
        rusqlite::params![intent, cents],
    )?;
    Ok(tx.last_insert_rowid())
}

fn unique(name: &str) -> String {
    format!("{name}-{}", idem_core::FencingToken::generate())
}

#[tokio::test]
async fn c06_effect_and_completion_commit_together() {
    let idem = engine(Policy::default()).await;
    let intent = unique("commit");
    let request = charge_request(&idem, &intent, 500);
    for attempt in 0..3 {
        let i = intent.clone();
        let outcome = idem
            .run_in_transaction(&request, move |tx, _| {
                let id = insert_charge(tx, &i, 500)?;
                Ok::<_, rusqlite::Error>(
                    StoredResponse::new(201, format!("{{\"charge\":{id}}}"))
                        .with_header("content-type", "application/json")
                        .with_header("set-cookie", "never=stored"),
                )
            })
            .await
            .expect("run");
        let response = outcome.response().expect("a response").clone();
        assert_eq!(response.header("set-cookie"), None);
        assert_eq!(matches!(outcome, Outcome::Replayed(_)), attempt > 0);
    }
    assert_eq!(charges(idem.store(), &intent).await, 1);
}

#[tokio::test]
async fn c06_rolled_back_transaction_leaves_neither_effect_nor_completion() {
    let idem = engine(Policy::default()).await;
    let intent = unique("rollback");
    let request = charge_request(&idem, &intent, 700);
    let Begin::Acquired(lease) = idem.begin(&request).await.expect("begin") else {
        panic!("fresh key");
    };
    let mut db = idem.store().connect().expect("connect");
    {
        let tx = db.transaction().expect("tx");
        insert_charge(&tx, &intent, 700).expect("insert");
        idem.complete_in(&tx, &lease, StoredResponse::new(201, "charged"))
            .expect("complete_in");
        tx.rollback().expect("rollback");
    }
    assert_eq!(charges(idem.store(), &intent).await, 0);
    // The reservation is still this holder's, in progress: a retry is in flight, not a replay.
    assert!(matches!(
        idem.begin(&request).await.expect("begin"),
        Begin::InFlight { .. }
    ));
    let tx = db.transaction().expect("tx");
    insert_charge(&tx, &intent, 700).expect("insert");
    idem.complete_in(&tx, &lease, StoredResponse::new(201, "charged"))
        .expect("complete_in");
    tx.commit().expect("commit");
    assert_eq!(charges(idem.store(), &intent).await, 1);
    assert_eq!(
        idem.begin(&request).await.expect("begin"),
        Begin::Replay(StoredResponse::new(201, "charged"))
    );
}

#[tokio::test]
async fn c06_lease_lost_means_the_caller_rolls_back_and_the_effect_vanishes() {
    let idem = engine(Policy::default().lease(Duration::from_millis(200))).await;
    let intent = unique("lost");
    let request = charge_request(&idem, &intent, 900);
    let Begin::Acquired(stale) = idem.begin(&request).await.expect("begin") else {
        panic!("fresh key");
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let Begin::Acquired(fresh) = idem.begin(&request).await.expect("begin") else {
        panic!("the orphan is taken over");
    };

    let mut db = idem.store().connect().expect("connect");
    let tx = db.transaction().expect("tx");
    insert_charge(&tx, &intent, 900).expect("insert");
    let err = idem
        .complete_in(&tx, &stale, StoredResponse::new(201, "stale"))
        .expect_err("fenced");
    assert!(matches!(err, Error::LeaseLost));
    drop(tx); // rolls back
    assert_eq!(charges(idem.store(), &intent).await, 0);

    let tx = db.transaction().expect("tx");
    insert_charge(&tx, &intent, 900).expect("insert");
    idem.complete_in(&tx, &fresh, StoredResponse::new(201, "fresh"))
        .expect("complete_in");
    tx.commit().expect("commit");
    assert_eq!(charges(idem.store(), &intent).await, 1);
}

#[tokio::test]
async fn c08_effect_error_rolls_back_and_releases_so_the_retry_runs_once() {
    let idem = engine(Policy::default()).await;
    let intent = unique("error");
    let request = charge_request(&idem, &intent, 300);
    let i = intent.clone();
    let failed = idem
        .run_in_transaction(&request, move |tx, _| {
            insert_charge(tx, &i, 300).map_err(|e| e.to_string())?;
            Err::<StoredResponse, _>("fraud check unavailable".to_owned())
        })
        .await;
    assert!(matches!(failed, Err(RunError::Handler(ref m)) if m == "fraud check unavailable"));
    assert_eq!(charges(idem.store(), &intent).await, 0);
    assert_eq!(
        idem.store().lookup(&request.id).await.expect("lookup"),
        None
    );

    let i = intent.clone();
    let outcome = idem
        .run_in_transaction(&request, move |tx, _| {
            insert_charge(tx, &i, 300)?;
            Ok::<_, rusqlite::Error>(StoredResponse::new(201, "charged"))
        })
        .await
        .expect("run");
    assert!(matches!(outcome, Outcome::Executed(_)));
    assert_eq!(charges(idem.store(), &intent).await, 1);
}

#[tokio::test]
async fn c07_invalid_response_rolls_the_effect_back() {
    let idem = engine(Policy::default()).await;
    let intent = unique("invalid");
    let request = charge_request(&idem, &intent, 100);
    let i = intent.clone();
    let outcome = idem
        .run_in_transaction(&request, move |tx, _| {
            insert_charge(tx, &i, 100)?;
            Ok::<_, rusqlite::Error>(StoredResponse::new(42, "not a status"))
        })
        .await;
    assert!(matches!(
        outcome,
        Err(RunError::Idem(Error::InvalidInput { .. }))
    ));
    assert_eq!(charges(idem.store(), &intent).await, 0);
}

#[tokio::test]
async fn a_panicking_effect_rolls_back_and_the_store_keeps_working() {
    let idem = std::sync::Arc::new(engine(Policy::default()).await);
    let intent = unique("panic");
    let request = charge_request(&idem, &intent, 100);
    let (i, idem2, request2) = (intent.clone(), idem.clone(), request.clone());
    let joined = tokio::spawn(async move {
        idem2
            .run_in_transaction(&request2, move |tx, _| {
                insert_charge(tx, &i, 100).expect("insert");
                panic!("bug in the effect");
            })
            .await
            .map(|_: Outcome| ())
            .map_err(|_: RunError<rusqlite::Error>| ())
    })
    .await;
    assert!(joined.expect_err("the panic reaches the caller").is_panic());
    assert_eq!(charges(idem.store(), &intent).await, 0);
    // The reservation waits for its lease (C9); the connections still serve.
    assert!(matches!(
        idem.begin(&request).await.expect("begin"),
        Begin::InFlight { .. }
    ));
    for _ in 0..8 {
        assert_eq!(charges(idem.store(), &intent).await, 0);
    }
}
