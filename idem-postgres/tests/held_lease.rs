//! `Idempotency::complete_transaction` on PostgreSQL (C6, C9): a handler that holds its lease
//! (the HTTP layer's `Reservation::transaction`) runs its effect and completion in one
//! transaction while the execution's heartbeat keeps the lease alive. At REPEATABLE READ and
//! SERIALIZABLE a renewal from another connection during the transaction would make its
//! completion a serialization failure, so the heartbeat waits while the transaction is open.

mod common;

use common::{charges, pg_url, store_on};
use idem_core::{Failure, Idempotency, Lease, Outcome, Policy, Reply, Request, RunError};
use idem_core::{FencingToken, StoredResponse};
use idem_postgres::sqlx::{self, AssertSqlSafe, PgConnection};
use idem_postgres::{Isolation, PgEffect, PgStore, StatementMode};
use std::time::Duration;

fn request(idem: &Idempotency<PgStore>, intent: &str) -> Request {
    idem.request("acct_held", "POST", "/charges")
        .key(Some(intent))
        .body(b"{}")
        .build()
        .expect("a request")
}

/// The charge for `intent`, then `sleep` seconds in the transaction, then 201.
fn slow_charge(intent: &str, sleep: f64) -> PgEffect<String> {
    let insert = format!(
        "INSERT INTO idem_test.charges (intent) VALUES ('{}')",
        intent.replace('\'', "''")
    );
    Box::new(move |tx: &mut PgConnection, _lease: &Lease| {
        Box::pin(async move {
            sqlx::raw_sql(AssertSqlSafe(insert))
                .execute(&mut *tx)
                .await
                .map_err(|e| e.to_string())?;
            sqlx::raw_sql(AssertSqlSafe(format!("SELECT pg_sleep({sleep})")))
                .execute(&mut *tx)
                .await
                .map_err(|e| e.to_string())?;
            Ok(StoredResponse::new(201, "charged"))
        })
    })
}

/// What the HTTP layer does around a handler that calls `Reservation::transaction`: the
/// execution (its heartbeat renewing the lease), the handler's transaction inside it.
async fn under_the_layer(
    idem: &Idempotency<PgStore>,
    intent: &str,
    sleep: f64,
) -> Result<Outcome, RunError<String>> {
    let effect = slow_charge(intent, sleep);
    idem.run(&request(idem, intent), move |ctx| async move {
        match ctx.idem().complete_transaction(&ctx.lease(), effect).await {
            Ok(completion) => Ok(Reply::Completed(completion)),
            Err(RunError::Released(e)) => Err(Failure::nothing_happened(e)),
            Err(RunError::Idem(e)) => Err(Failure::nothing_happened(e.to_string())),
            Err(other) => Err(Failure::unknown(format!("{other:?}"))),
        }
    })
    .await
}

#[tokio::test]
async fn c09_a_held_lease_transaction_spanning_heartbeats_commits_at_every_isolation() {
    // A beat every 300 ms; the transaction lasts 700 ms, well within the lease.
    let lease = Duration::from_millis(900);
    for isolation in [
        Isolation::ReadCommitted,
        Isolation::RepeatableRead,
        Isolation::Serializable,
    ] {
        let store = store_on(&pg_url(), StatementMode::Prepared, isolation).await;
        let idem = Idempotency::with_policy(store, Policy::default().lease(lease)).expect("policy");
        let intent = format!("held-{isolation:?}-{}", FencingToken::generate());
        let result = under_the_layer(&idem, &intent, 0.7).await;
        let rows = charges(idem.store().pool(), &intent).await;
        assert!(
            matches!(result, Ok(Outcome::Executed(ref r)) if r.status == 201) && rows == 1,
            "{isolation:?}: {result:?}, charges = {rows}"
        );
    }
}
