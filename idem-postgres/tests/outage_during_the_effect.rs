//! The database goes away while the effect's transaction is open (C13, C8): the effect's next
//! statement fails on a broken connection and the effect returns that error. The transaction
//! never sent its COMMIT, so nothing committed: the caller gets the store-unavailable error (a
//! 503 with `Retry-After`), not the effect's own failure (a 500), the key is given back, and
//! the retry runs once.

mod common;
mod support;

use common::{pg_url, SCHEMA};
use fault_proxy::{Direction, Fault};
use idem_core::{Error, FencingToken, Outcome, Policy, RunError, StoreErrorKind, StoredResponse};
use idem_postgres::sqlx::{self, AssertSqlSafe};
use idem_postgres::{PgIdempotency, PgStore};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::bench::{kind, Bench, Charged};

const STORE_TIMEOUT: Duration = Duration::from_millis(700);
const LEASE: Duration = Duration::from_secs(20);

/// C13: a connection error during the effect is a 503 (`Error::Store`, unavailable), keeping
/// the effect's message; the transaction provably rolled back, so the key is released and the
/// retry runs at once, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_database_outage_during_the_effect_is_a_503_and_the_retry_runs_once() {
    let builder = PgStore::builder()
        .max_connections(4)
        .statement_timeout(Duration::from_millis(500))
        .lock_timeout(Duration::from_millis(400))
        .idle_in_transaction_timeout(Duration::from_millis(300));
    let policy = Policy::default().store_timeout(STORE_TIMEOUT).lease(LEASE);
    let bench = Arc::new(Bench::new(&pg_url(), SCHEMA, builder, policy).await);
    let request = bench.request(&format!("outage-{}", FencingToken::generate()));
    let (insert, intent) = bench.insert(&request);
    let proxy = Arc::clone(&bench.proxy);
    let started = Instant::now();
    let first: Charged = bench
        .idem
        .run_in_transaction(&request, move |tx, _lease| {
            Box::pin(async move {
                sqlx::query(AssertSqlSafe(insert.clone()))
                    .bind(intent.clone())
                    .execute(&mut *tx)
                    .await?;
                // The server goes away: the next statement meets a closed connection.
                proxy.set(Fault::HalfOpen(Direction::ToClient));
                let second = sqlx::query(AssertSqlSafe(insert))
                    .bind(intent)
                    .execute(&mut *tx)
                    .await;
                // ...and comes back for everyone else.
                proxy.set(Fault::PassThrough);
                second?;
                Ok::<_, sqlx::Error>(StoredResponse::new(201, "charged twice in one"))
            })
        })
        .await;
    let took = started.elapsed();
    eprintln!("the call: {} after {took:?}: {first:?}", kind(&first));
    match &first {
        Err(RunError::Idem(Error::Store(store))) => {
            assert_eq!(store.kind(), StoreErrorKind::Unavailable, "{store}");
            assert!(
                store.to_string().contains("connection") || format!("{store:?}").contains("Io"),
                "the effect's message is kept: {store}"
            );
        }
        other => panic!("a store outage during the effect must be a 503, got {other:?}"),
    }
    assert!(
        took < 3 * STORE_TIMEOUT,
        "answered within the deadline: {took:?}"
    );
    assert_eq!(bench.charges_of(&request).await, 0, "nothing committed");

    let retried = Instant::now();
    let retry = bench.charge(&request).await;
    eprintln!("the retry: {} after {:?}", kind(&retry), retried.elapsed());
    assert!(
        matches!(retry, Ok(Outcome::Executed(_))),
        "the key was released, the retry runs: {retry:?}"
    );
    assert_eq!(bench.charges_of(&request).await, 1, "charged exactly once");
}
