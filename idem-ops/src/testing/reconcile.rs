//! The conformance scenarios of records in doubt (store rules 6 and 7, Operator rule 4;
//! docs/state-machine.md, "Records in doubt"): marked, listed oldest first, settled, released,
//! deferred, and decided once however many deciders race.

use super::listing::{engine, every_page, fresh};
use super::{policy, request, unique_consumer, OperatorHarness, SHORT_RETENTION};
use crate::reconcile::{self, Decided, DoubtCause, Finding, InDoubt, Reconciliation};
use crate::Noted;
use crate::{ListQuery, ListedState, Operator};
use idem_core::store::Deadline;
use idem_core::store::Store;
use idem_core::{Answer, Failure, Idempotency, Outcome, Request, RunError, StoredResponse};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Runs `request` to an unknown outcome, noting `note`: the record keeps its key with the
/// answer in doubt (C8).
async fn in_doubt<S: Store + 'static>(idem: &Idempotency<S>, request: &Request, note: &str) {
    let note = note.to_owned();
    let result = idem
        .run(request, |_ctx| async move {
            Err::<StoredResponse, _>(Failure::unknown("the provider timed out").noting(note))
        })
        .await;
    match result {
        Err(RunError::Unknown { response, .. }) => assert_eq!(response.status, 500),
        other => panic!("expected an unknown outcome, got {other:?}"),
    }
}

/// Runs `request` with a handler that answers `status` and counts its runs in `runs`.
async fn run_counted<S: Store + 'static>(
    idem: &Idempotency<S>,
    request: &Request,
    runs: &Arc<AtomicUsize>,
    status: u16,
) -> Outcome {
    let runs = Arc::clone(runs);
    idem.run(request, move |_ctx| async move {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Failure<std::io::Error>>(StoredResponse::new(status, "executed"))
    })
    .await
    .expect("run")
}

async fn case<S: Operator + 'static>(idem: &Idempotency<S>, request: &Request) -> InDoubt {
    reconcile::in_doubt(idem, request.id())
        .await
        .expect("read")
        .expect("the record is in doubt")
}

async fn trail<S: Operator>(store: &S, request: &Request) -> Vec<Reconciliation> {
    store
        .reconciliations(request.id(), Deadline::default())
        .await
        .expect("the audit trail reads")
}

/// A reconciliation pass by hand (idem-ops runs the real one over the same calls): every
/// record the store lists as due for a check is read and decided with `check`'s finding. The
/// decisions, in listing order.
async fn decide_due<S, F>(idem: &Idempotency<S>, check: F) -> Vec<Option<Decided>>
where
    S: Operator + 'static,
    F: Fn(&InDoubt) -> Finding,
{
    let mut decided = Vec::new();
    for listed in every_page(idem.store(), ListQuery::due_for_reconciliation(), 10).await {
        if let Some(case) = reconcile::in_doubt(idem, &listed.id)
            .await
            .expect("read a record in doubt")
        {
            let finding = check(&case);
            let resolved = reconcile::resolve(idem, &case, finding, "reconciler pass").await;
            decided.push(resolved.expect("a decision stored"));
        }
    }
    decided
}

