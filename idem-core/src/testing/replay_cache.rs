//! The replay cache in front of a store ([`ReplayCache`]): what the store reports of a record in
//! doubt, and what the engine answers from memory.

use super::{policy, request, unique_consumer, Harness, LEASE};
use crate::doubt::{Doubt, DoubtCause};
use crate::store::{Deadline, Reservation, Reserved};
use crate::{
    Answer, Begin, Event, EventKind, Idempotency, Observer, Operation, ReplayCache, Request, Store,
    StoredResponse,
};
use std::sync::{Arc, Mutex, PoisonError};

/// The answers an engine reported, and where they came from.
#[derive(Default)]
pub(super) struct Answers(Mutex<Vec<(EventKind, Option<Operation>)>>);

impl Observer for Answers {
    fn observe(&self, event: &Event<'_>) {
        if event.kind().is_answer() {
            let mut seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            seen.push((event.kind(), event.operation()));
        }
    }
}

impl Answers {
    pub(super) fn last(&self) -> Option<(EventKind, Option<Operation>)> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last()
            .copied()
    }
}

/// An engine over `store` with a replay cache, and what it answers.
fn cached<S: Store>(store: S) -> (Idempotency<S>, Arc<Answers>) {
    cached_with(store, policy())
}

/// [`cached`] with `policy`.
pub(super) fn cached_with<S: Store>(
    store: S,
    policy: crate::Policy,
) -> (Idempotency<S>, Arc<Answers>) {
    let answers = Arc::new(Answers::default());
    let idem = Idempotency::builder(store)
        .policy(policy)
        .replay_cache(ReplayCache::new(1_000, 1 << 20))
        .observer(Arc::clone(&answers))
        .build()
        .expect("a valid policy");
    (idem, answers)
}

/// Completes `req` through `idem`: in doubt (a 500 whose effect is unknown) or not.
async fn completed<S: Store + 'static>(idem: &Idempotency<S>, req: &Request, in_doubt: bool) {
    let Begin::Acquired(lease) = idem.begin(req).await.expect("begin") else {
        panic!("a fresh key is acquired")
    };
    if in_doubt {
        let doubt = Doubt::new(DoubtCause::Failure, "the gateway timed out");
        let completion = idem.doubtful_completion(&lease, None, doubt);
        let stored = idem.store().complete(&completion, Deadline::default());
        stored.await.expect("complete in doubt");
    } else {
        let response = StoredResponse::new(201, "charged");
        idem.complete(lease, response).await.expect("complete");
    }
}

/// Begins `req` up to three times (a store's first connections move its generation) until the
/// answer comes from memory; returns the answer and whether it did.
async fn from_memory<S: Store>(
    idem: &Idempotency<S>,
    answers: &Answers,
    req: &Request,
) -> (Answer, bool) {
    let mut answered = None;
    for _ in 0..3 {
        let Begin::Answered(answer) = idem.begin(req).await.expect("begin") else {
            panic!("a completed key is answered")
        };
        let cached = answers
            .last()
            .is_some_and(|(_, op)| op == Some(Operation::Cache));
        answered = Some((answer, cached));
        if cached {
            break;
        }
    }
    answered.expect("answered")
}

/// Store rule 6: a record in doubt is reported in doubt by `reserve` and `read`, a settled one
/// not, whichever body asks (the replay cache keeps another body's mismatch too), so that the
/// engine never keeps an answer that may still change.
pub async fn c08_a_record_in_doubt_is_reported_in_doubt<H: Harness>(harness: &H) {
    let store = harness.store().await;
    let idem = Idempotency::with_policy(store, policy()).expect("a valid policy");
    let consumer = unique_consumer("c08d");
    for (key, in_doubt) in [("doubt", true), ("settled", false)] {
        let own = request(&consumer, key, b"{}");
        completed(&idem, &own, in_doubt).await;
        for req in [own, request(&consumer, key, b"{\"other\":1}")] {
            let reservation = Reservation::new(&req, LEASE);
            let reserved = idem
                .store()
                .reserve(reservation.claim(), Deadline::default());
            match reserved.await.expect("reserve") {
                Reserved::Found {
                    in_doubt: found, ..
                } => assert_eq!(found, in_doubt, "{key}"),
                other => panic!("the completed record: {other:?}"),
            }
            match idem
                .store()
                .read(&req, Deadline::default())
                .await
                .expect("read")
            {
                Reserved::Found {
                    in_doubt: found, ..
                } => assert_eq!(found, in_doubt, "{key}"),
                Reserved::Lost => {}
                other => panic!("the completed record: {other:?}"),
            }
        }
    }
}

