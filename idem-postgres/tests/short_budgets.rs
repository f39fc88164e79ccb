//! Budgets shorter than a statement, under load (C13): a call cut off mid-statement leaves its
//! connection to settle and serve the next calls, rather than closing it, so the store keeps
//! serving on about as many connections as it has, instead of opening one per cut-off until
//! nothing is served.

mod common;
mod support;

use common::{pg_url, request};
use idem_core::{FencingToken, Idempotency, Policy};
use idem_postgres::PgStore;
use std::time::Duration;
use support::short_budgets::hammer;

const CONNECTIONS: u32 = 8;

/// C13: 32 callers with budgets of 20 – 50 ms on 8 connections, through a proxy that counts
/// the connections opened. Closing each cut-off connection opened about 600 a second and
/// served nothing (a debug build); settling them serves thousands on a few dozen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_short_budgets_under_load_are_served_without_a_reconnection_storm() {
    served_without_a_storm("").await;
}

/// C13: the same with one host name given `read-write` (a cluster's writer endpoint): a
/// statement cut off has its host checked, not left, so no cut-off starts a new epoch that
/// would close every connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_short_budgets_on_one_read_write_name_are_served_without_a_reconnection_storm() {
    served_without_a_storm("?target_session_attrs=read-write").await;
}

async fn served_without_a_storm(query: &str) {
    let (proxy, through) = support::proxied(&pg_url()).await;
    let through = format!("{through}{query}");
    let store = PgStore::builder()
        .table(&format!("sb_{}", FencingToken::generate()))
        .max_connections(CONNECTIONS)
        .acquire_timeout(Duration::from_secs(2))
        .connect(&through)
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    let idem = Idempotency::with_policy(store, Policy::default()).expect("policy");
    hammer(&idem, &proxy, 20, |idem, key, budget| async move {
        let asked = request(&idem, &key).with_store_budget(budget);
        idem.begin(&asked).await.is_ok()
    })
    .await
    .assert_at_least_served_at_most_opened(300, 300);
}