/// C8: an unknown outcome's answer is marked in doubt, with its cause and the handler's note,
/// due for a check at once; only such records are listed in doubt, oldest first, a page at a
/// time; they are counted apart in the stats; the record read whole gives what a reconciler
/// needs (the answer, the fingerprint, the key the handler sent downstream).
pub async fn c08_doubt_an_unknown_outcome_is_marked_and_listed_oldest_first<H: OperatorHarness>(
    harness: &H,
) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c08d");
    let doubtful: Vec<Request> = (0..3)
        .map(|i| request(&consumer, &format!("doubt-{i}"), b"{}"))
        .collect();
    for (i, request) in doubtful.iter().enumerate() {
        in_doubt(&idem, request, &format!("provider key {i}")).await;
        // Reservation times a few milliseconds apart: the listing's order is theirs.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let runs = Arc::new(AtomicUsize::new(0));
    let _ = run_counted(&idem, &request(&consumer, "fine", b"{}"), &runs, 201).await;
    let fine_500 = request(&consumer, "fine-500", b"{}");
    let _ = run_counted(&idem, &fine_500, &runs, 500).await;

    let listed = every_page(&*store, ListQuery::in_doubt(), 2).await;
    let keys: Vec<&str> = listed.iter().map(|r| r.id.key()).collect();
    assert_eq!(
        keys,
        ["doubt-0", "doubt-1", "doubt-2"],
        "only the records in doubt, oldest first (a 500 the handler chose is its own answer)"
    );
    for (i, record) in listed.iter().enumerate() {
        assert!(
            matches!(record.state, ListedState::Completed { status: 500, .. }),
            "{record:?}"
        );
        let Some(Noted::Known(doubt)) = &record.doubt else {
            panic!("the listing shows the mark: {record:?}");
        };
        assert_eq!(doubt.cause, DoubtCause::Failure);
        assert_eq!(doubt.note, format!("provider key {i}"));
        assert_eq!(doubt.attempts, 0);
        assert!(record.check_at.is_some(), "due at once: {record:?}");
    }
    let due = every_page(&*store, ListQuery::due_for_reconciliation(), 10).await;
    assert_eq!(due.len(), 3, "due for a check at once: {due:?}");

    let stats = store.stats(Deadline::default()).await.expect("stats");
    assert_eq!(stats.in_doubt, 3, "{stats:?}");
    assert_eq!(
        stats.completed, 5,
        "records in doubt are completed too: {stats:?}"
    );

    let first = case(&idem, &doubtful[0]).await;
    assert_eq!(first.answer.status, 500);
    assert_eq!(first.doubt.note, "provider key 0");
    assert_eq!(first.fingerprint, *doubtful[0].fingerprint());
    assert_eq!(first.downstream_key(), doubtful[0].id().downstream_key());
    assert!(first.completed_at.is_some() && first.reserved_at.is_some());
    assert!(
        reconcile::in_doubt(&idem, fine_500.id())
            .await
            .expect("read")
            .is_none(),
        "a handler's own 500 is not in doubt"
    );
    assert!(trail(&*store, &doubtful[0]).await.is_empty());
}

/// C8, C7: settling a record in doubt stores the real answer in its place; every retry replays
/// it and nothing runs again; the record leaves the listing; the audit trail has the decision,
/// by whom, what was asked and answered, about which execution.
pub async fn c08_doubt_settling_stores_the_real_answer_and_the_retry_replays_it<
    H: OperatorHarness,
>(
    harness: &H,
) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c08s");
    let charge = request(&consumer, "settle", b"{\"amount\":100}");
    in_doubt(&idem, &charge, "auth-1").await;
    let runs = Arc::new(AtomicUsize::new(0));
    let before = run_counted(&idem, &charge, &runs, 201).await;
    assert!(
        matches!(&before, Outcome::Answered(Answer::Replay(r)) if r.status == 500),
        "a retry before the settlement replays the answer in doubt: {before:?}"
    );

    let case = case(&idem, &charge).await;
    let real = StoredResponse::new(201, r#"{"id":"ch_1"}"#)
        .with_header("content-type", "application/json");
    let finding = Finding::settled(real.clone())
        .asked("GET /authorizations/auth-1")
        .answered("captured");
    let resolved = reconcile::resolve(&idem, &case, finding, "reconciler test")
        .await
        .expect("resolve");
    assert!(
        resolved == Some(Decided::Settled { status: 201 }),
        "{resolved:?}"
    );

    let retry = run_counted(&idem, &charge, &runs, 201).await;
    match retry {
        Outcome::Answered(Answer::Replay(replayed)) => assert_eq!(replayed, real),
        other => panic!("expected the settled answer replayed, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran again");
    assert!(reconcile::in_doubt(&idem, charge.id())
        .await
        .expect("read")
        .is_none());
    assert!(every_page(&*store, ListQuery::in_doubt(), 10)
        .await
        .is_empty());
    assert_eq!(
        store
            .stats(Deadline::default())
            .await
            .expect("stats")
            .in_doubt,
        0
    );
    let inspected = store
        .inspect(charge.id(), Deadline::default())
        .await
        .expect("inspect")
        .expect("the record stays");
    assert_eq!(inspected.doubt, None);

    let entries = trail(&*store, &charge).await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    let entry = &entries[0];
    assert_eq!(entry.decided, Decided::Settled { status: 201 });
    assert_eq!(entry.by, "reconciler test");
    assert_eq!(entry.asked, "GET /authorizations/auth-1");
    assert_eq!(entry.answer, "captured");
    assert_eq!(entry.token, case.token);
    let completed_at = case.completed_at.expect("known");
    assert!(entry.at >= completed_at, "{entry:?} after {completed_at:?}");
}

/// C8: releasing a record in doubt (its effect did not happen) gives the key back: the next
/// retry executes, once; the audit trail of the released record stays.
pub async fn c08_doubt_releasing_lets_the_retry_execute_once<H: OperatorHarness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c08r");
    let charge = request(&consumer, "release", b"{}");
    in_doubt(&idem, &charge, "auth-2").await;
    let case = case(&idem, &charge).await;
    let finding = Finding::not_happened().answered("no authorization under this key");
    assert_eq!(
        reconcile::resolve(&idem, &case, finding, "operator alice")
            .await
            .expect("resolve"),
        Some(Decided::Released)
    );
    assert!(store
        .lookup(charge.id(), Deadline::default())
        .await
        .expect("lookup")
        .is_none());

    let runs = Arc::new(AtomicUsize::new(0));
    let (a, b) = tokio::join!(
        run_counted(&idem, &charge, &runs, 201),
        run_counted(&idem, &charge, &runs, 201)
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the retry executes once: {a:?} {b:?}"
    );
    assert!(reconcile::in_doubt(&idem, charge.id())
        .await
        .expect("read")
        .is_none());

    let entries = trail(&*store, &charge).await;
    assert_eq!(
        entries.len(),
        1,
        "the trail outlives the release: {entries:?}"
    );
    assert_eq!(entries[0].decided, Decided::Released);
    assert_eq!(entries[0].by, "operator alice");
    assert_eq!(entries[0].answer, "no authorization under this key");
}

