//! An effect that ends the store's transaction itself (C6, C8). PostgreSQL cannot refuse an
//! effect's own `COMMIT` or `ROLLBACK`: a helper written for autocommit that sends
//! `BEGIN; ...; COMMIT` inside the transaction (the nested `BEGIN` is only a warning) commits
//! it. The store marks its transaction (`DEFERRABLE`, which no statement in it undoes) and
//! completes only while it is open; otherwise the key is kept with a stored 500 of an unknown
//! outcome, never given back for a retry that charges again, never completed as if the effect
//! had committed with its completion.

mod common;

use common::{charges, pg_url, request, store_on, SCHEMA};
use idem_core::{FencingToken, Idempotency, Outcome, RunError, StoredResponse};
use idem_postgres::sqlx::{self, AssertSqlSafe};
use idem_postgres::{Isolation, PgIdempotency, PgStore, StatementMode};

/// How the effect ends the store's transaction, and what it returns after.
#[derive(Clone, Copy, Debug)]
enum Misuse {
    /// A helper's own `BEGIN; INSERT; COMMIT`, then a failing statement: the effect's error.
    CommitThenFail,
    /// An insert, its own `COMMIT`, then a 201.
    CommitThenAnswer,
    /// An insert, its own `ROLLBACK`, then a 201 (nothing of the insert is left).
    RollBackThenAnswer,
    /// Its own `ROLLBACK` (with one commit the reservation goes too), then an insert that
    /// commits on its own, then a 201.
    RollBackThenWrite,
    /// An insert, its own `COMMIT; BEGIN`, then a 201: a transaction is open again, not the
    /// store's.
    CommitBeginThenAnswer,
}

/// The charge's insert as a simple statement (it runs behind PgBouncer in transaction mode).
fn insert(intent: &str) -> String {
    format!(
        "INSERT INTO {SCHEMA}.charges (intent) VALUES ('{}')",
        intent.replace('\'', "''")
    )
}

async fn misused(
    tx: &mut sqlx::PgConnection,
    intent: &str,
    misuse: Misuse,
) -> Result<StoredResponse, sqlx::Error> {
    let insert = insert(intent);
    match misuse {
        Misuse::CommitThenFail => {
            let helper = format!("BEGIN; {insert}; COMMIT");
            sqlx::raw_sql(AssertSqlSafe(helper))
                .execute(&mut *tx)
                .await?;
            sqlx::raw_sql("SELECT 1 / 0").execute(&mut *tx).await?;
        }
        Misuse::RollBackThenWrite => {
            sqlx::raw_sql("ROLLBACK").execute(&mut *tx).await?;
            sqlx::raw_sql(AssertSqlSafe(insert))
                .execute(&mut *tx)
                .await?;
        }
        Misuse::CommitThenAnswer | Misuse::RollBackThenAnswer | Misuse::CommitBeginThenAnswer => {
            sqlx::raw_sql(AssertSqlSafe(insert))
                .execute(&mut *tx)
                .await?;
            let end = match misuse {
                Misuse::RollBackThenAnswer => "ROLLBACK",
                Misuse::CommitBeginThenAnswer => "COMMIT; BEGIN",
                _ => "COMMIT",
            };
            sqlx::raw_sql(end).execute(&mut *tx).await?;
        }
    }
    Ok(StoredResponse::new(201, "charged"))
}

