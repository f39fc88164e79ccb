//! An effect still running at the store's transaction deadline is abandoned before any COMMIT
//! (C8, C13): nothing committed, but what the effect did outside the database (here a call to
//! a card network, counted) is unknown, so the key is never given back: the caller gets
//! `RunError::InDoubt`, a 500 of an unknown outcome is stored, and every retry replays it
//! without running the effect again.

mod common;
mod support;

use common::{pg_url, SCHEMA};
use idem_core::{Answer, FencingToken, Outcome, Policy, RunError, StoredResponse};
use idem_postgres::{PgIdempotency, PgStore};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::bench::Bench;

const TRANSACTION_TIMEOUT: Duration = Duration::from_millis(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c08_an_effect_abandoned_at_its_deadline_keeps_its_key_and_never_runs_again() {
    let builder = PgStore::builder()
        .max_connections(4)
        .transaction_timeout(TRANSACTION_TIMEOUT);
    let policy = Policy::default()
        .store_timeout(Duration::from_millis(700))
        .lease(Duration::from_secs(1));
    let bench = Bench::new(&pg_url(), SCHEMA, builder, policy).await;
    let request = bench.request(&format!("abandoned-{}", FencingToken::generate()));
    let card_calls = Arc::new(AtomicUsize::new(0));
    let first = late_charge(&bench, &request, &card_calls).await;
    assert!(
        matches!(first, Err(RunError::InDoubt(_))),
        "an abandoned effect's outcome is in doubt: {first:?}"
    );
    // Past the lease too: the key holds the stored 500, never a second call to the provider.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for _ in 0..2 {
        let retry = late_charge(&bench, &request, &card_calls).await;
        match retry {
            Ok(Outcome::Answered(Answer::Replay(stored))) => assert_eq!(stored.status, 500),
            other => panic!("the retry must replay the stored 500: {other:?}"),
        }
    }
    assert_eq!(
        card_calls.load(Ordering::SeqCst),
        1,
        "the provider was called once"
    );
    assert_eq!(bench.charges_of(&request).await, 0, "nothing committed");
}

/// The effect: the provider is called inside the transaction and answers after the deadline.
async fn late_charge(
    bench: &Bench,
    request: &idem_core::Request,
    calls: &Arc<AtomicUsize>,
) -> Result<Outcome, RunError<std::io::Error>> {
    let calls = Arc::clone(calls);
    bench
        .idem
        .run_in_transaction(request, move |_tx, _lease| {
            Box::pin(async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(TRANSACTION_TIMEOUT * 3).await;
                Ok::<_, std::io::Error>(StoredResponse::new(201, "charged"))
            })
        })
        .await
}