/// C8: a record still unknown keeps its answer and is due again only after its backoff; each
/// check counts an attempt and leaves an entry; a reconciliation pass checks only what is due.
pub async fn c08_doubt_still_unknown_backs_off_and_counts_attempts<H: OperatorHarness>(
    harness: &H,
) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c08u");
    let charge = request(&consumer, "unknown", b"{}");
    in_doubt(&idem, &charge, "auth-3").await;
    let first = case(&idem, &charge).await;
    let later = Duration::from_millis(600);
    let finding = Finding::still_unknown()
        .answered("provider unreachable")
        .retry_after(later);
    let resolved = reconcile::resolve(&idem, &first, finding, "reconciler test")
        .await
        .expect("resolve");
    assert_eq!(
        resolved,
        Some(Decided::StillUnknown {
            attempt: 1,
            retry_after: later
        })
    );
    let deferred = case(&idem, &charge).await;
    assert_eq!(deferred.doubt.attempts, 1);
    assert_eq!(deferred.answer.status, 500, "the answer in doubt stays");
    assert!(
        every_page(&*store, ListQuery::due_for_reconciliation(), 10)
            .await
            .is_empty(),
        "not due before its backoff"
    );
    assert_eq!(
        every_page(&*store, ListQuery::in_doubt(), 10).await.len(),
        1
    );

    let still = |_case: &InDoubt| {
        Finding::still_unknown()
            .answered("still nothing")
            .retry_after(Duration::from_secs(3600))
    };
    let early = decide_due(&idem, still).await;
    assert!(
        early.is_empty(),
        "nothing due before its backoff: {early:?}"
    );

    tokio::time::sleep(later + Duration::from_millis(100)).await;
    let due = decide_due(&idem, still).await;
    assert!(
        matches!(due[..], [Some(Decided::StillUnknown { attempt: 2, .. })]),
        "{due:?}"
    );
    assert_eq!(case(&idem, &charge).await.doubt.attempts, 2);

    let entries = trail(&*store, &charge).await;
    let attempts: Vec<Decided> = entries.iter().map(|e| e.decided).collect();
    assert_eq!(
        attempts,
        [
            Decided::StillUnknown {
                attempt: 1,
                retry_after: later
            },
            Decided::StillUnknown {
                attempt: 2,
                retry_after: Duration::from_secs(3600)
            }
        ]
    );
    assert!(entries[0].at <= entries[1].at, "oldest first: {entries:?}");
}

