//! The scenarios of the transactional closure ([`Idempotency::transact`], a SQL store's
//! `run_in_transaction`), run in both modes: two commits (the reservation on its own, then the
//! effect with its completion) and one commit (C15: reservation, effect and completion in one
//! transaction). Run through [`TransactHarness`] by every SQL store, once per mode
//! ([`transact_tests!`](crate::transact_tests)).

use super::{policy, request, unique_consumer, TransactionalHarness};
use crate::store::{Store, Transactional};
use crate::{Answer, Begin, Idempotency, Outcome, Request, RunError, StoredResponse};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a scenario waits for an effect to start, or for a duplicate's answer, before it
/// fails: a duplicate answered "at once" answers well within it, one that waits for the
/// effect's transaction never does (the effect is held until the duplicates answered).
pub const AT_ONCE: Duration = Duration::from_secs(3);

/// What the scenarios need from a SQL store's transactional closure.
#[crate::store::async_trait]
pub trait TransactHarness: TransactionalHarness
where
    Self::Store: Transactional,
{
    /// A store for one commit or two (a store may have to be opened for one commit), on a
    /// namespace of its own as [`Harness::store`](super::Harness::store).
    async fn store_for(&self, one_commit: bool) -> Self::Store;

    /// The effect the scenarios run: in the store's transaction, insert one business row for
    /// `intent` (as [`TransactionalHarness::effect_then_complete`] does), then call
    /// [`Script::started`], then wait while the script is [held](Script::held) (blocking or
    /// not, as the store runs its effects), then return [`Script::end`].
    fn effect(
        &self,
        intent: &str,
        script: Script,
    ) -> <Self::Store as Transactional>::Effect<String>;

    /// Whether an engine of another process may share the store as [`store_for`](
    /// Self::store_for) opened it for `one_commit` (a store opened for one commit by a process
    /// that alone may write its file says no): then the scenarios also send duplicates through
    /// an [`Elsewhere`](super::Elsewhere) view of it.
    fn shared_by_processes(&self, one_commit: bool) -> bool;
}

/// How the scenarios' effect ends, and whether it waits first.
#[derive(Debug, Clone)]
pub struct Script(Arc<Plan>);

#[derive(Debug)]
struct Plan {
    ending: Ending,
    held: AtomicBool,
    started: AtomicBool,
}

#[derive(Debug, Clone)]
enum Ending {
    Respond(StoredResponse),
    Fail,
    Panic,
}

impl Script {
    /// An effect that answers `response`.
    pub fn respond(response: StoredResponse) -> Self {
        Self::ending(Ending::Respond(response))
    }

    /// An effect that fails (its error: nothing happened).
    pub fn fail() -> Self {
        Self::ending(Ending::Fail)
    }

    /// An effect that panics.
    pub fn panic() -> Self {
        Self::ending(Ending::Panic)
    }

    fn ending(ending: Ending) -> Self {
        Self(Arc::new(Plan {
            ending,
            held: AtomicBool::new(false),
            started: AtomicBool::new(false),
        }))
    }

    /// The same effect, held after its business row until [`release`](Self::release).
    pub fn held(self) -> Self {
        self.0.held.store(true, Ordering::SeqCst);
        self
    }

    /// Effect side: the business row is written (uncommitted).
    pub fn started(&self) {
        self.0.started.store(true, Ordering::SeqCst);
    }

