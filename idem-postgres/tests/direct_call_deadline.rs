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

    let kind = frozen
        .as_ref()
        .err()
        .and_then(|e| e.as_store())
        .map(|e| e.kind());
    assert_eq!(kind, Some(StoreErrorKind::Unavailable), "{frozen:?}");
    assert!(
        took < DEADLINE + Duration::from_millis(500),
        "answered in {took:?}, the deadline was {DEADLINE:?}"
    );

    // The link the deadline cut off is not reused: the next call answers.
    let again = store
        .lookup(request.id(), Deadline::after(Duration::from_secs(10)))
        .await;
    assert!(matches!(again, Ok(None)), "{again:?}");
}