/// C6, C8: deciders racing on one record in doubt (reconcilers in several processes, an
/// operator) each read the same mark; exactly one decision is applied and recorded, whatever
/// the others decided, round after round.
pub async fn c06_doubt_racing_reconcilers_decide_once<H: OperatorHarness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c06d");
    for round in 0..4 {
        let charge = request(&consumer, &format!("race-{round}"), b"{}");
        in_doubt(&idem, &charge, "auth").await;
        let read = case(&idem, &charge).await;
        let deciders = (0..8).map(|i| {
            let idem = idem.clone();
            let read = read.clone();
            tokio::spawn(async move {
                let finding = match i % 3 {
                    0 => Finding::settled(StoredResponse::new(201, format!("settled by {i}"))),
                    1 => Finding::not_happened(),
                    _ => Finding::still_unknown(),
                };
                reconcile::resolve(&idem, &read, finding, &format!("decider {i}")).await
            })
        });
        let mut won = Vec::new();
        for decider in deciders.collect::<Vec<_>>() {
            let resolved = decider.await.expect("no panic").expect("resolve");
            if let Some(decided) = resolved {
                won.push(decided);
            }
        }
        assert_eq!(won.len(), 1, "round {round}: one decision wins: {won:?}");
        let entries = trail(&*store, &charge).await;
        assert_eq!(entries.len(), 1, "round {round}: one entry: {entries:?}");
        let now = store
            .lookup(charge.id(), Deadline::default())
            .await
            .expect("lookup");
        match (&won[0], entries[0].decided) {
            (Decided::Settled { status: 201 }, Decided::Settled { status: 201 }) => {
                let record = now.expect("settled record");
                assert!(matches!(
                    record.state,
                    idem_core::store::RecordState::Completed { ref response, .. }
                        if response.status == 201 && response.body.starts_with(b"settled by ")
                ));
            }
            (Decided::Released, Decided::Released) => assert!(now.is_none()),
            (
                Decided::StillUnknown { attempt: 1, .. },
                Decided::StillUnknown { attempt: 1, .. },
            ) => {
                assert_eq!(case(&idem, &charge).await.doubt.attempts, 1);
            }
            (won, entry) => panic!("round {round}: {won:?} recorded as {entry:?}"),
        }
    }
}

/// C6, C9: a decision about an execution in doubt cannot touch the next execution of its key:
/// once released and run again (even into doubt again), the record carries another token, and
/// the old decision is contested, nothing written.
pub async fn c06_doubt_a_decision_about_an_old_execution_cannot_touch_a_new_one<
    H: OperatorHarness,
>(
    harness: &H,
) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c06o");
    let charge = request(&consumer, "again", b"{}");
    in_doubt(&idem, &charge, "first").await;
    let old = case(&idem, &charge).await;
    assert_eq!(
        reconcile::resolve(&idem, &old, Finding::not_happened(), "operator")
            .await
            .expect("release"),
        Some(Decided::Released)
    );
    in_doubt(&idem, &charge, "second").await;
    let new = case(&idem, &charge).await;
    assert_ne!(new.token, old.token);
    let late = Finding::settled(StoredResponse::new(201, "late"));
    assert_eq!(
        reconcile::resolve(&idem, &old, late, "a late reconciler")
            .await
            .expect("resolve"),
        None
    );
    let still = case(&idem, &charge).await;
    assert_eq!(
        (still.token, still.doubt.note.as_str()),
        (new.token, "second")
    );
    assert_eq!(
        trail(&*store, &charge).await.len(),
        1,
        "the contested decision left no entry"
    );
}