/// C3, C7, C16 with a [`ReplayCache`]: a completed request is replayed from memory (a
/// `replayed` event of [`Operation::Cache`]), another body under its key is a mismatch, a
/// record another engine completed is kept once read (for another body: its mismatch only),
/// and a record in doubt never is. A store
/// without a [`generation`](Store::generation) answers every request itself.
pub async fn c07_the_replay_cache_answers_from_memory_never_a_record_in_doubt<H: Harness>(
    harness: &H,
) {
    let store = Arc::new(harness.store().await);
    let (idem, answers) = cached(Arc::clone(&store));
    let consumer = unique_consumer("c07c");
    let req = request(&consumer, "k", b"{}");
    completed(&idem, &req, false).await;
    let (answer, cached_here) = from_memory(&idem, &answers, &req).await;
    assert!(
        matches!(answer, Answer::Replay(ref r) if r.body == b"charged"),
        "{answer:?}"
    );
    assert_eq!(cached_here, store.generation().is_some(), "from memory");
    if store.generation().is_none() {
        return;
    }
    let other_body = request(&consumer, "k", b"{\"other\":1}");
    let Begin::Answered(answer) = idem.begin(&other_body).await.expect("begin") else {
        panic!("answered")
    };
    assert_eq!(answer, Answer::Mismatch, "C3, from memory too");
    assert_eq!(
        answers.last(),
        Some((EventKind::Mismatch, Some(Operation::Cache)))
    );

    // Another process's engine: the replay it reads is kept.
    let (elsewhere, seen_elsewhere) = cached(Arc::clone(&store));
    let (answer, cached_elsewhere) = from_memory(&elsewhere, &seen_elsewhere, &req).await;
    assert!(
        matches!(answer, Answer::Replay(_)) && cached_elsewhere,
        "kept once read"
    );

    // A third reads the record for another body first: the mismatch is kept, without the
    // response the store does not send for it; the request's own body is read once.
    let (third, seen_third) = cached(Arc::clone(&store));
    let (answer, mismatch_kept) = from_memory(&third, &seen_third, &other_body).await;
    assert!(answer == Answer::Mismatch && mismatch_kept, "{answer:?}");
    let Begin::Answered(Answer::Replay(_)) = third.begin(&req).await.expect("begin") else {
        panic!("the stored answer is replayed")
    };
    assert_eq!(
        seen_third.last(),
        Some((EventKind::Replayed, None)),
        "its own body: the store's"
    );
    let (answer, replay_kept) = from_memory(&third, &seen_third, &req).await;
    assert!(
        matches!(answer, Answer::Replay(_)) && replay_kept,
        "then kept"
    );

    // In flight: another body's mismatch is the store's every time (the record may still be
    // taken over).
    let running = request(&consumer, "running", b"{}");
    // A lease longer than the cache's skew, reserved by the store alone: no claim of this
    // process answers before it.
    let reservation = Reservation::new(&running, std::time::Duration::from_secs(60));
    let reserved = store.reserve(reservation.claim(), Deadline::default());
    let Reserved::Written { .. } = reserved.await.expect("reserve") else {
        panic!("a fresh key is acquired")
    };
    let running_other = request(&consumer, "running", b"{\"other\":1}");
    for _ in 0..3 {
        let answer = idem.begin(&running_other).await.expect("begin");
        assert!(
            matches!(answer, Begin::Answered(Answer::Mismatch)),
            "{answer:?}"
        );
        assert_eq!(
            answers.last(),
            Some((EventKind::Mismatch, None)),
            "never from memory"
        );
    }

    // In doubt: every answer is the store's, here and elsewhere.
    let doubtful = request(&consumer, "doubt", b"{}");
    completed(&idem, &doubtful, true).await;
    for engine in [(&idem, &answers), (&elsewhere, &seen_elsewhere)] {
        for _ in 0..3 {
            let Begin::Answered(Answer::Replay(_)) =
                engine.0.begin(&doubtful).await.expect("begin")
            else {
                panic!("the stored answer is replayed")
            };
            assert_eq!(
                engine.1.last(),
                Some((EventKind::Replayed, None)),
                "never from memory"
            );
        }
    }
}