/// One misuse on one store, one and two commits: the first answer keeps the key (in doubt),
/// the retry replays that answer and never runs the effect, and no 201 is told for what did
/// not commit.
async fn kept_in_doubt(store: PgStore, name: &str) {
    let idem = Idempotency::new(store);
    for misuse in [
        Misuse::CommitThenFail,
        Misuse::CommitThenAnswer,
        Misuse::RollBackThenAnswer,
        Misuse::RollBackThenWrite,
        Misuse::CommitBeginThenAnswer,
    ] {
        for one_commit in [false, true] {
            let intent = format!("own-{}", FencingToken::generate());
            let what = format!("{name}, {misuse:?}, one commit {one_commit}");
            let req = request(&idem, &intent).with_one_commit(one_commit);
            let effect_intent = intent.clone();
            let first = idem
                .run_in_transaction(&req, move |tx, _lease| {
                    Box::pin(async move { misused(tx, &effect_intent, misuse).await })
                })
                .await;
            assert!(
                matches!(first, Err(RunError::InDoubt(_))),
                "{what}: the key is kept with an unknown outcome, not {first:?}"
            );
            let retry_intent = intent.clone();
            let retry = idem
                .run_in_transaction(&req, move |tx, _lease| {
                    Box::pin(async move {
                        let charge = insert(&retry_intent);
                        sqlx::raw_sql(AssertSqlSafe(charge))
                            .execute(&mut *tx)
                            .await?;
                        Ok::<_, sqlx::Error>(StoredResponse::new(201, "charged"))
                    })
                })
                .await;
            // With one commit, an effect's ROLLBACK takes the reservation with it: the engine
            // writes it again, so that the key is kept all the same.
            match retry {
                Ok(Outcome::Answered(answer)) => {
                    let replayed = format!("{answer:?}");
                    assert!(
                        replayed.contains("500"),
                        "{what}: the retry replays the stored 500: {replayed}"
                    );
                }
                other => panic!("{what}: the retry must replay, never run again: {other:?}"),
            }
            let committed = charges(idem.store().pool(), &intent).await;
            let expected = match misuse {
                Misuse::RollBackThenAnswer => 0,
                _ => 1,
            };
            assert_eq!(committed, expected, "{what}: charges committed");
        }
    }
}

#[tokio::test]
async fn c08_an_effects_own_commit_or_rollback_keeps_the_key_in_doubt() {
    let direct = store_on(&pg_url(), StatementMode::Prepared, Isolation::ReadCommitted).await;
    kept_in_doubt(direct, "direct").await;
    let repeatable = store_on(
        &pg_url(),
        StatementMode::Prepared,
        Isolation::RepeatableRead,
    )
    .await;
    kept_in_doubt(repeatable, "repeatable read").await;
    let simple = store_on(
        &common::bouncer_url(),
        StatementMode::Simple,
        Isolation::ReadCommitted,
    )
    .await;
    kept_in_doubt(simple, "pgbouncer, simple statements").await;
}

/// What is not a misuse stays as it was: an effect that resets its session (`RESET ALL`) or
/// fails inside the transaction (an aborted transaction, still the store's) is executed, or
/// released for a retry that runs once.
#[tokio::test]
async fn c08_a_reset_or_a_failed_statement_is_no_misuse() {
    let store = store_on(&pg_url(), StatementMode::Prepared, Isolation::ReadCommitted).await;
    let idem = Idempotency::new(store);
    for one_commit in [false, true] {
        let intent = format!("reset-{}", FencingToken::generate());
        let req = request(&idem, &intent).with_one_commit(one_commit);
        let effect_intent = intent.clone();
        let reset = idem
            .run_in_transaction(&req, move |tx, _lease| {
                Box::pin(async move {
                    sqlx::raw_sql("RESET ALL").execute(&mut *tx).await?;
                    common::insert_charge(tx, effect_intent).await
                })
            })
            .await;
        assert!(matches!(reset, Ok(Outcome::Executed(_))), "{reset:?}");
        assert_eq!(charges(idem.store().pool(), &intent).await, 1);

        let intent = format!("fails-{}", FencingToken::generate());
        let req = request(&idem, &intent).with_one_commit(one_commit);
        let effect_intent = intent.clone();
        let failed = idem
            .run_in_transaction(&req, move |tx, _lease| {
                Box::pin(async move {
                    common::insert_charge(tx, effect_intent).await?;
                    sqlx::raw_sql("SELECT 1 / 0").execute(&mut *tx).await?;
                    Ok::<_, sqlx::Error>(StoredResponse::new(201, "unreachable"))
                })
            })
            .await;
        assert!(matches!(failed, Err(RunError::Released(_))), "{failed:?}");
        let retry_intent = intent.clone();
        let retry = idem
            .run_in_transaction(&req, move |tx, _lease| {
                common::insert_charge(tx, retry_intent)
            })
            .await;
        assert!(matches!(retry, Ok(Outcome::Executed(_))), "{retry:?}");
        assert_eq!(charges(idem.store().pool(), &intent).await, 1);
    }
}