    /// Effect side, for an effect that runs on a thread of its own: waits while held.
    pub fn wait_blocking(&self) {
        let until = Instant::now() + Duration::from_secs(30);
        while self.0.held.load(Ordering::SeqCst) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Effect side, for an async effect: waits while held.
    pub async fn wait(&self) {
        let until = Instant::now() + Duration::from_secs(30);
        while self.0.held.load(Ordering::SeqCst) && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Effect side: the effect's result (panics for a panicking script).
    pub fn end(&self) -> Result<StoredResponse, String> {
        match &self.0.ending {
            Ending::Respond(response) => Ok(response.clone()),
            Ending::Fail => Err("declined: nothing happened".into()),
            Ending::Panic => panic!("the scenario's effect panics"),
        }
    }

    /// Scenario side: lets a held effect go on.
    pub fn release(&self) {
        self.0.held.store(false, Ordering::SeqCst);
    }

    /// Scenario side: waits until the effect wrote its business row (at most 20 s: the
    /// store's writer may be busy with another process's work first).
    pub async fn until_started(&self) {
        let until = Instant::now() + Duration::from_secs(20);
        while !self.0.started.load(Ordering::SeqCst) {
            assert!(Instant::now() < until, "the effect did not start");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// Releases a held script when dropped.
struct ReleaseOnDrop(Script);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        self.0.release();
    }
}

type Engine<H> = Idempotency<Arc<<H as super::Harness>::Store>>;

async fn setup<H: TransactHarness>(harness: &H, one_commit: bool) -> (Arc<H::Store>, Engine<H>)
where
    H::Store: Transactional,
{
    let store = Arc::new(harness.store_for(one_commit).await);
    let idem = Idempotency::with_policy(Arc::clone(&store), policy().one_commit(one_commit))
        .expect("policy");
    (store, idem)
}

fn charged(n: &str) -> StoredResponse {
    StoredResponse::new(201, format!("{{\"charge\":\"{n}\"}}"))
        .with_header("content-type", "application/json")
}

async fn transact<H: TransactHarness>(
    harness: &H,
    idem: &Engine<H>,
    intent: &str,
    req: &Request,
    script: Script,
) -> Result<Outcome, RunError<String>>
where
    H::Store: Transactional,
{
    idem.transact(req, harness.effect(intent, script)).await
}

/// C6, C15: the effect and its completion commit together; the retry replays byte for byte
/// and writes no second business row.
pub async fn txc_c06_executed_then_replayed<H: TransactHarness>(harness: &H, one_commit: bool)
where
    H::Store: Transactional,
{
    let (store, idem) = setup(harness, one_commit).await;
    let intent = unique_consumer("txc-replay");
    let req = request(&intent, "k", b"{\"cents\":500}");
    let first = transact(harness, &idem, &intent, &req, Script::respond(charged("a"))).await;
    assert!(
        matches!(&first, Ok(Outcome::Executed(r)) if *r == charged("a")),
        "{first:?}"
    );
    let retry = transact(harness, &idem, &intent, &req, Script::respond(charged("b"))).await;
    assert!(
        matches!(&retry, Ok(Outcome::Answered(Answer::Replay(r))) if *r == charged("a")),
        "{retry:?}"
    );
    assert_eq!(harness.business_rows(&store, &intent).await, 1);
}

/// C7, C16 with a [`ReplayCache`](crate::ReplayCache): the answer a transactional execution
/// committed is replayed from memory, and so is one another engine committed once its
/// reservation read it; the effect runs once.
pub async fn txc_c07_committed_answers_are_replayed_from_memory<H: TransactHarness>(
    harness: &H,
    one_commit: bool,
) where
    H::Store: Transactional,
{
    use super::replay_cache::cached_with;
    use crate::{EventKind, Operation};
    let store = Arc::new(harness.store_for(one_commit).await);
    let engine = || cached_with(Arc::clone(&store), policy().one_commit(one_commit));
    let ((idem, answers), (elsewhere, seen_elsewhere)) = (engine(), engine());
    let intent = unique_consumer("txc-cache");
    let req = request(&intent, "k", b"{\"cents\":500}");
    let first = transact(harness, &idem, &intent, &req, Script::respond(charged("a"))).await;
    assert!(matches!(first, Ok(Outcome::Executed(_))), "{first:?}");
    let cached = store.generation().is_some();
    for (engine, seen) in [(&idem, &answers), (&elsewhere, &seen_elsewhere)] {
        let mut from_memory = false;
        for _ in 0..3 {
            let retry = transact(
                harness,
                engine,
                &intent,
                &req,
                Script::respond(charged("b")),
            );
            let retry = retry.await;
            assert!(
                matches!(&retry, Ok(Outcome::Answered(Answer::Replay(r))) if *r == charged("a")),
                "{retry:?}"
            );
            from_memory = seen.last() == Some((EventKind::Replayed, Some(Operation::Cache)));
            if from_memory {
                break;
            }
        }
        assert_eq!(from_memory, cached, "answered from memory");
    }
    assert_eq!(harness.business_rows(&store, &intent).await, 1);
}

/// C6, C8: for a lease the caller holds (the guard style; a handler under the HTTP layer), the
/// effect and its completion commit together ([`Idempotency::complete_transaction`]). The
/// effect's error rolls its transaction back and gives the key back, so the next `begin`
/// acquires; the committed one is replayed; one business row.
pub async fn txc_c06_a_held_lease_completes_in_one_transaction<H: TransactHarness>(
    harness: &H,
    one_commit: bool,
) where
    H::Store: Transactional,
{
    let (store, idem) = setup(harness, one_commit).await;
    let intent = unique_consumer("txc-held");
    let req = request(&intent, "k", b"{\"cents\":700}");
    let acquire = |begun: Result<Begin, crate::Error>| match begun {
        Ok(Begin::Acquired(lease)) => lease,
        other => panic!("expected to acquire: {other:?}"),
    };
    let lease = acquire(idem.begin(&req).await);
    let failed = idem
        .complete_transaction(&lease, harness.effect(&intent, Script::fail()))
        .await;
    assert!(matches!(failed, Err(RunError::Released(_))), "{failed:?}");
    assert_eq!(harness.business_rows(&store, &intent).await, 0);
    let lease = acquire(idem.begin(&req).await);
    let effect = harness.effect(&intent, Script::respond(charged("a")));
    let completion = match idem.complete_transaction(&lease, effect).await {
        Ok(completion) => completion,
        Err(error) => panic!("expected the commit: {error:?}"),
    };
    idem.committed(&completion);
    assert_eq!(*completion.response(), charged("a"));
    match idem.begin(&req).await {
        Ok(Begin::Answered(Answer::Replay(replayed))) => assert_eq!(replayed, charged("a")),
        other => panic!("expected the replay: {other:?}"),
    }
    assert_eq!(harness.business_rows(&store, &intent).await, 1);
}

/// C8, C15: the effect's error rolls its transaction back: no business row, the key free at
/// once, and the retry executes once.
pub async fn txc_c08_an_effect_error_rolls_back_and_the_retry_runs<H: TransactHarness>(
    harness: &H,
    one_commit: bool,
) where
    H::Store: Transactional,
{
    let (store, idem) = setup(harness, one_commit).await;
    let intent = unique_consumer("txc-fail");
    let req = request(&intent, "k", b"{\"cents\":600}");
    let failed = transact(harness, &idem, &intent, &req, Script::fail()).await;
    assert!(matches!(failed, Err(RunError::Released(_))), "{failed:?}");
    assert_eq!(harness.business_rows(&store, &intent).await, 0);
    let retry = transact(
        harness,
        &idem,
        &intent,
        &req,
        Script::respond(charged("ok")),
    )
    .await;
    assert!(matches!(retry, Ok(Outcome::Executed(_))), "{retry:?}");
    assert_eq!(harness.business_rows(&store, &intent).await, 1);
}

/// C8, C15: a panic in the effect rolls its transaction back and resumes in the caller; the
/// retry executes once.
pub async fn txc_c08_a_panicking_effect_rolls_back_and_the_retry_runs<H: TransactHarness>(
    harness: &H,
    one_commit: bool,
) where
    H::Store: Transactional,
{
    let (store, idem) = setup(harness, one_commit).await;
    let intent = unique_consumer("txc-panic");
    let req = request(&intent, "k", b"{\"cents\":650}");
    let effect = harness.effect(&intent, Script::panic());
    let (engine, owned) = (idem.clone(), req.clone());
    let panicked = tokio::spawn(async move { engine.transact(&owned, effect).await }).await;
    assert!(
        panicked.as_ref().is_err_and(|e| e.is_panic()),
        "the panic did not resume"
    );
    assert_eq!(harness.business_rows(&store, &intent).await, 0);
    let retry = transact(
        harness,
        &idem,
        &intent,
        &req,
        Script::respond(charged("ok")),
    )
    .await;
    assert!(matches!(retry, Ok(Outcome::Executed(_))), "{retry:?}");
    assert_eq!(harness.business_rows(&store, &intent).await, 1);
}

/// C5, C3, C15: while the effect's transaction is open (in one-commit mode its reservation is
/// not committed yet), a duplicate is answered in flight at once, and one with another body
/// mismatch, through the closure, the guard and a second engine, and through another process
/// where the store may be shared; none of them waits for the transaction. Then the execution
/// commits, and every duplicate replays: one business row.
pub async fn txc_c05_a_duplicate_is_answered_at_once_while_the_effect_runs<H: TransactHarness>(
    harness: &H,
    one_commit: bool,
) where
    H::Store: Transactional,
{
    let (store, idem) = setup(harness, one_commit).await;
    let intent = unique_consumer("txc-inflight");
    let req = request(&intent, "k", b"{\"cents\":700}");
    let other_body = request(&intent, "k", b"{\"cents\":701}");
    let script = Script::respond(charged("held")).held();
    let effect = harness.effect(&intent, script.clone());
    let (engine, owned) = (idem.clone(), req.clone());
    let first = tokio::spawn(async move { engine.transact(&owned, effect).await });
    // A failing assertion below lets the effect go at once, not after its 30 s: its
    // transaction holds the store's writer meanwhile.
    let _release = ReleaseOnDrop(script.clone());
    script.until_started().await;

    let engines = vec![
        ("this engine", idem.clone()),
        (
            "a second engine",
            Idempotency::with_policy(Arc::clone(&store), policy().one_commit(one_commit))
                .expect("policy"),
        ),
    ];
    let elsewhere = harness.shared_by_processes(one_commit).then(|| {
        Idempotency::with_policy(
            Arc::new(super::Elsewhere::new(Arc::clone(&store))),
            policy().one_commit(one_commit),
        )
        .expect("policy")
    });
    for (name, engine) in &engines {
        let duplicate = harness.effect(&intent, Script::respond(charged("dup")));
        let answer = tokio::time::timeout(AT_ONCE, engine.transact(&req, duplicate)).await;
        assert!(
            matches!(answer, Ok(Ok(Outcome::Answered(Answer::InFlight { .. })))),
            "a duplicate through {name} was not in flight at once: {answer:?}"
        );
        let mismatch = harness.effect(&intent, Script::respond(charged("other")));
        let answer = tokio::time::timeout(AT_ONCE, engine.transact(&other_body, mismatch)).await;
        assert!(
            matches!(answer, Ok(Ok(Outcome::Answered(Answer::Mismatch)))),
            "another body through {name} was not a mismatch at once: {answer:?}"
        );
        let begun = tokio::time::timeout(AT_ONCE, engine.begin(&req)).await;
        assert!(
            matches!(begun, Ok(Ok(Begin::Answered(Answer::InFlight { .. })))),
            "a guard-style duplicate through {name} was not in flight at once: {begun:?}"
        );
    }
    if let Some(elsewhere) = &elsewhere {
        let begun = tokio::time::timeout(AT_ONCE, elsewhere.begin(&req)).await;
        assert!(
            matches!(begun, Ok(Ok(Begin::Answered(Answer::InFlight { .. })))),
            "a duplicate from another process was not in flight at once: {begun:?}"
        );
        let begun = tokio::time::timeout(AT_ONCE, elsewhere.begin(&other_body)).await;
        assert!(
            matches!(begun, Ok(Ok(Begin::Answered(Answer::Mismatch)))),
            "another body from another process was not a mismatch at once: {begun:?}"
        );
    }
    script.release();
    let first = first.await.expect("the first execution");
    assert!(
        matches!(&first, Ok(Outcome::Executed(r)) if *r == charged("held")),
        "{first:?}"
    );
    if let Some(elsewhere) = &elsewhere {
        let begun = elsewhere.begin(&req).await;
        assert!(
            matches!(&begun, Ok(Begin::Answered(Answer::Replay(r))) if *r == charged("held")),
            "a duplicate from another process after the commit did not replay: {begun:?}"
        );
    }
    for (name, engine) in &engines {
        let duplicate = harness.effect(&intent, Script::respond(charged("dup")));
        let answer = engine.transact(&req, duplicate).await;
        assert!(
            matches!(&answer, Ok(Outcome::Answered(Answer::Replay(r))) if *r == charged("held")),
            "a duplicate through {name} after the commit did not replay: {answer:?}"
        );
    }
    assert_eq!(harness.business_rows(&store, &intent).await, 1);
}

/// C4, C15: many concurrent executions of one fresh key: exactly one executes and writes its
/// business row; every other is answered (in flight or replay), none fails.
pub async fn txc_c04_concurrent_executions_of_one_key_write_one_row<H: TransactHarness>(
    harness: &H,
    one_commit: bool,
) where
    H::Store: Transactional,
{
    let (store, idem) = setup(harness, one_commit).await;
    let intent = unique_consumer("txc-storm");
    let req = request(&intent, "k", b"{\"cents\":800}");
    let tasks: Vec<_> = (0..16)
        .map(|n| {
            let (engine, owned) = (idem.clone(), req.clone());
            let effect = harness.effect(&intent, Script::respond(charged(&format!("c{n}"))));
            tokio::spawn(async move { engine.transact(&owned, effect).await })
        })
        .collect();
    let mut executed = 0;
    for task in tasks {
        match task.await.expect("task") {
            Ok(Outcome::Executed(_)) => executed += 1,
            Ok(Outcome::Answered(Answer::InFlight { .. } | Answer::Replay(_))) => {}
            other => panic!("unexpected: {other:?}"),
        }
    }
    assert_eq!(executed, 1);
    assert_eq!(harness.business_rows(&store, &intent).await, 1);
}

/// C3, C9, C10, C15: the transactional closure, for a request whose alternative
/// fingerprint holds the record: a completed one is replayed with no effect; one in flight is
/// in flight (never 422); an orphan under the alternative and a record past its retention are
/// taken over / started over under the request's own fingerprint, never the alternative.
pub async fn txc_c03_a_record_under_the_alternative_fingerprint_is_the_request_s<
    H: TransactHarness,
>(
    harness: &H,
    one_commit: bool,
) where
    H::Store: Transactional,
{
    use super::{orphan, sent_and_canonical, LEASE, SHORT_RETENTION};
    use crate::store::Deadline;
    let store = Arc::new(harness.store_for(one_commit).await);
    // Records retained for an hour, but part d's first (retained briefly): no step races a
    // record's end.
    let engine = |retention| {
        Idempotency::with_policy(
            Arc::clone(&store),
            policy().one_commit(one_commit).retention(retention),
        )
        .expect("policy")
    };
    let (idem, short) = (engine(Duration::from_secs(3600)), engine(SHORT_RETENTION));
    let fp_of = |req: &Request| {
        let store = Arc::clone(&store);
        let id = req.id().clone();
        async move {
            store
                .lookup(&id, Deadline::default())
                .await
                .expect("lookup")
                .map(|r| r.fingerprint)
        }
    };

    // a: completed under the alternative: replayed, no effect, record untouched.
    let intent = unique_consumer("txc-alt-a");
    let (raw, canonical) = sent_and_canonical(&intent, "k", 500);
    let first = transact(harness, &idem, &intent, &raw, Script::respond(charged("a"))).await;
    assert!(matches!(&first, Ok(Outcome::Executed(_))), "{first:?}");
    for _ in 0..2 {
        let again = transact(
            harness,
            &idem,
            &intent,
            &canonical,
            Script::respond(charged("b")),
        );
        let again = again.await;
        assert!(
            matches!(&again, Ok(Outcome::Answered(Answer::Replay(r))) if *r == charged("a")),
            "a: {again:?}"
        );
    }
    assert_eq!(
        harness.business_rows(&store, &intent).await,
        1,
        "a: one effect"
    );
    assert_eq!(fp_of(&raw).await, Some(*raw.fingerprint()), "a: untouched");

    // b: in flight under the alternative: in flight at once, then the replay.
    let intent = unique_consumer("txc-alt-b");
    let (raw, canonical) = sent_and_canonical(&intent, "k", 600);
    let script = Script::respond(charged("held")).held();
    let effect = harness.effect(&intent, script.clone());
    let (engine, owned) = (idem.clone(), raw.clone());
    let holder = tokio::spawn(async move { engine.transact(&owned, effect).await });
    let _release = ReleaseOnDrop(script.clone());
    script.until_started().await;
    let dup = harness.effect(&intent, Script::respond(charged("dup")));
    let answer = tokio::time::timeout(AT_ONCE, idem.transact(&canonical, dup)).await;
    assert!(
        matches!(answer, Ok(Ok(Outcome::Answered(Answer::InFlight { .. })))),
        "b: {answer:?}"
    );
    script.release();
    let held = holder.await.expect("joined");
    assert!(matches!(&held, Ok(Outcome::Executed(_))), "b: {held:?}");
    let dup = harness.effect(&intent, Script::respond(charged("dup")));
    let answer = idem.transact(&canonical, dup).await;
    assert!(
        matches!(&answer, Ok(Outcome::Answered(Answer::Replay(r))) if *r == charged("held")),
        "b: {answer:?}"
    );
    assert_eq!(
        harness.business_rows(&store, &intent).await,
        1,
        "b: one effect"
    );

    // c: an orphan under the alternative: taken over under the request's own fingerprint.
    let intent = unique_consumer("txc-alt-c");
    let (raw, canonical) = sent_and_canonical(&intent, "k", 700);
    orphan(&*store, &raw, LEASE).await;
    tokio::time::sleep(LEASE + Duration::from_millis(150)).await;
    let run = transact(
        harness,
        &idem,
        &intent,
        &canonical,
        Script::respond(charged("c")),
    )
    .await;
    assert!(matches!(&run, Ok(Outcome::Executed(_))), "c: {run:?}");
    assert_eq!(fp_of(&raw).await, Some(*canonical.fingerprint()), "c: own");
    assert_eq!(
        harness.business_rows(&store, &intent).await,
        1,
        "c: one effect"
    );

    // d: completed under the alternative, past its retention: started over under its own.
    let intent = unique_consumer("txc-alt-d");
    let (raw, canonical) = sent_and_canonical(&intent, "k", 800);
    let first = transact(
        harness,
        &short,
        &intent,
        &raw,
        Script::respond(charged("d1")),
    )
    .await;
    assert!(matches!(&first, Ok(Outcome::Executed(_))), "{first:?}");
    tokio::time::sleep(SHORT_RETENTION + Duration::from_millis(150)).await;
    let run = transact(
        harness,
        &idem,
        &intent,
        &canonical,
        Script::respond(charged("d2")),
    )
    .await;
    assert!(
        matches!(&run, Ok(Outcome::Executed(r)) if *r == charged("d2")),
        "d: {run:?}"
    );
    assert_eq!(fp_of(&raw).await, Some(*canonical.fingerprint()), "d: own");
    let again = transact(
        harness,
        &idem,
        &intent,
        &canonical,
        Script::respond(charged("d3")),
    )
    .await;
    assert!(
        matches!(&again, Ok(Outcome::Answered(Answer::Replay(r))) if *r == charged("d2")),
        "d: {again:?}"
    );
    assert_eq!(
        harness.business_rows(&store, &intent).await,
        2,
        "d: two effects"
    );
}
