//! `run_in_transaction` (C6, C8): the effect and the completion commit or vanish together, in
//! one hop that a dropped caller cannot cancel. The shared transactional scenarios run in
//! `conformance.rs`.

mod common;

use common::{charges, store, with_charges};
use idem_core::store::Deadline;
use idem_core::{Answer, Begin, Idempotency, Outcome, Policy, Request, RunError, StoredResponse};
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
        assert_eq!(
            matches!(outcome, Outcome::Answered(Answer::Replay(_))),
            attempt > 0
        );
    }
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
    assert!(matches!(failed, Err(RunError::Released(ref m)) if m == "fraud check unavailable"));
    assert_eq!(charges(idem.store(), &intent).await, 0);
    assert_eq!(
        idem_core::Store::lookup(idem.store(), request.id(), Deadline::default())
            .await
            .expect("lookup"),
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
async fn c08_invalid_response_is_stored_as_a_500_with_its_effect() {
    let idem = engine(Policy::default().lease(Duration::from_millis(200))).await;
    let intent = unique("invalid");
    let request = charge_request(&idem, &intent, 100);
    for _ in 0..2 {
        let i = intent.clone();
        let outcome = idem
            .run_in_transaction(&request, move |tx, _| {
                insert_charge(tx, &i, 100)?;
                Ok::<_, rusqlite::Error>(StoredResponse::new(42, "not a status"))
            })
            .await
            .expect("run");
        assert_eq!(outcome.response().map(|r| r.status), Some(500));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(charges(idem.store(), &intent).await, 1);
}

#[tokio::test]
async fn c08_dropping_the_caller_does_not_cancel_the_transaction() {
    let idem = engine(Policy::default().lease(Duration::from_millis(300))).await;
    let intent = unique("dropped");
    let request = charge_request(&idem, &intent, 100);
    let i = intent.clone();
    let dropped = tokio::time::timeout(
        Duration::from_millis(20),
        idem.run_in_transaction(&request, move |tx, _| {
            std::thread::sleep(Duration::from_millis(150));
            insert_charge(tx, &i, 100)?;
            Ok::<_, rusqlite::Error>(StoredResponse::new(201, "charged"))
        }),
    )
    .await;
    assert!(dropped.is_err(), "the caller gave up first");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let i = intent.clone();
    let retry = idem
        .run_in_transaction(&request, move |tx, _| {
            insert_charge(tx, &i, 100)?;
            Ok::<_, rusqlite::Error>(StoredResponse::new(201, "charged twice"))
        })
        .await
        .expect("run");
    assert_eq!(
        retry,
        Outcome::Answered(Answer::Replay(StoredResponse::new(201, "charged")))
    );
    assert_eq!(charges(idem.store(), &intent).await, 1);
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
    // The transaction rolled back, the effect with it: nothing happened, so the key was given
    // back (C8) and a retry runs; the connections still serve.
    assert!(matches!(
        idem.begin(&request).await.expect("begin"),
        Begin::Acquired(_)
    ));
    for _ in 0..8 {
        assert_eq!(charges(idem.store(), &intent).await, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c05_a_duplicate_of_an_effect_that_outlives_its_lease_is_in_flight_at_once() {
    // The effect's transaction holds SQLite's one writer past the lease, so the lease cannot be
    // renewed and the record looks orphaned to the store. A duplicate in this process is still
    // answered in flight at once (the process knows its holder is alive), never queued for the
    // writer, never a takeover.
    let idem = engine(Policy::default().lease(Duration::from_millis(200))).await;
    let intent = unique("long-effect");
    let request = charge_request(&idem, &intent, 700);
    let (started, effect_started) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let (idem, request, i) = (idem.clone(), request.clone(), intent.clone());
        tokio::spawn(async move {
            idem.run_in_transaction(&request, move |tx, _| {
                let id = insert_charge(tx, &i, 700)?;
                let _ = started.send(());
                std::thread::sleep(Duration::from_millis(900));
                Ok::<_, rusqlite::Error>(StoredResponse::new(201, format!("charge {id}")))
            })
            .await
        })
    };
    // Once the effect runs (whenever a loaded machine lets it start), past its 200 ms lease.
    effect_started.await.expect("the effect started");
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let duplicate = idem
            .run_in_transaction(
                &request,
                |_, _| -> Result<StoredResponse, rusqlite::Error> {
                    panic!("a duplicate must not run")
                },
            )
            .await
            .expect("answered");
        assert!(
            matches!(duplicate, Outcome::Answered(Answer::InFlight { .. })),
            "{duplicate:?}"
        );
        assert!(
            started.elapsed() < Duration::from_millis(100),
            "the duplicate waited {:?}",
            started.elapsed()
        );
    }
    let outcome = first.await.expect("joined").expect("ran");
    assert!(matches!(outcome, Outcome::Executed(_)));
    let replay = idem.begin(&request).await.expect("begin");
    assert!(matches!(replay, Begin::Answered(Answer::Replay(_))));
    assert_eq!(charges(idem.store(), &intent).await, 1);
}
