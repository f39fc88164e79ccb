//! An engine expecting fresh keys (C4, C5, C15): after a load of fresh keys its reservations
//! send `insert.sql` alone first, and fall back to the whole reservation when it writes nothing.
//! The answers must be those of the whole reservation, at once, and one execution per key.

mod common;

use common::{business_table, charges, expecting_fresh_keys, pg_url, SCHEMA};
use idem_core::StoredResponse;
use idem_core::{Answer, Begin, FencingToken, Idempotency, Outcome, Request, RunError};
use idem_postgres::sqlx;
use idem_postgres::{EffectFuture, PgIdempotency, PgStore};
use std::time::Duration;
use tokio::sync::oneshot;

/// A duplicate that waited for the open transaction would wait until the test lets it go.
const AT_ONCE: Duration = Duration::from_secs(2);

async fn store(table: &str) -> PgStore {
    let store = PgStore::builder()
        .schema(SCHEMA)
        .table(table)
        .max_connections(4)
        .connect(&pg_url())
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    business_table(store.pool()).await;
    store
}

fn request(idem: &Idempotency<PgStore>, key: &str, body: &[u8]) -> Request {
    idem.request("acct_fresh", "POST", "/charges")
        .key(Some(key))
        .body(body)
        .build()
        .expect("request")
}

/// The effect: one business row for `intent`.
fn insert_charge(tx: &mut sqlx::PgConnection, intent: String) -> EffectFuture<'_, sqlx::Error> {
    Box::pin(async move {
        sqlx::query("INSERT INTO idem_test.charges (intent) VALUES ($1)")
            .bind(intent)
            .execute(&mut *tx)
            .await?;
        Ok(StoredResponse::new(201, "charged"))
    })
}

/// `run_in_transaction` of `request`, in one commit if `one_commit` (C15), else two.
async fn charge(
    idem: &Idempotency<PgStore>,
    request: &Request,
    intent: &str,
    one_commit: bool,
) -> Result<Outcome, RunError<sqlx::Error>> {
    let intent = intent.to_owned();
    let request = request.clone().with_one_commit(one_commit);
    idem.run_in_transaction(&request, move |tx, _| insert_charge(tx, intent))
        .await
}

/// C5, C15, C3: while a one-commit execution of another store holds the key (its reservation
/// uncommitted), an engine expecting fresh keys is answered at once: in flight for the same
/// body, mismatch for another, by `begin` and by `run_in_transaction` in two commits and in
/// one; its insert never waits for the holder. After the commit it replays the holder's answer.
#[tokio::test]
async fn c05_expecting_fresh_keys_a_one_commit_holder_is_answered_at_once() {
    let table = format!("fresh_{}", FencingToken::generate());
    let (here, there) = (store(&table).await, store(&table).await);
    let (idem, other) = (Idempotency::new(here.clone()), Idempotency::new(there));
    expecting_fresh_keys(&other).await;
    let intent = format!("held-{}", FencingToken::generate());
    let req = request(&idem, &intent, b"{\"cents\":1}");
    let same = request(&other, &intent, b"{\"cents\":1}");
    let other_body = request(&other, &intent, b"{\"cents\":2}");

    let (started, on_start) = oneshot::channel::<()>();
    let (go, on_go) = oneshot::channel::<()>();
    let (engine, owned, held_intent) = (idem.clone(), req.clone(), intent.clone());
    let first = tokio::spawn(async move {
        engine
            .run_in_transaction(&owned.clone().with_one_commit(true), move |tx, _| {
                Box::pin(async move {
                    sqlx::query("INSERT INTO idem_test.charges (intent) VALUES ($1)")
                        .bind(held_intent)
                        .execute(&mut *tx)
                        .await?;
                    let _ = started.send(());
                    let _ = on_go.await;
                    Ok::<_, sqlx::Error>(StoredResponse::new(201, "held"))
                })
            })
            .await
    });
    on_start.await.expect("the effect started");

    let begun = tokio::time::timeout(AT_ONCE, other.begin(&same)).await;
    assert!(
        matches!(begun, Ok(Ok(Begin::Answered(Answer::InFlight { .. })))),
        "the same body was not in flight at once: {begun:?}"
    );
    let begun = tokio::time::timeout(AT_ONCE, other.begin(&other_body)).await;
    assert!(
        matches!(begun, Ok(Ok(Begin::Answered(Answer::Mismatch)))),
        "another body was not a mismatch at once: {begun:?}"
    );
    for one_commit in [false, true] {
        // Answers move the engine towards leaving the mode: back into it first.
        expecting_fresh_keys(&other).await;
        let ran = tokio::time::timeout(AT_ONCE, charge(&other, &same, &intent, one_commit)).await;
        assert!(
            matches!(ran, Ok(Ok(Outcome::Answered(Answer::InFlight { .. })))),
            "run_in_transaction of the same body (one commit: {one_commit}): {ran:?}"
        );
        let ran =
            tokio::time::timeout(AT_ONCE, charge(&other, &other_body, &intent, one_commit)).await;
        assert!(
            matches!(ran, Ok(Ok(Outcome::Answered(Answer::Mismatch)))),
            "run_in_transaction of another body (one commit: {one_commit}): {ran:?}"
        );
    }
    assert_eq!(
        charges(here.pool(), &intent).await,
        0,
        "nothing committed yet"
    );

    go.send(()).expect("the effect waits");
    let first = first.await.expect("the first execution");
    assert!(matches!(first, Ok(Outcome::Executed(_))), "{first:?}");
    let begun = other.begin(&same).await;
    assert!(
        matches!(&begun, Ok(Begin::Answered(Answer::Replay(r))) if r.body == b"held"[..]),
        "after the commit: {begun:?}"
    );
    assert_eq!(charges(here.pool(), &intent).await, 1);
}

/// C4, C15: duplicates of fresh keys from two engines expecting fresh keys (two pools, several
/// connections each), in one commit and in two, all at once: one execution per key, every
/// other caller answered.
#[tokio::test]
async fn c04_expecting_fresh_keys_concurrent_duplicates_execute_once() {
    let table = format!("fresh_{}", FencingToken::generate());
    let (here, there) = (store(&table).await, store(&table).await);
    let engines = [Idempotency::new(here.clone()), Idempotency::new(there)];
    for round in 0..10 {
        // A round's answers make an engine leave the mode: back into it first.
        for engine in &engines {
            expecting_fresh_keys(engine).await;
        }
        let intent = format!("race-{round}-{}", FencingToken::generate());
        let mut callers = Vec::new();
        for n in 0..16 {
            let engine = engines[n % 2].clone();
            let intent = intent.clone();
            callers.push(tokio::spawn(async move {
                let req = request(&engine, &intent, b"{\"cents\":1}");
                charge(&engine, &req, &intent, n % 4 < 2).await
            }));
        }
        let mut executed = 0;
        for caller in callers {
            match caller.await.expect("a caller") {
                Ok(Outcome::Executed(_)) => executed += 1,
                Ok(Outcome::Answered(Answer::InFlight { .. } | Answer::Replay(_))) => {}
                other => panic!("round {round}: {other:?}"),
            }
        }
        assert_eq!(executed, 1, "round {round}");
        assert_eq!(charges(here.pool(), &intent).await, 1, "round {round}");
    }
}
