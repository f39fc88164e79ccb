//! Engine behaviour that no healthy store can show: a store that is down (C13), completions
//! that fail after the effect ran (C8).

use idem_core::store::Deadline;
use idem_core::store::{async_trait, Acquire, Claim, Completion, Lease, Record, Reserved};
use idem_core::{
    Answer, Begin, Error, Event, EventKind, Failure, Idempotency, MemoryStore, Observer, Outcome,
    Policy, RecordId, Request, RunError, Store, StoreErrorKind, StoredResponse, Timestamp,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn down() -> Error {
    Error::store(
        "test",
        StoreErrorKind::Unavailable,
        std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused"),
    )
}

/// A memory store whose `complete` and `release` fail on demand.
#[derive(Default)]
struct Flaky {
    inner: MemoryStore,
    /// How many `complete` calls fail before the store answers.
    failing_completes: AtomicUsize,
    /// How many `complete` calls apply the completion and then report a lost connection.
    lost_answers: AtomicUsize,
    completes: AtomicUsize,
    /// Encoded completions larger than this are refused for good (like a blob over a limit).
    max_encoded: Option<usize>,
    release_fails: bool,
    reserve_fails: bool,
    /// How many `lookup` calls fail before the store answers.
    failing_lookups: AtomicUsize,
    /// How many `renew` calls fail before the store answers.
    failing_renews: AtomicUsize,
    /// `reserve` never answers (a frozen or blackholed server).
    reserve_hangs: bool,
    /// How many `reserve` calls answer only 300 ms after reserving (a slow network's answer).
    slow_reserves: AtomicUsize,
}

fn take(counter: &AtomicUsize) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

#[async_trait]
impl Store for Flaky {
    async fn reserve(&self, claim: &Claim<'_>, deadline: Deadline) -> Result<Reserved, Error> {
        if self.reserve_fails {
            return Err(down());
        }
        if self.reserve_hangs {
            std::future::pending::<()>().await;
        }
        let reserved = self.inner.reserve(claim, deadline).await;
        if take(&self.slow_reserves) {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        reserved
    }
    async fn replace(
        &self,
        claim: &Claim<'_>,
        acquire: Acquire,
        deadline: Deadline,
    ) -> Result<Reserved, Error> {
        self.inner.replace(claim, acquire, deadline).await
    }
    async fn complete(&self, c: &Completion, deadline: Deadline) -> Result<(), Error> {
        self.completes.fetch_add(1, Ordering::SeqCst);
        if take(&self.failing_completes) {
            return Err(down());
        }
        if self.max_encoded.is_some_and(|max| c.encoded().len() > max) {
            return Err(Error::store("test", StoreErrorKind::Other, "blob too big"));
        }
        if take(&self.lost_answers) {
            self.inner.complete(c, deadline).await?;
            return Err(down());
        }
        self.inner.complete(c, deadline).await
    }
    async fn release(&self, l: &Lease, deadline: Deadline) -> Result<(), Error> {
        if self.release_fails {
            return Err(down());
        }
        self.inner.release(l, deadline).await
    }
    async fn renew(&self, l: &Lease, d: Duration, deadline: Deadline) -> Result<Timestamp, Error> {
        if take(&self.failing_renews) {
            return Err(down());
        }
        self.inner.renew(l, d, deadline).await
    }
    async fn purge_expired(&self, n: usize, deadline: Deadline) -> Result<usize, Error> {
        self.inner.purge_expired(n, deadline).await
    }
    async fn lookup(&self, id: &RecordId, deadline: Deadline) -> Result<Option<Record>, Error> {
        if take(&self.failing_lookups) {
            return Err(down());
        }
        self.inner.lookup(id, deadline).await
    }
    async fn resolve(
        &self,
        r: &idem_core::store::Resolution,
        deadline: Deadline,
    ) -> Result<bool, Error> {
        self.inner.resolve(r, deadline).await
    }
}

fn engine(store: Flaky, lease: Duration) -> Idempotency<Flaky> {
    Idempotency::with_policy(store, Policy::default().lease(lease)).expect("policy")
}

fn charge(idem: &Idempotency<Flaky>, key: &str) -> Request {
    idem.request("acct", "POST", "/charges")
        .key(Some(key))
        .body(b"{}")
        .build()
        .expect("valid")
}

async fn run(
    idem: &Idempotency<Flaky>,
    request: &Request,
    effects: &Arc<AtomicUsize>,
) -> Result<Outcome, RunError<&'static str>> {
    let effects = Arc::clone(effects);
    idem.run(request, move |_| async move {
        effects.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged"))
    })
    .await
}

#[tokio::test]
async fn c13_store_down_is_an_error_and_the_effect_never_runs_unprotected() {
    let idem = engine(
        Flaky {
            reserve_fails: true,
            ..Flaky::default()
        },
        Duration::from_secs(60),
    );
    let effects = Arc::new(AtomicUsize::new(0));
    let result = run(&idem, &charge(&idem, "k"), &effects).await;
    let Err(RunError::Idem(err)) = result else {
        panic!("expected a store error, got {result:?}");
    };
    assert!(
        matches!(err, Error::Store(ref e) if e.kind() == StoreErrorKind::Unavailable && e.backend() == "test")
    );
    assert!(err.is_retryable());
    assert_eq!(effects.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn c08_failed_completion_is_retried_within_the_lease_and_the_effect_runs_once() {
    let idem = engine(
        Flaky {
            failing_completes: AtomicUsize::new(3),
            ..Flaky::default()
        },
        Duration::from_millis(500),
    );
    let request = charge(&idem, "k");
    let effects = Arc::new(AtomicUsize::new(0));
    let first = run(&idem, &request, &effects).await.expect("run");
    assert_eq!(
        first,
        Outcome::Executed(StoredResponse::new(201, "charged"))
    );
    assert_eq!(idem.store().completes.load(Ordering::SeqCst), 4);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let retry = run(&idem, &request, &effects).await.expect("run");
    assert_eq!(
        retry,
        Outcome::Answered(Answer::Replay(StoredResponse::new(201, "charged")))
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c08_a_completion_that_landed_with_its_answer_lost_is_not_a_lost_lease() {
    let idem = engine(
        Flaky {
            lost_answers: AtomicUsize::new(1),
            ..Flaky::default()
        },
        Duration::from_secs(5),
    );
    let request = charge(&idem, "k");
    let effects = Arc::new(AtomicUsize::new(0));
    let first = run(&idem, &request, &effects).await.expect("run");
    assert_eq!(
        first,
        Outcome::Executed(StoredResponse::new(201, "charged"))
    );
    let retry = run(&idem, &request, &effects).await.expect("run");
    assert!(matches!(retry, Outcome::Answered(Answer::Replay(_))));
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c08_store_down_for_the_whole_lease_is_a_500_and_the_key_is_not_given_back() {
    let idem = engine(
        Flaky {
            failing_completes: AtomicUsize::new(usize::MAX),
            release_fails: false,
            ..Flaky::default()
        },
        Duration::from_millis(300),
    );
    let request = charge(&idem, "k");
    let effects = Arc::new(AtomicUsize::new(0));
    let result = run(&idem, &request, &effects).await;
    let Err(RunError::Incomplete(_)) = result else {
        panic!("expected an incomplete run, got {result:?}");
    };
    assert!(idem.store().completes.load(Ordering::SeqCst) > 1, "retried");
    // Not released: within the lease a retry is in flight, never a second run.
    let record = idem
        .store()
        .lookup(request.id(), Deadline::default())
        .await
        .expect("lookup")
        .expect("still reserved");
    assert!(record.is_in_progress());
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c08_nothing_happened_with_release_failing_still_returns_the_handler_error() {
    let idem = engine(
        Flaky {
            release_fails: true,
            ..Flaky::default()
        },
        Duration::from_secs(60),
    );
    let request = charge(&idem, "k");
    let result = idem
        .run(&request, |_| async {
            Err::<StoredResponse, _>(Failure::nothing_happened("declined by bank"))
        })
        .await;
    assert!(matches!(
        result,
        Err(RunError::Released("declined by bank"))
    ));
    // The reservation stays until its lease passes: a retry now is in flight, not a second run.
    let effects = Arc::new(AtomicUsize::new(0));
    let retry = run(&idem, &request, &effects).await;
    assert!(matches!(
        retry,
        Ok(Outcome::Answered(Answer::InFlight { .. }))
    ));
    assert_eq!(effects.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn invalid_policy_is_rejected() {
    let policy = Policy::default().lease(Duration::ZERO);
    assert!(Idempotency::with_policy(MemoryStore::new(), policy).is_err());
}

#[tokio::test]
async fn c08_guard_style_invalid_response_is_stored_as_a_500_not_a_400() {
    let idem = Idempotency::new(MemoryStore::new());
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some("k"))
        .body(b"{}")
        .build()
        .expect("valid");
    let Begin::Acquired(lease) = idem.begin(&request).await.expect("begin") else {
        panic!("fresh key");
    };
    let sent = idem
        .complete(
            lease,
            StoredResponse::new(201, "").with_header("location", "/a\r\nb"),
        )
        .await
        .expect("stored");
    assert_eq!(sent.status, 500);
    assert_eq!(
        idem.begin(&request).await.expect("begin"),
        Begin::Answered(Answer::Replay(sent))
    );
}

#[tokio::test]
async fn c08_a_completion_the_store_refuses_for_good_becomes_a_stored_500() {
    let idem = engine(
        Flaky {
            max_encoded: Some(1000),
            ..Flaky::default()
        },
        Duration::from_millis(200),
    );
    let request = charge(&idem, "k");
    let effects = Arc::new(AtomicUsize::new(0));
    for attempt in 0..2 {
        let e = Arc::clone(&effects);
        let outcome = idem
            .run(&request, move |_| async move {
                e.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Failure<&'static str>>(StoredResponse::new(201, vec![b'x'; 5000]))
            })
            .await
            .expect("run");
        assert_eq!(
            outcome.response().map(|r| r.status),
            Some(500),
            "attempt {attempt}"
        );
        assert_eq!(
            matches!(outcome, Outcome::Answered(Answer::Replay(_))),
            attempt > 0
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn c08_a_completion_the_handler_did_not_write_is_not_reported_as_success() {
    let idem = engine(Flaky::default(), Duration::from_millis(200));
    let request = charge(&idem, "k");
    let effects = Arc::new(AtomicUsize::new(0));
    let e = Arc::clone(&effects);
    let first = idem
        .run(&request, move |ctx| async move {
            e.fetch_add(1, Ordering::SeqCst);
            // Its transaction rolled back, or it forgot to write it: the record is not complete.
            Ok::<_, Failure<&'static str>>(ctx.completion(StoredResponse::new(201, "charged")))
        })
        .await
        .expect("run");
    assert_eq!(first.response().map(|r| r.status), Some(500));
    tokio::time::sleep(Duration::from_millis(250)).await;
    let retry = run(&idem, &request, &effects).await.expect("run");
    assert!(matches!(retry, Outcome::Answered(Answer::Replay(ref r)) if r.status == 500));
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

/// A handler that committed its completion in its own transaction, checked by a read that fails
/// once: the check is retried within the lease, and the answer is what is stored, never a 500
/// while the 2xx is what every retry replays.
#[tokio::test]
async fn c08_a_failed_read_of_a_written_completion_is_retried_not_taken_for_a_missing_one() {
    let idem = engine(
        Flaky {
            failing_lookups: AtomicUsize::new(1),
            ..Flaky::default()
        },
        Duration::from_secs(5),
    );
    let request = charge(&idem, "k");
    let first = idem
        .run(&request, move |ctx| async move {
            let completion = ctx.completion(StoredResponse::new(201, "charged"));
            // Written as a SQL store's complete_in would, inside the effect's transaction.
            ctx.idem()
                .store()
                .inner
                .complete(&completion, Deadline::default())
                .await
                .expect("write");
            Ok::<_, Failure<&'static str>>(completion)
        })
        .await
        .expect("run");
    assert!(
        matches!(&first, Outcome::Executed(r) if r.status == 201 && r.body == b"charged"),
        "{first:?}"
    );
    retry_replays_the_201(&idem, &request).await;
}

/// The kinds of the events an engine emitted, but store calls.
#[derive(Default)]
struct Kinds(std::sync::Mutex<Vec<EventKind>>);

impl Observer for Kinds {
    fn observe(&self, event: &Event<'_>) {
        if event.kind() != EventKind::StoreCall {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(event.kind());
        }
    }
}

/// A retry of `request` replays the stored 201, and its effect does not run.
async fn retry_replays_the_201(idem: &Idempotency<Flaky>, request: &Request) {
    let effects = Arc::new(AtomicUsize::new(0));
    let retry = run(idem, request, &effects).await.expect("run");
    assert!(matches!(retry, Outcome::Answered(Answer::Replay(ref r)) if r.status == 201));
    assert_eq!(effects.load(Ordering::SeqCst), 0);
}

/// Runs `request` with a handler that commits its completion, as a SQL store's `complete_in`
/// would, then takes the lost answer to its COMMIT for a rollback: nothing happened.
async fn committed_then_nothing_happened(
    idem: &Idempotency<Flaky>,
    request: &Request,
) -> Result<Outcome, RunError<&'static str>> {
    idem.run(request, move |ctx| async move {
        let completion = ctx.completion(StoredResponse::new(201, "charged"));
        ctx.idem()
            .store()
            .inner
            .complete(&completion, Deadline::default())
            .await
            .expect("write");
        Err::<StoredResponse, _>(Failure::nothing_happened("the COMMIT's answer was lost"))
    })
    .await
}

/// A handler whose own transaction committed its completion but who took the lost answer to
/// its COMMIT for a rollback, and said nothing happened: the fenced release finds the record
/// completed under this execution, and the answer is what is stored (C6, C8), never "not
/// recorded, retry" for an effect that happened. Its events tell one end, executed (C16).
#[tokio::test]
async fn c08_nothing_happened_from_a_handler_whose_completion_committed_answers_it() {
    let kinds = Arc::new(Kinds::default());
    let idem = Idempotency::builder(Flaky::default())
        .policy(Policy::default().lease(Duration::from_secs(5)))
        .observer(Arc::clone(&kinds))
        .build()
        .expect("policy");
    let request = charge(&idem, "k");
    let first = committed_then_nothing_happened(&idem, &request).await;
    assert!(
        matches!(&first, Ok(Outcome::Executed(r)) if r.status == 201 && r.body == b"charged"),
        "{first:?}"
    );
    let seen = kinds.0.lock().map(|k| k.clone()).unwrap_or_default();
    assert_eq!(
        seen,
        [
            EventKind::Acquired,
            EventKind::CompletionLanded,
            EventKind::Executed
        ]
    );
    retry_replays_the_201(&idem, &request).await;
}

/// The same, with a record that cannot be read once the give-back is fenced out: the commit
/// may have landed, so the answer is in doubt (500, retryable), never "nothing happened"; the
/// retry replays what committed.
#[tokio::test]
async fn c08_nothing_happened_from_a_handler_then_an_unreadable_record_is_in_doubt() {
    let idem = Idempotency::with_policy(
        Flaky {
            failing_lookups: AtomicUsize::new(usize::MAX),
            ..Flaky::default()
        },
        Policy::default()
            .lease(Duration::from_secs(5))
            .store_timeout(Duration::from_millis(300)),
    )
    .expect("policy");
    let request = charge(&idem, "k");
    let first = committed_then_nothing_happened(&idem, &request).await;
    assert!(matches!(first, Err(RunError::InDoubt(_))), "{first:?}");
    retry_replays_the_201(&idem, &request).await;
}

#[tokio::test]
async fn c08_drain_waits_for_executions_whose_callers_went_away() {
    let idem = engine(Flaky::default(), Duration::from_secs(60));
    let request = charge(&idem, "k");
    let dropped = tokio::time::timeout(
        Duration::from_millis(20),
        idem.run(&request, |_| async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged"))
        }),
    )
    .await;
    assert!(dropped.is_err(), "the caller went away");
    idem.drain().await;
    let record = idem
        .store()
        .lookup(request.id(), Deadline::default())
        .await
        .expect("lookup")
        .expect("record");
    assert!(
        record.is_completed(),
        "drain returned before the execution finished"
    );
}

#[test]
fn c08_run_without_timers_refuses_before_anything_runs() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .expect("runtime without the time driver");
    let idem = engine(Flaky::default(), Duration::from_secs(60));
    let request = charge(&idem, "k");
    let effects = Arc::new(AtomicUsize::new(0));
    let result = rt.block_on(run(&idem, &request, &effects));
    assert!(
        matches!(result, Err(RunError::Idem(Error::InvalidInput { .. }))),
        "{result:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 0);
    let record = rt
        .block_on(idem.store().lookup(request.id(), Deadline::default()))
        .expect("lookup");
    assert_eq!(record, None, "nothing reserved");
}

/// Polls `idem` with `request` until it replays (or `within` passes); returns the replay.
async fn replayed(
    idem: &Idempotency<Flaky>,
    request: &Request,
    within: Duration,
) -> Option<StoredResponse> {
    let until = std::time::Instant::now() + within;
    while std::time::Instant::now() < until {
        if let Ok(Begin::Answered(Answer::Replay(stored))) = idem.begin(request).await {
            return Some(stored);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

#[tokio::test]
async fn c08_a_store_unwritable_past_the_lease_never_turns_into_a_second_execution() {
    // After the effect the store cannot be written (completions and renewals fail) for longer
    // than the lease: the caller is answered 500, the execution goes on trying, a retry in the
    // meantime is in flight (never a takeover of a live execution), and once the store is back
    // the completion lands and the retry replays: one effect.
    let idem = engine(
        Flaky {
            failing_completes: AtomicUsize::new(usize::MAX),
            failing_renews: AtomicUsize::new(usize::MAX),
            ..Flaky::default()
        },
        Duration::from_millis(200),
    );
    let request = charge(&idem, "unwritable");
    let effects = Arc::new(AtomicUsize::new(0));
    let first = run(&idem, &request, &effects).await;
    assert!(matches!(first, Err(RunError::Incomplete(_))), "{first:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let record = idem
        .store()
        .lookup(request.id(), Deadline::default())
        .await
        .expect("lookup");
    assert!(
        record.is_some_and(|r| r.is_in_progress()),
        "the lease passed in the store"
    );
    let retry = run(&idem, &request, &effects).await.expect("answered");
    assert!(
        matches!(retry, Outcome::Answered(Answer::InFlight { .. })),
        "a retry while the completion is being written: {retry:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    idem.store().failing_completes.store(0, Ordering::SeqCst);
    let stored = replayed(&idem, &request, Duration::from_secs(5))
        .await
        .expect("the completion lands once the store is back");
    assert_eq!(stored.body, b"charged");
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    idem.drain().await;
}

#[tokio::test]
async fn c13_a_store_that_does_not_answer_is_an_error_within_the_deadline() {
    let store = Flaky {
        reserve_hangs: true,
        ..Flaky::default()
    };
    let policy = Policy::default().store_timeout(Duration::from_millis(200));
    let idem = Idempotency::with_policy(store, policy).expect("policy");
    let request = charge(&idem, "frozen");
    let started = std::time::Instant::now();
    let error = idem.begin(&request).await.expect_err("no answer");
    assert!(matches!(error, Error::Store(_)), "{error}");
    assert!(error.is_retryable());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let effects = Arc::new(AtomicUsize::new(0));
    let run = run(&idem, &request, &effects).await;
    assert!(
        matches!(&run, Err(RunError::Idem(Error::Store(_)))),
        "{run:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn c08_shutdown_refuses_new_executions_and_waits_for_those_running() {
    let idem = engine(Flaky::default(), Duration::from_secs(5));
    let slow = charge(&idem, "slow");
    let running = {
        let idem = idem.clone();
        tokio::spawn(async move {
            idem.run(&slow, |_| async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged"))
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let shutdown = {
        let idem = idem.clone();
        tokio::spawn(async move { idem.shutdown().await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(idem.is_shutting_down());
    let effects = Arc::new(AtomicUsize::new(0));
    let refused = run(&idem, &charge(&idem, "late"), &effects).await;
    assert!(
        matches!(&refused, Err(RunError::Idem(Error::Store(_)))),
        "{refused:?}"
    );
    assert_eq!(
        effects.load(Ordering::SeqCst),
        0,
        "nothing starts during a shutdown"
    );
    assert!(
        !shutdown.is_finished(),
        "the shutdown waits for the running execution"
    );
    let outcome = running.await.expect("joined").expect("ran");
    assert!(matches!(outcome, Outcome::Executed(_)));
    tokio::time::timeout(Duration::from_secs(2), shutdown)
        .await
        .expect("drained")
        .expect("joined");
}

#[tokio::test]
async fn c07_an_answer_already_stored_under_the_execution_is_what_it_answers() {
    // A handler that stored its completion itself (in its own transaction) and then returned a
    // plain response: the live answer is what was stored, the same as every replay.
    let idem = engine(Flaky::default(), Duration::from_secs(5));
    let request = charge(&idem, "stored-first");
    let outcome = idem
        .run(&request, |ctx| async move {
            let completion = ctx.completion(StoredResponse::new(201, "stored"));
            ctx.idem()
                .store()
                .complete(&completion, Deadline::default())
                .await
                .map_err(Failure::unknown)?;
            Ok::<_, Failure<Error>>(StoredResponse::new(200, "returned"))
        })
        .await
        .expect("ran");
    let Outcome::Executed(sent) = outcome else {
        panic!("expected an execution, got {outcome:?}");
    };
    assert_eq!((sent.status, sent.body.as_slice()), (201, &b"stored"[..]));
    let replay = idem.begin(&request).await.expect("begin");
    assert_eq!(replay, Begin::Answered(Answer::Replay(sent)));
}

#[tokio::test]
async fn c09_a_lease_that_passed_before_the_handler_started_never_runs_it() {
    // The reservation's answer arrives after the lease (a slow network, a starved task), and
    // another process took the orphan over meanwhile: the late execution must not run its
    // handler too. It is answered in flight; one effect.
    let store = Arc::new(Flaky {
        slow_reserves: AtomicUsize::new(1),
        ..Flaky::default()
    });
    let policy = Policy::default().lease(Duration::from_millis(200));
    let late = Idempotency::with_policy(Arc::clone(&store), policy.clone()).expect("policy");
    let other = Idempotency::with_policy(Arc::clone(&store), policy).expect("policy");
    let request = late
        .request("acct", "POST", "/charges")
        .key(Some("late"))
        .body(b"{}")
        .build()
        .expect("valid");
    let effects = Arc::new(AtomicUsize::new(0));
    let counted = |idem: Idempotency<Arc<Flaky>>, effects: Arc<AtomicUsize>| {
        let request = request.clone();
        async move {
            idem.run(&request, move |_| async move {
                effects.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(200)).await;
                Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged"))
            })
            .await
        }
    };
    let first = tokio::spawn(counted(late.clone(), Arc::clone(&effects)));
    tokio::time::sleep(Duration::from_millis(250)).await;
    let taken = counted(other, Arc::clone(&effects));
    let (first, taken) = tokio::join!(first, taken);
    assert!(matches!(taken, Ok(Outcome::Executed(_))), "{taken:?}");
    let first = first.expect("joined");
    assert!(
        matches!(first, Ok(Outcome::Answered(Answer::InFlight { .. }))),
        "{first:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}
