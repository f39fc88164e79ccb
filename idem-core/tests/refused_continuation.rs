//! The continuation of a completion refused for good, its 500 refused too (C8, C9): it holds
//! the key while the record is its own, whichever step met the refusal, lands the 500 once the
//! store takes it, and ends once another holder took the lease, even when the store refuses
//! the write before it looks at the token, or the record cannot be read and only the
//! heartbeat knows.

mod support;

use idem_core::{
    Answer, Begin, Event, EventKind, Failure, Idempotency, Observer, Outcome, Policy, RunError,
    StoredResponse,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::{request, slow_large_writes, Faulty};

/// Counts the `CompletionRefused` events.
#[derive(Default)]
struct Refusals(AtomicUsize);

impl Observer for Refusals {
    fn observe(&self, event: &Event<'_>) {
        if event.kind() == EventKind::CompletionRefused {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// C8: past the lease, a completion that timed out three times, then (after the probe read)
/// is refused for good, its 500 refused too, keeps the key like a completion refused at once:
/// another process finds it in flight, never free to run the effect again.
#[tokio::test]
async fn c08_a_refusal_met_after_the_timeouts_past_the_lease_keeps_the_key() {
    let (store, idem, other) = slow_large_writes();
    let req = request(&idem, "timed-out-then-refused");
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
    // The continuation's probe read (after three timeouts) meets a store that now refuses
    // every write: the completion and its 500 alike.
    store.refuse_from_next_lookup.store(true, Ordering::SeqCst);

    // Several leases later, from another process.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    eprintln!("refusing = {}", store.refusing.load(Ordering::SeqCst));
    let e = Arc::clone(&effects);
    let during = other
        .run(&req, move |_| async move {
            e.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failure<&'static str>>(StoredResponse::new(200, "again"))
        })
        .await;
    eprintln!("later, from another process = {during:?}");
    store.refusing.store(false, Ordering::SeqCst);
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "a refusal met by the completion written again after the probe read ended the \
         continuation: its heartbeat stopped and another process ran the effect again"
    );
    assert!(
        matches!(during, Ok(Outcome::Answered(Answer::InFlight { .. }))),
        "{during:?}"
    );
    let _ = tokio::time::timeout(Duration::from_secs(3), idem.drain()).await;
}

/// C8, C9: a continuation writing a refused 500 ends once another holder took the lease (its
/// heartbeat was told `LeaseLost`), even when the store refuses every write before it reads
/// the token: it does not write for ever, nor keep `drain` waiting, nor emit without end.
#[tokio::test]
async fn c09_a_refused_continuation_ends_once_another_holder_took_the_lease() {
    let store = Arc::new(Faulty::default());
    let refusals = Arc::new(Refusals::default());
    let policy = Policy::default().lease(Duration::from_millis(200));
    let idem = Idempotency::builder(Arc::clone(&store))
        .policy(policy.clone())
        .observer(Arc::clone(&refusals))
        .build()
        .expect("policy");
    let other = Idempotency::with_policy(Arc::clone(&store), policy).expect("policy");
    let req = request(&idem, "refused-then-taken");
    let s = Arc::clone(&store);
    let first = idem
        .run(&req, move |_| async move {
            s.refusing.store(true, Ordering::SeqCst);
            Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged"))
        })
        .await;
    eprintln!("first = {first:?}");
    assert!(matches!(first, Err(RunError::Incomplete(_))), "{first:?}");

    // The heartbeat cannot renew for a while; the lease passes and another process takes the
    // key over. Then the heartbeat's next renewal is told the lease is lost.
    store.failing_renews.store(usize::MAX / 2, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let taken = other.begin(&req).await.expect("begin");
    eprintln!("another process = {taken:?}");
    assert!(matches!(taken, Begin::Acquired(_)), "{taken:?}");
    store.failing_renews.store(0, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let before = refusals.0.load(Ordering::SeqCst);
    let drained = tokio::time::timeout(Duration::from_secs(4), idem.drain()).await;
    let during = refusals.0.load(Ordering::SeqCst) - before;
    eprintln!(
        "drained within 4 s: {}; refusals meanwhile: {during}",
        drained.is_ok()
    );
    assert!(
        drained.is_ok(),
        "the continuation of a refused 500 never ends once another holder took the lease \
         (the store refuses before it reads the token, so it is never told LeaseLost): it \
         writes every second for ever, {during} refusals in 4 s, and drain never returns"
    );
}

/// C8: a completion refused for good whose stored 500 is refused too (a store that refuses
/// that write and still renews the lease) keeps trying on its own task while it holds the key:
/// another process finds the key in flight, never free to run the effect again; once the store
/// takes writes again, the 500 lands and is replayed.
#[tokio::test]
async fn c08_a_completion_and_its_500_both_refused_keep_the_key_until_one_lands() {
    let store = Arc::new(Faulty::default());
    let policy = Policy::default().lease(Duration::from_millis(200));
    let idem = Idempotency::with_policy(Arc::clone(&store), policy.clone()).expect("policy");
    let other = Idempotency::with_policy(Arc::clone(&store), policy).expect("policy");
    let req = request(&idem, "refused-twice");
    let effects = Arc::new(AtomicUsize::new(0));
    let (e, s) = (Arc::clone(&effects), Arc::clone(&store));
    let first = idem
        .run(&req, move |_| async move {
            e.fetch_add(1, Ordering::SeqCst);
            s.refusing.store(true, Ordering::SeqCst);
            Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged"))
        })
        .await;
    eprintln!("first = {first:?}");
    assert!(matches!(first, Err(RunError::Incomplete(_))), "{first:?}");

    // Five leases later, from another process: in flight, never a second execution.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let effect = |effects: Arc<AtomicUsize>| {
        move |_| async move {
            effects.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged again"))
        }
    };
    let during = other.run(&req, effect(Arc::clone(&effects))).await;
    eprintln!("five leases later = {during:?}");
    assert!(
        matches!(during, Ok(Outcome::Answered(Answer::InFlight { .. }))),
        "a completion and its 500 both refused gave the key up to a takeover: {during:?}"
    );

    // The store takes writes again: the 500 lands (the backoff is at most a second).
    store.refusing.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = other.run(&req, effect(Arc::clone(&effects))).await;
    eprintln!("after = {after:?}");
    assert!(
        matches!(&after, Ok(Outcome::Answered(Answer::Replay(r))) if r.status == 500),
        "the stored 500 is replayed: {after:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    let drained = tokio::time::timeout(Duration::from_secs(2), idem.drain()).await;
    assert!(
        drained.is_ok(),
        "the continuation ended once the 500 landed"
    );
}

/// C8, C9: the store refuses every write before it reads the token, and the record another
/// holder took cannot be decoded by this process (another version's record). The heartbeat is
/// told `LeaseLost` by its renewal; the continuation must end then, not write its 500 once a
/// second for ever with `drain` never returning.
#[tokio::test]
async fn c09_a_refused_continuation_ends_when_the_heartbeat_lost_the_lease_unread() {
    let store = Arc::new(Faulty::default());
    let refusals = Arc::new(Refusals::default());
    let policy = Policy::default().lease(Duration::from_millis(200));
    let idem = Idempotency::builder(Arc::clone(&store))
        .policy(policy.clone())
        .observer(Arc::clone(&refusals))
        .build()
        .expect("policy");
    let other = Idempotency::with_policy(Arc::clone(&store), policy).expect("policy");
    let req = request(&idem, "refused-taken-unreadable");
    let s = Arc::clone(&store);
    let first = idem
        .run(&req, move |_| async move {
            s.refusing.store(true, Ordering::SeqCst);
            Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged"))
        })
        .await;
    assert!(matches!(first, Err(RunError::Incomplete(_))), "{first:?}");

    store.failing_renews.store(usize::MAX / 2, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let taken = other.begin(&req).await.expect("begin");
    assert!(matches!(taken, Begin::Acquired(_)), "{taken:?}");
    // The new holder's record is one this process cannot decode.
    store.unreadable.store(true, Ordering::SeqCst);
    // The heartbeat's next renewal is told the lease is lost.
    store.failing_renews.store(0, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let before = refusals.0.load(Ordering::SeqCst);
    let drained = tokio::time::timeout(Duration::from_secs(4), idem.drain()).await;
    let during = refusals.0.load(Ordering::SeqCst) - before;
    assert!(
        drained.is_ok(),
        "the heartbeat was told LeaseLost, but the continuation only ends on a lookup it \
         cannot make: {during} refusals in 4 s, and drain never returns"
    );
}

/// C8, C16: in guard style too, a completion refused for good whose 500 is refused too keeps
/// the key: `complete` answers the error while a task of its own keeps the lease alive and
/// writes the 500 once the store takes it; another process finds the key in flight meanwhile,
/// then the 500, never free to run the effect again.
#[tokio::test]
async fn c08_a_guard_completion_refused_with_its_500_keeps_the_key() {
    let store = Arc::new(Faulty::default());
    let policy = Policy::default().lease(Duration::from_millis(200));
    let idem = Idempotency::with_policy(Arc::clone(&store), policy.clone()).expect("policy");
    let other = Idempotency::with_policy(Arc::clone(&store), policy).expect("policy");
    let req = request(&idem, "guard-refused");
    let Begin::Acquired(lease) = idem.begin(&req).await.expect("begin") else {
        panic!("a fresh key is acquired");
    };
    store.refusing.store(true, Ordering::SeqCst);
    let completed = idem
        .complete(lease, StoredResponse::new(201, "charged"))
        .await;
    assert!(completed.is_err(), "{completed:?}");

    // Several leases later, from another process.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let during = other.begin(&req).await.expect("begin");
    assert!(
        matches!(during, Begin::Answered(Answer::InFlight { .. })),
        "the key was free to run again: {during:?}"
    );
    store.refusing.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = other.begin(&req).await.expect("begin");
    assert!(
        matches!(&after, Begin::Answered(Answer::Replay(stored)) if stored.status == 500),
        "{after:?}"
    );
    let _ = tokio::time::timeout(Duration::from_secs(3), idem.drain()).await;
}
