//! The guard form's transaction on the store's pool across a frozen primary's failover (C13,
//! C9): docs/http.md's handler opens its transaction on `store.pool()` (the pool the store
//! built, which "follows the store's hosts"). The primary goes silent (SIGSTOP) while a handler
//! is in that transaction, and the synchronous standby is promoted: the store and its pool move
//! to the new primary, but the handler's statement waits for the silent server forever (sqlx
//! sets no deadline and no TCP keepalive on the pool's connections), and the engine's heartbeat
//! renews its lease on the new primary all the while: the request never ends and its key is in
//! flight for as long as the process runs.

mod common;
mod support;

use idem_core::{Answer, Failure, FencingToken, Idempotency, Policy, StoredResponse};
use idem_postgres::sqlx;
use idem_postgres::PgStore;
use std::time::{Duration, Instant};
use support::pg_pair::PgPair;

const LEASE: Duration = Duration::from_millis(1500);
const STORE_TIMEOUT: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_handler_on_the_store_s_pool_is_not_held_forever_by_a_frozen_primary() {
    let pair = PgPair::start().await;
    let url = PgPair::hosts_url(pair.primary_port, pair.standby_port);
    let store = PgStore::builder()
        .table(&format!("p_{}", FencingToken::generate()))
        .max_connections(4)
        .acquire_timeout(STORE_TIMEOUT)
        .statement_timeout(Duration::from_millis(800))
        .lock_timeout(Duration::from_millis(500))
        .connect(&url)
        .await
        .expect("connect to the pair");
    store.migrate().await.expect("migrate");
    // The pool has a connection on the primary, as under traffic.
    sqlx::query("SELECT 1")
        .execute(store.pool())
        .await
        .expect("the pool");
    let policy = Policy::default().store_timeout(STORE_TIMEOUT).lease(LEASE);
    let idem = Idempotency::with_policy(store, policy).expect("policy");
    let request = |key: &str| {
        idem.request("acct", "POST", "/charges")
            .key(Some(key))
            .body(b"{}")
            .build()
            .expect("request")
    };

    let original = {
        let (idem, request) = (idem.clone(), request("held"));
        tokio::spawn(async move {
            idem.run(&request, |ctx| async move {
                // The handler's own transaction, docs/http.md's way, begun once the primary
                // is silent.
                tokio::time::sleep(Duration::from_millis(300)).await;
                let store = ctx.idem().store();
                let mut tx = store.pool().begin().await.map_err(Failure::from)?;
                sqlx::query("SELECT 1")
                    .execute(&mut *tx)
                    .await
                    .map_err(Failure::from)?;
                store
                    .complete_in(
                        &mut tx,
                        &ctx.completion(StoredResponse::new(201, "charged")),
                    )
                    .await
                    .map_err(|e| Failure::from(sqlx::Error::Protocol(e.to_string())))?;
                tx.commit().await.map_err(Failure::from)?;
                Ok::<_, Failure<sqlx::Error>>(StoredResponse::new(201, "charged"))
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let frozen = Thaw(pair.freeze_primary());
    tokio::time::sleep(Duration::from_millis(500)).await;
    pair.promote_standby().await;
    let promoted = Instant::now();

    // The store serves other keys from the new primary.
    let mut n = 0;
    loop {
        n += 1;
        let begun = idem.begin(&request(&format!("probe-{n}"))).await;
        if begun.is_ok() {
            break;
        }
        assert!(promoted.elapsed() < Duration::from_secs(10), "{begun:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "other keys served {:?} after the promotion",
        promoted.elapsed()
    );

    // Far past the lease and every deadline of the store.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let retry = idem.begin(&request("held")).await;
    let finished = original.is_finished();
    eprintln!(
        "{:?} after the promotion: the original finished: {finished}; its retry: {retry:?}",
        promoted.elapsed()
    );
    drop(frozen);
    assert!(
        finished,
        "the handler's request never ended (its transaction on the store's pool waits for the \
         silent old primary); its key is {}",
        match retry {
            Ok(idem_core::Begin::Answered(Answer::InFlight { .. })) => "in flight forever",
            _ => "elsewhere",
        }
    );
}

/// Thaws the frozen primary when dropped (the pair then stops it).
struct Thaw(Vec<i32>);

impl Drop for Thaw {
    fn drop(&mut self) {
        PgPair::thaw_all(&self.0);
    }
}