/// C8: a reconciliation pass checks every record in doubt that is due, and only those, and
/// applies what the reconciler found for each: one settled, one released.
pub async fn c08_doubt_a_pass_settles_and_releases_what_the_reconciler_found<H: OperatorHarness>(
    harness: &H,
) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c08p");
    let charged = request(&consumer, "charged", b"{}");
    let never = request(&consumer, "never", b"{}");
    in_doubt(&idem, &charged, "net-charged").await;
    in_doubt(&idem, &never, "net-never").await;
    let runs = Arc::new(AtomicUsize::new(0));
    let _ = run_counted(&idem, &request(&consumer, "fine", b"{}"), &runs, 201).await;

    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let asked = Arc::clone(&seen);
    let check = move |case: &InDoubt| {
        asked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(case.id.key().to_owned());
        match case.doubt.note.as_str() {
            "net-charged" => {
                Finding::settled(StoredResponse::new(201, "charged")).asked(case.downstream_key())
            }
            _ => Finding::not_happened().asked(case.downstream_key()),
        }
    };
    let decided = decide_due(&idem, &check).await;
    let settled = decided
        .iter()
        .filter(|d| matches!(d, Some(Decided::Settled { .. })))
        .count();
    let released = decided
        .iter()
        .filter(|d| matches!(d, Some(Decided::Released)))
        .count();
    assert_eq!((decided.len(), settled, released), (2, 1, 1), "{decided:?}");
    let seen: Vec<String> = seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .cloned()
        .collect();
    assert_eq!(
        seen,
        ["charged", "never"],
        "only the records in doubt are checked"
    );
    let again = decide_due(&idem, &check).await;
    assert!(again.is_empty(), "nothing left in doubt: {again:?}");

    let replay = run_counted(&idem, &charged, &runs, 201).await;
    assert!(matches!(&replay, Outcome::Answered(Answer::Replay(r)) if r.body == b"charged"));
    let rerun = run_counted(&idem, &never, &runs, 201).await;
    assert!(matches!(rerun, Outcome::Executed(_)), "{rerun:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the fine record and the released one"
    );
    let entry = &trail(&*store, &charged).await[0];
    assert!(entry.by.starts_with("reconciler "), "{entry:?}");
    assert_eq!(entry.asked, charged.id().downstream_key());
}

/// C10: a record in doubt whose retention passed behaves as absent: it leaves the listing, a
/// decision about it is contested, and the retry that starts the key over executes, with no
/// mark of the old doubt.
pub async fn c10_doubt_past_its_retention_the_key_is_new_and_not_in_doubt<H: OperatorHarness>(
    harness: &H,
) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy().retention(SHORT_RETENTION));
    let consumer = unique_consumer("c10d");
    let charge = request(&consumer, "expire", b"{}");
    in_doubt(&idem, &charge, "old").await;
    let old = case(&idem, &charge).await;
    tokio::time::sleep(SHORT_RETENTION + Duration::from_millis(150)).await;
    assert!(every_page(&*store, ListQuery::in_doubt(), 10)
        .await
        .is_empty());
    assert_eq!(
        store
            .stats(Deadline::default())
            .await
            .expect("stats")
            .in_doubt,
        0
    );
    assert_eq!(
        reconcile::resolve(
            &idem,
            &old,
            Finding::settled(StoredResponse::new(201, "late")),
            "late"
        )
        .await
        .expect("resolve"),
        None
    );
    let runs = Arc::new(AtomicUsize::new(0));
    let rerun = run_counted(&idem, &charge, &runs, 201).await;
    assert!(matches!(rerun, Outcome::Executed(_)), "{rerun:?}");
    assert!(reconcile::in_doubt(&idem, charge.id())
        .await
        .expect("read")
        .is_none());
    let inspected = store
        .inspect(charge.id(), Deadline::default())
        .await
        .expect("inspect")
        .expect("record");
    assert_eq!((inspected.doubt, inspected.check_at), (None, None));
    assert!(trail(&*store, &charge).await.is_empty());
}

/// C8, C10: a settlement never shortens what the record had left of its retention (an operator
/// settling with `--retention 1ms`): the key never turns new before it would have, so the
/// effect the settlement confirmed never runs again sooner.
pub async fn c10_doubt_settling_never_shortens_the_retention<H: OperatorHarness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c10n");
    let charge = request(&consumer, "hasty", b"{}");
    in_doubt(&idem, &charge, "auth-2").await;
    let hasty = engine(&store, policy().retention(Duration::from_millis(1)));
    let real = StoredResponse::new(201, "captured");
    let settled = reconcile::resolve(
        &hasty,
        &case(&hasty, &charge).await,
        Finding::settled(real.clone()),
        "hasty operator",
    )
    .await
    .expect("resolve");
    assert!(
        settled == Some(Decided::Settled { status: 201 }),
        "{settled:?}"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    match run_counted(&idem, &charge, &runs, 201).await {
        Outcome::Answered(Answer::Replay(replayed)) => assert_eq!(replayed, real),
        other => panic!("expected the settled answer replayed, got {other:?}"),
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the confirmed effect ran again"
    );
}
