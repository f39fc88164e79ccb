//! Completions that go on past the lease (C8, C9, C13): one that never fits the store timeout
//! while the store takes smaller writes is replaced by the small stored 500, so the key
//! resolves and a shutdown finishes; the 500 stored in place of an unwritten completion goes on
//! past the lease like every other completion, so a retry in this process is in flight, never
//! a second run.

mod support;

use idem_core::{
    Answer, Begin, Failure, Idempotency, Outcome, Policy, Reply, RunError, StoredResponse,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{request, slow_large_writes, Faulty};

#[tokio::test]
async fn c08_a_completion_that_never_fits_the_store_timeout_resolves_and_lets_shutdown_finish() {
    let (_store, idem, other) = slow_large_writes();
    let req = request(&idem, "large-report");
    let effects = Arc::new(AtomicUsize::new(0));
    let e = Arc::clone(&effects);
    let first = idem
        .run(&req, move |_| async move {
            e.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failure<&'static str>>(StoredResponse::new(200, vec![b'x'; 100_000]))
        })
        .await;
    eprintln!("first = {first:?}");
    assert!(matches!(first, Err(RunError::Incomplete(_))), "{first:?}");

    // Ten leases later: still nothing stored, and the key still held in the store.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let seen = other.begin(&req).await.expect("begin");
    eprintln!("another instance, ten leases later: {seen:?}");
    let shutdown = tokio::time::timeout(Duration::from_secs(3), idem.shutdown()).await;
    eprintln!("shutdown within 3 s: {:?}", shutdown.is_ok());
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert!(
        !matches!(seen, Begin::Answered(Answer::InFlight { .. })),
        "a completion that cannot be written within the store timeout is retried for ever: \
         the key is in flight for ever (the heartbeat keeps renewing it): {seen:?}"
    );
    assert!(
        shutdown.is_ok(),
        "shutdown waits for ever on the completion"
    );
}

#[tokio::test]
async fn c08_a_500_stored_in_place_of_an_unwritten_completion_goes_on_past_the_lease() {
    let store = Arc::new(Faulty::default());
    let idem = Idempotency::with_policy(
        Arc::clone(&store),
        Policy::default().lease(Duration::from_millis(200)),
    )
    .expect("policy");
    let req = request(&idem, "unwritten-completion");
    let effects = Arc::new(AtomicUsize::new(0));
    let run = |effects: Arc<AtomicUsize>, store: Arc<Faulty>| {
        let idem = idem.clone();
        let req = req.clone();
        async move {
            idem.run(&req, move |ctx| async move {
                effects.fetch_add(1, Ordering::SeqCst);
                // The effect ran (a call out, say); its own transaction's commit failed with
                // the store, which now cannot be written. It returns the completion it meant
                // to commit.
                store.unwritable.store(true, Ordering::SeqCst);
                let completion = ctx.completion(StoredResponse::new(201, "charged"));
                Ok::<_, Failure<&'static str>>(Reply::Completed(completion))
            })
            .await
        }
    };
    let first = run(Arc::clone(&effects), Arc::clone(&store)).await;
    eprintln!("first = {first:?}");
    // Past the lease, the store still unwritable: a retry in this same process.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let retry = run(Arc::clone(&effects), Arc::clone(&store)).await;
    eprintln!("retry after {:?} = {retry:?}", started.elapsed());
    assert!(
        matches!(retry, Ok(Outcome::Answered(Answer::InFlight { .. }))),
        "a retry while the 500 is still being written is in flight: {retry:?}"
    );
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "the 500 for an unwritten completion was given up at the lease; a retry in the same \
         process took the record over and ran the effect again"
    );
}

/// C8, C16: in guard style too, a completion not stored within the lease (every write times
/// out) goes on past it on a task of its own, the lease kept alive: `complete` answers the
/// error, and another process a few leases later finds the key in flight or the stored 500,
/// never free to run the effect again.
#[tokio::test]
async fn c08_a_guard_completion_not_stored_within_the_lease_goes_on_past_it() {
    let (_store, idem, other) = slow_large_writes();
    let req = request(&idem, "guard-large-report");
    let Begin::Acquired(lease) = idem.begin(&req).await.expect("begin") else {
        panic!("a fresh key is acquired");
    };
    let completed = idem
        .complete(lease, StoredResponse::new(200, vec![b'x'; 100_000]))
        .await;
    assert!(completed.is_err(), "{completed:?}");

    tokio::time::sleep(Duration::from_millis(1000)).await;
    let later = other.begin(&req).await.expect("begin");
    assert!(
        matches!(
            &later,
            Begin::Answered(Answer::InFlight { .. }) | Begin::Answered(Answer::Replay(_))
        ),
        "the key was free to run again: {later:?}"
    );
    if let Begin::Answered(Answer::Replay(stored)) = &later {
        assert_eq!(stored.status, 500, "{stored:?}");
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), idem.drain()).await;
}
