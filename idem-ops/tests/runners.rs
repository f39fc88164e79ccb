//! The runners beside the engine: the periodic purge (C10) and reconciliation passes (C8).

use idem_core::{
    Failure, Idempotency, ManualClock, MemoryStore, Policy, Request, StoredResponse, Timestamp,
};
use idem_ops::reconcile::{Finding, InDoubt};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn request(idem: &Idempotency<MemoryStore>, key: &str) -> Request {
    idem.request("acct", "POST", "/charges")
        .key(Some(key))
        .body(b"{}")
        .build()
        .expect("request")
}

/// A record in doubt for `key`, noted `note`.
async fn in_doubt(idem: &Idempotency<MemoryStore>, key: &str, note: &'static str) {
    let ran = idem
        .run(&request(idem, key), move |_ctx| async move {
            Err::<StoredResponse, _>(Failure::unknown("the card network timed out").noting(note))
        })
        .await;
    assert!(ran.is_err(), "{ran:?}");
}

#[tokio::test]
async fn c10_the_purge_runs_every_period_until_stopped() {
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    let idem = Idempotency::with_policy(
        MemoryStore::with_clock(clock.clone()),
        Policy::default()
            .lease(Duration::from_secs(1))
            .purge_batch(2),
    )
    .expect("policy");
    for i in 0..5 {
        let _ = idem.begin(&request(&idem, &format!("k{i}"))).await;
    }
    clock.advance(Duration::from_secs(2));
    let purge = idem_ops::purge_every(&idem, Duration::from_millis(20));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !idem.store().is_empty() {
        assert!(Instant::now() < deadline, "the purge did not run");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    purge.stop().await;
}

#[tokio::test]
async fn c08_a_pass_settles_releases_and_defers_what_the_reconciler_found() {
    let idem = Idempotency::new(MemoryStore::new());
    in_doubt(&idem, "charged", "charged").await;
    in_doubt(&idem, "never", "never").await;
    in_doubt(&idem, "unknown", "unknown").await;
    let check = |case: InDoubt| async move {
        match case.doubt.note.as_str() {
            "charged" => Finding::settled(StoredResponse::new(201, "charged")),
            "never" => Finding::not_happened(),
            _ => Finding::still_unknown().retry_after(Duration::from_secs(3600)),
        }
    };
    let report = idem_ops::reconcile_now(&idem, &check)
        .await
        .expect("a pass");
    assert_eq!(
        (
            report.checked,
            report.settled,
            report.released,
            report.deferred
        ),
        (3, 1, 1, 1),
        "{report:?}"
    );
    let again = idem_ops::reconcile_now(&idem, &check)
        .await
        .expect("a pass");
    assert_eq!(again.checked, 0, "nothing due: {again:?}");
}

#[tokio::test]
async fn c08_a_reconciler_that_panics_leaves_the_record_in_doubt() {
    let idem = Idempotency::new(MemoryStore::new());
    in_doubt(&idem, "k", "k").await;
    let report = idem_ops::reconcile_now(&idem, &|_case: InDoubt| async {
        panic!("the reconciler failed");
        #[allow(unreachable_code)]
        Finding::not_happened()
    })
    .await
    .expect("a pass");
    assert_eq!((report.checked, report.deferred), (1, 1), "{report:?}");
    let case = idem_ops::reconcile::in_doubt(&idem, request(&idem, "k").id())
        .await
        .expect("read")
        .expect("still in doubt");
    assert_eq!(case.doubt.attempts, 1);
}

#[tokio::test]
async fn c08_reconciling_checks_every_period_until_stopped() {
    let idem = Idempotency::new(MemoryStore::new());
    in_doubt(&idem, "k", "k").await;
    let checks = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&checks);
    let reconciling =
        idem_ops::reconcile_every(&idem, Duration::from_millis(20), move |_case: InDoubt| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Finding::not_happened() }
        });
    let deadline = Instant::now() + Duration::from_secs(5);
    while checks.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "no pass ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    reconciling.stop().await;
    let begun = idem.begin(&request(&idem, "k")).await.expect("begin");
    assert!(
        matches!(begun, idem_core::Begin::Acquired(_)),
        "released: {begun:?}"
    );
}
