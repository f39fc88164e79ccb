//! PostgreSQL unreachable after an effect outside the database (C8): the closure form's effect
//! ran (an external call), then the network to the server froze for longer than the lease. The
//! caller is answered 500 within the lease, the execution keeps trying to complete, a retry in
//! this process meanwhile is in flight, and once the network is back the completion lands and
//! the retry replays it. One effect.

mod common;
mod support;

use common::{pg_url, SCHEMA};
use fault_proxy::Fault;
use idem_core::{
    Answer, Begin, Failure, FencingToken, Idempotency, Outcome, Policy, RunError, StoredResponse,
};
use idem_postgres::PgStore;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const LEASE: Duration = Duration::from_secs(1);
const STORE_TIMEOUT: Duration = Duration::from_millis(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c08_a_server_unreachable_past_the_lease_never_turns_into_a_second_execution() {
    let (proxy, url) = support::proxied(&pg_url()).await;
    let store = PgStore::builder()
        .schema(SCHEMA)
        .table(&format!("t_{}", FencingToken::generate()))
        .connect(&url)
        .await
        .expect("connect through the proxy");
    store.migrate().await.expect("migrate");
    let policy = Policy::default().lease(LEASE).store_timeout(STORE_TIMEOUT);
    let idem = Idempotency::with_policy(store, policy).expect("policy");
    let request = idem
        .request("acct", "POST", "/payouts")
        .key(Some("unreachable"))
        .body(b"{}")
        .build()
        .expect("valid");
    let proxy = Arc::new(proxy);
    let effects = Arc::new(AtomicUsize::new(0));
    let run = |freeze: bool| {
        let (idem, request, effects, proxy) = (
            idem.clone(),
            request.clone(),
            Arc::clone(&effects),
            Arc::clone(&proxy),
        );
        async move {
            idem.run(&request, move |_| async move {
                effects.fetch_add(1, Ordering::SeqCst);
                if freeze {
                    // The payout was sent; now the database cannot be reached.
                    proxy.set(Fault::Freeze);
                }
                Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "paid out"))
            })
            .await
        }
    };
    let started = Instant::now();
    let first = run(true).await;
    assert!(
        matches!(first, Err(RunError::Incomplete(ref e)) if e.is_retryable()),
        "{first:?}"
    );
    assert!(
        started.elapsed() < LEASE + STORE_TIMEOUT * 2,
        "answered within the lease: {:?}",
        started.elapsed()
    );
    // Past the lease, the network still frozen: a retry here is in flight, never run again.
    tokio::time::sleep(LEASE).await;
    let retry = run(false).await.expect("answered");
    assert!(
        matches!(retry, Outcome::Answered(Answer::InFlight { .. })),
        "{retry:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    proxy.set(Fault::PassThrough);
    let until = Instant::now() + Duration::from_secs(10);
    let replayed = loop {
        if let Ok(Begin::Answered(Answer::Replay(stored))) = idem.begin(&request).await {
            break stored;
        }
        assert!(Instant::now() < until, "the completion never landed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(replayed.body, b"paid out");
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert_eq!(idem.shutdown_within(Duration::from_secs(5)).await, 0);
}
