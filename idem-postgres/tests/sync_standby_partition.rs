//! A synchronous standby cut off from its primary, then promoted (C6, C8, C13): docs/stores.md
//! promises that `synchronous_commit = on` and a synchronous standby lose no commit in a
//! failover. While the primary's link to its standby is silent (its WAL receiver stopped),
//! every commit waits for the standby. PostgreSQL ends a commit's wait for its standby when a
//! `statement_timeout` fires inside it; the store's own statements run under one, but the
//! server disables it before a statement's implicit commit, so the wait holds: the call is a
//! 503 within its budget, nothing is acknowledged that the standby lacks, and the retry after
//! the promotion runs the effect once.

mod common;
mod support;

use idem_core::{Answer, FencingToken, Idempotency, Outcome, Policy, StoredResponse};
use idem_core::{Failure, RunError};
use idem_postgres::PgStore;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::pg_pair::PgPair;

const STORE_TIMEOUT: Duration = Duration::from_secs(5);
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(1);
const LEASE: Duration = Duration::from_secs(3);

/// C6, C8, C13: a payout (an external effect, `run`) whose completion only the primary has is
/// never reported done; after the synchronous standby is promoted, the retry replays it (or,
/// if it was never reported done, the key was never given back silently): the provider is
/// called once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c06_a_completion_the_synchronous_standby_lacks_is_never_acknowledged() {
    let pair = PgPair::start().await;
    let url = PgPair::hosts_url(pair.primary_port, pair.standby_port);
    let store = PgStore::builder()
        .table(&format!("s_{}", FencingToken::generate()))
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(2))
        .statement_timeout(STATEMENT_TIMEOUT)
        .lock_timeout(Duration::from_millis(500))
        .connect(&url)
        .await
        .expect("connect to the pair");
    store.migrate().await.expect("migrate");
    let policy = Policy::default().store_timeout(STORE_TIMEOUT).lease(LEASE);
    let idem = Idempotency::with_policy(store, policy).expect("policy");
    let request = idem
        .request("acct", "POST", "/payouts")
        .key(Some("partitioned"))
        .body(b"{\"cents\":2500}")
        .build()
        .expect("request");
    let payouts = Arc::new(AtomicUsize::new(0));
    let pay = || {
        let (idem, request, payouts) = (idem.clone(), request.clone(), Arc::clone(&payouts));
        async move {
            idem.run(&request, move |_| async move {
                let n = payouts.fetch_add(1, Ordering::SeqCst) + 1;
                Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, format!("payout {n}")))
            })
            .await
        }
    };

    // The primary's link to its synchronous standby goes silent.
    let receiver = pair.freeze_wal_receiver().await;
    let started = Instant::now();
    let first = pay().await;
    eprintln!(
        "while the standby was cut off: {first:?} after {:?}",
        started.elapsed()
    );

    // The primary dies; the standby (which never saw the payout's records) is promoted.
    pair.kill_primary().await;
    PgPair::thaw(receiver);
    pair.promote_standby().await;

    let until = Instant::now() + Duration::from_secs(30);
    let retry = loop {
        let retry = pay().await;
        let settled = match &retry {
            Ok(Outcome::Answered(Answer::InFlight { .. })) => false,
            Ok(_) => true,
            Err(RunError::Idem(e)) if e.is_retryable() => false,
            Err(_) => true,
        };
        if settled || Instant::now() >= until {
            break retry;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("the retry after the promotion: {retry:?}");
    let reported_done = matches!(first, Ok(Outcome::Executed(_)));
    assert!(
        !(reported_done && matches!(retry, Ok(Outcome::Executed(_)))),
        "the first call was reported executed ({first:?}), then the promoted synchronous \
         standby had no record of it and the retry ran the effect again ({retry:?})"
    );
    assert_eq!(
        payouts.load(Ordering::SeqCst),
        1,
        "the provider was called once: first {first:?}, retry {retry:?}"
    );
}
