//! A store method called directly, outside the engine, on a server that froze (C13): it
//! answers within the deadline it was given, as unavailable, never hangs; once the server
//! answers again, so does the store.

mod common;
mod support;

use common::{pg_url, SCHEMA};
use fault_proxy::Fault;
use idem_core::store::Deadline;
use idem_core::{Policy, Store, StoreErrorKind};
use idem_postgres::PgStore;
use std::time::{Duration, Instant};
use support::bench::Bench;

const DEADLINE: Duration = Duration::from_millis(300);

/// C13: every public store method is bounded, whoever calls it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_direct_call_on_a_frozen_server_fails_within_its_deadline() {
    let builder = PgStore::builder()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(30))
        .statement_timeout(Duration::from_secs(30));
    let bench = Bench::new(&pg_url(), SCHEMA, builder, Policy::default()).await;
    let request = bench.request("frozen-direct");
    let store = bench.idem.store();
    // Warm: a connection is open before the server freezes.
    assert!(store
        .lookup(request.id(), Deadline::default())
        .await
        .expect("a lookup")
        .is_none());

    bench.proxy.set(Fault::Freeze);
    let started = Instant::now();
    let frozen = store.lookup(request.id(), Deadline::after(DEADLINE)).await;
    let took = started.elapsed();
    bench.proxy.set(Fault::PassThrough);

    unavailable_within(&frozen, took, DEADLINE);

    // The link the deadline cut off is not reused: the next call answers.
    let again = store
        .lookup(request.id(), Deadline::after(Duration::from_secs(10)))
        .await;
    assert!(matches!(again, Ok(None)), "{again:?}");
}

/// C13: the completion in your own transaction (`complete_in`, the guard style) is a store
/// call too: on a connection gone silent after the effect's statements it fails within the
/// store's statement deadline (the longer of it and the lock deadline), as unavailable, never hangs; nothing is committed, and once the
/// server answers again the store serves the next key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_completion_in_your_transaction_on_a_frozen_server_fails_within_its_deadline() {
    let statement = Duration::from_millis(400);
    let builder = PgStore::builder()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(30))
        .statement_timeout(statement)
        .lock_timeout(statement / 2);
    let bench = Bench::new(&pg_url(), SCHEMA, builder, Policy::default()).await;
    let request = bench.request("frozen-complete-in");
    let idem = &bench.idem;
    let idem_core::Begin::Acquired(lease) = idem.begin(&request).await.expect("begin") else {
        panic!("a fresh key")
    };
    let completion = idem.completion(&lease, idem_core::StoredResponse::new(201, "charged"));
    let mut tx = idem
        .store()
        .pool()
        .begin()
        .await
        .expect("begin the effect's transaction");
    let (insert, intent) = bench.insert(&request);
    idem_postgres::sqlx::query(idem_postgres::sqlx::AssertSqlSafe(insert))
        .bind(intent)
        .execute(&mut *tx)
        .await
        .expect("the effect");

    bench.proxy.set(Fault::Freeze);
    let started = Instant::now();
    let frozen = idem.store().complete_in(&mut tx, &completion).await;
    let took = started.elapsed();
    drop(tx); // rolled back, as after any error of the completion
    bench.proxy.set(Fault::PassThrough);

    unavailable_within(&frozen, took, statement);
    assert_eq!(bench.charges_of(&request).await, 0, "nothing committed");
    let next = bench.request("after-the-freeze");
    let charged = bench.charge(&next).await;
    assert!(
        matches!(charged, Ok(idem_core::Outcome::Executed(_))),
        "{charged:?}"
    );
    drop(lease);
}

/// A call that failed as unavailable within `deadline` (and half a second of slack).
fn unavailable_within<T: std::fmt::Debug>(
    answered: &Result<T, idem_core::Error>,
    took: Duration,
    deadline: Duration,
) {
    let kind = answered
        .as_ref()
        .err()
        .and_then(|e| e.as_store())
        .map(|e| e.kind());
    assert_eq!(kind, Some(StoreErrorKind::Unavailable), "{answered:?}");
    assert!(
        took < deadline + Duration::from_millis(500),
        "answered in {took:?}, the deadline was {deadline:?}"
    );
}
