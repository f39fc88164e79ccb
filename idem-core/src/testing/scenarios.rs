//! The conformance scenarios. Each names the rule (docs/state-machine.md) it proves, and each
//! works on a store of its own namespace.

use super::{
    orphan, policy, request, request_on, sent_and_canonical, unique_consumer, Harness, LEASE,
    SHORT_RETENTION,
};
use crate::store::Deadline;
use crate::store::{Acquire, Lease, Reservation, Reserved, Store};
use crate::{
    Answer, Begin, Error, EventKind, Failure, FencingToken, Field, Idempotency, Outcome, Policy,
    RecordId, Reply, Request, RunError, Scope, StoredResponse,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Fail = Failure<&'static str>;

async fn fresh<H: Harness>(harness: &H) -> Arc<H::Store> {
    Arc::new(harness.store().await)
}

fn engine<S: Store + 'static>(store: &Arc<S>, policy: Policy) -> Idempotency<Arc<S>> {
    Idempotency::with_policy(Arc::clone(store), policy).expect("the suite's policies are valid")
}

async fn acquire<S: Store + 'static>(idem: &Idempotency<Arc<S>>, request: &Request) -> Lease {
    match idem.begin(request).await.expect("begin") {
        Begin::Acquired(lease) => lease,
        other => panic!("expected to acquire, got {other:?}"),
    }
}

fn charge(body: &str) -> StoredResponse {
    StoredResponse::new(201, body).with_header("content-type", "application/json")
}

fn replay(response: StoredResponse) -> Begin {
    Begin::Answered(Answer::Replay(response))
}

fn counter() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

/// Runs `request` with a handler that counts its call and answers `response`.
async fn run_counted<S: Store + 'static>(
    idem: &Idempotency<Arc<S>>,
    request: &Request,
    calls: &Arc<AtomicUsize>,
    response: StoredResponse,
) -> Result<Outcome, RunError<&'static str>> {
    let calls = Arc::clone(calls);
    idem.run(request, move |_| async move {
        calls.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Fail>(response)
    })
    .await
}

/// C1: keys that are empty, too long, or not visible ASCII, and a missing key, are typed errors
/// before the store is touched; the valid key is then still fresh.
pub async fn c01_invalid_key_is_rejected_and_nothing_is_written<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c01");
    let long = "k".repeat(256);
    for bad in [
        Some(""),
        Some("a b"),
        Some(long.as_str()),
        Some("clé"),
        Some("k\n"),
        None,
    ] {
        let err = idem
            .request(&consumer, "POST", "/charges")
            .key(bad)
            .body(b"{}")
            .build()
            .expect_err("an invalid key is rejected");
        // A missing key is its own error; any other bad key is invalid input of the key.
        let expected = match bad {
            None => matches!(err, Error::KeyMissing),
            Some(_) => matches!(
                err,
                Error::InvalidInput {
                    field: Field::Key,
                    ..
                }
            ),
        };
        assert!(expected, "{bad:?}: {err:?}");
        assert!(!err.is_retryable(), "{bad:?}");
    }
    let good = idem
        .request(&consumer, "POST", "/charges")
        .key(Some("k"))
        .body(b"{}")
        .build()
        .expect("valid");
    assert_eq!(
        store
            .lookup(good.id(), Deadline::default())
            .await
            .expect("lookup"),
        None
    );
    assert_eq!(acquire(&idem, &good).await.acquired(), Acquire::FRESH);
}

/// C2: the same key under another consumer or another route is another record: consumer B can
/// neither replay, nor block, nor mismatch consumer A's key.
pub async fn c02_scopes_are_isolated<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let a = unique_consumer("c02a");
    let b = unique_consumer("c02b");
    let done = request(&a, "shared", b"{\"amount\":1}");
    let lease = acquire(&idem, &done).await;
    idem.complete(lease, charge("a's charge"))
        .await
        .expect("complete");

    // B: same key, same body, and then another body: its own fresh record each time.
    let b_same = request(&b, "shared", b"{\"amount\":1}");
    let lease_b = acquire(&idem, &b_same).await;
    assert_eq!(lease_b.acquired(), Acquire::FRESH);
    // While B holds its lease, A still replays its own response.
    assert_eq!(
        idem.begin(&done).await.expect("begin"),
        replay(charge("a's charge"))
    );
    idem.release(lease_b).await.expect("release");
    let b_other = request(&b, "shared", b"{\"amount\":999}");
    assert_eq!(acquire(&idem, &b_other).await.acquired(), Acquire::FRESH);

    // A, another route: unrelated.
    let other_route = request_on(&a, "POST /refunds", "shared", b"{\"amount\":1}");
    assert_eq!(
        acquire(&idem, &other_route).await.acquired(),
        Acquire::FRESH
    );

    // A in flight on a key does not block B on the same key.
    let held = request(&a, "held", b"x");
    let _a_lease = acquire(&idem, &held).await;
    assert_eq!(
        acquire(&idem, &request(&b, "held", b"x")).await.acquired(),
        Acquire::FRESH
    );
    assert!(matches!(
        idem.begin(&held).await.expect("begin"),
        Begin::Answered(Answer::InFlight { .. })
    ));
    assert_eq!(
        idem.begin(&done).await.expect("begin"),
        replay(charge("a's charge"))
    );
}

/// C2: triples that a naive `consumer:route:key` join would confuse are different records.
pub async fn c02_scope_parts_cannot_collide<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let base = unique_consumer("c02c");
    let triples = [
        (format!("{base}:x"), "y".to_owned(), "z"),
        (base.clone(), "x:y".to_owned(), "z"),
        (base.clone(), "x".to_owned(), "y:z"),
        (format!("{base}x"), "y".to_owned(), "z"),
    ];
    for (i, (consumer, route, key)) in triples.iter().enumerate() {
        let req = request_on(consumer, route, key, b"same body");
        let lease = acquire(&idem, &req).await;
        assert_eq!(
            lease.acquired(),
            Acquire::FRESH,
            "triple {i} collided with an earlier one"
        );
        idem.complete(lease, charge(&format!("triple {i}")))
            .await
            .expect("complete");
    }
    for (i, (consumer, route, key)) in triples.iter().enumerate() {
        let req = request_on(consumer, route, key, b"same body");
        assert_eq!(
            idem.begin(&req).await.expect("begin"),
            replay(charge(&format!("triple {i}")))
        );
    }
    // Route and consumer are validated: a scope cannot smuggle in control characters.
    assert!(Scope::new("a\0b", "r").is_err());
}

/// C3: a scope by route template does not let two resources under it replay each other: the
/// concrete path and query are part of the fingerprint, so the second is a mismatch.
pub async fn c03_concrete_path_is_part_of_the_fingerprint<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c03p");
    let refund = |path: &str| {
        idem.request(&consumer, "POST", "/customers/{id}/refunds")
            .path(path)
            .key(Some("refund-1"))
            .body(b"{\"amount\":100}")
            .build()
            .expect("valid")
    };
    let a = refund("/customers/cus_A/refunds");
    let b = refund("/customers/cus_B/refunds");
    let a_query = refund("/customers/cus_A/refunds?notify=1");
    assert_eq!(a.id(), b.id(), "one scope: the template");
    let calls = counter();
    let first = run_counted(&idem, &a, &calls, charge("refund of A"))
        .await
        .expect("run");
    assert_eq!(first, Outcome::Executed(charge("refund of A")));
    for other in [&b, &a_query] {
        let outcome = run_counted(&idem, other, &calls, charge("refund of B"))
            .await
            .expect("run");
        assert_eq!(outcome, Outcome::Answered(Answer::Mismatch));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// C3: the same key with another body after completion is a mismatch (422): the handler does not
/// run and the stored record is untouched.
pub async fn c03_mismatch_on_completed_runs_nothing_and_keeps_the_record<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c03");
    let first = request(&consumer, "k", b"{\"amount\":100}");
    let lease = acquire(&idem, &first).await;
    idem.complete(lease, charge("100 charged"))
        .await
        .expect("complete");
    let before = store
        .lookup(first.id(), Deadline::default())
        .await
        .expect("lookup");

    let reused = request(&consumer, "k", b"{\"amount\":200}");
    let ran = counter();
    let outcome = run_counted(&idem, &reused, &ran, charge("200 charged"))
        .await
        .expect("run");
    assert_eq!(outcome, Outcome::Answered(Answer::Mismatch));
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    assert_eq!(
        store
            .lookup(first.id(), Deadline::default())
            .await
            .expect("lookup"),
        before
    );
    assert_eq!(
        idem.begin(&first).await.expect("begin"),
        replay(charge("100 charged"))
    );
}

/// C3: while the first request is in flight, another body under its key is a mismatch (422
/// wins over 409), and the in-flight record keeps its holder.
pub async fn c03_mismatch_beats_in_flight<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c03b");
    let first = request(&consumer, "k", b"{\"amount\":100}");
    let lease = acquire(&idem, &first).await;
    let reused = request(&consumer, "k", b"{\"amount\":200}");
    assert_eq!(
        idem.begin(&reused).await.expect("begin"),
        Begin::Answered(Answer::Mismatch)
    );
    assert!(matches!(
        idem.begin(&first).await.expect("begin"),
        Begin::Answered(Answer::InFlight { .. })
    ));
    let record = store
        .lookup(first.id(), Deadline::default())
        .await
        .expect("lookup")
        .expect("present");
    assert_eq!(record.token, lease.token());
    assert_eq!(record.fingerprint, *first.fingerprint());
    idem.complete(lease, charge("done"))
        .await
        .expect("the holder still completes");
}

/// C3: a record under a request's alternative fingerprint is the request's own. Every step
/// that finds it completed carries its response (a reservation, and a read where the store
/// reads), so the engine replays it from that step and never takes one under the alternative
/// (which would write under it had the record gone in between). Past its retention the key is
/// new, and the execution is written under the request's own fingerprint.
pub async fn c03_a_record_under_the_alternative_fingerprint_is_replayed_from_one_step<
    H: Harness,
>(
    harness: &H,
) {
    let store = fresh(harness).await;
    // Retained for an hour: no step below races the record's end.
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c03");
    let (raw, canonical) = sent_and_canonical(&consumer, "k", 1);
    let lease = acquire(&idem, &raw).await;
    idem.complete(lease, charge("made"))
        .await
        .expect("complete");

    let reservation = Reservation::new(&canonical, LEASE);
    let reserved = store
        .reserve(reservation.claim(), Deadline::default())
        .await
        .expect("reserve");
    let read = store
        .read(&canonical, Deadline::default())
        .await
        .expect("read");
    for (step, found) in [("reserve", reserved), ("read", read)] {
        match found {
            Reserved::Found { record, .. } => {
                assert_eq!(record.fingerprint, *raw.fingerprint(), "{step}");
                let response = match record.state {
                    crate::store::RecordState::Completed { response, .. } => response,
                    other => panic!("{step}: {other:?}"),
                };
                let response = response.unwrap_or_else(|| panic!("{step}: no response"));
                let decoded = StoredResponse::decode(&response).expect("decodes");
                assert_eq!(decoded, charge("made"), "{step}");
            }
            // A store that does not read answers `Lost`; a reservation always finds it.
            Reserved::Lost if step == "read" => {}
            other => panic!("{step}: {other:?}"),
        }
    }

    let ran = counter();
    let outcome = run_counted(&idem, &canonical, &ran, charge("again"))
        .await
        .expect("run");
    assert_eq!(outcome, Outcome::Answered(Answer::Replay(charge("made"))));
    assert_eq!(ran.load(Ordering::SeqCst), 0);

    // Another key, its record under the alternative retained briefly, then gone.
    let short = engine(&store, policy().retention(SHORT_RETENTION));
    let (raw, canonical) = sent_and_canonical(&consumer, "gone", 1);
    let lease = acquire(&short, &raw).await;
    short
        .complete(lease, charge("made"))
        .await
        .expect("complete");
    tokio::time::sleep(SHORT_RETENTION + Duration::from_millis(100)).await;
    let outcome = run_counted(&idem, &canonical, &ran, charge("again"))
        .await
        .expect("run");
    assert!(matches!(outcome, Outcome::Executed(_)), "{outcome:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    let stored = store
        .lookup(canonical.id(), Deadline::default())
        .await
        .expect("lookup")
        .expect("a record");
    assert_eq!(stored.fingerprint, *canonical.fingerprint());
    let plain = request(&consumer, "gone", b"{\"amount\":1}");
    assert_eq!(
        idem.begin(&plain).await.expect("begin"),
        replay(charge("again"))
    );
}

/// C4: 64 tasks fire the same request at once, 20 rounds: exactly one effect per round; every
/// other caller gets in-flight or the replay of that one response.
pub async fn c04_concurrent_same_key_one_effect<H: Harness>(harness: &H) {
    const TASKS: usize = 64;
    const ROUNDS: usize = 20;
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c04");
    for round in 0..ROUNDS {
        let req = Arc::new(request(
            &consumer,
            &format!("round-{round}"),
            b"{\"amount\":5}",
        ));
        let effects = counter();
        let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
        let mut tasks = Vec::with_capacity(TASKS);
        for _ in 0..TASKS {
            let (idem, req, effects, barrier) = (
                idem.clone(),
                Arc::clone(&req),
                Arc::clone(&effects),
                Arc::clone(&barrier),
            );
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                idem.run(&req, move |_| async move {
                    effects.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    Ok::<_, Fail>(charge(&format!("round {round}")))
                })
                .await
            }));
        }
        let (mut executed, mut replayed, mut in_flight) = (0, 0, 0);
        for task in tasks {
            match task.await.expect("task") {
                Ok(Outcome::Executed(r)) => {
                    assert_eq!(r, charge(&format!("round {round}")));
                    executed += 1;
                }
                Ok(Outcome::Answered(Answer::Replay(r))) => {
                    assert_eq!(r, charge(&format!("round {round}")));
                    replayed += 1;
                }
                Ok(Outcome::Answered(Answer::InFlight { retry_after })) => {
                    assert!(retry_after <= LEASE);
                    in_flight += 1;
                }
                other => panic!("round {round}: unexpected {other:?}"),
            }
        }
        assert_eq!(effects.load(Ordering::SeqCst), 1, "round {round}: effects");
        assert_eq!(executed, 1, "round {round}: executed");
        assert_eq!(executed + replayed + in_flight, TASKS);
    }
}

/// C4: concurrent requests on distinct keys do not block each other: all run.
pub async fn c04_concurrent_distinct_keys_all_run<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = Arc::new(unique_consumer("c04d"));
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let (idem, consumer) = (idem.clone(), Arc::clone(&consumer));
            tokio::spawn(async move {
                let req = request(&consumer, &format!("key-{i}"), b"{}");
                idem.run(&req, move |_| async move {
                    Ok::<_, Fail>(charge(&i.to_string()))
                })
                .await
            })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        assert_eq!(
            task.await.expect("task").expect("run"),
            Outcome::Executed(charge(&i.to_string()))
        );
    }
}

/// C5: a duplicate of a running request is answered at once with the time left on the lease;
/// it never waits for the first request to finish.
pub async fn c05_in_flight_duplicate_is_answered_at_once<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let req = request(&unique_consumer("c05"), "k", b"{}");
    let lease = acquire(&idem, &req).await;
    let started = Instant::now();
    let answer = tokio::time::timeout(LEASE / 2, idem.begin(&req))
        .await
        .expect("an in-flight duplicate must not wait for the lease")
        .expect("begin");
    let Begin::Answered(Answer::InFlight { retry_after }) = answer else {
        panic!("expected in flight, got {answer:?}");
    };
    assert!(
        retry_after > Duration::ZERO && retry_after <= LEASE,
        "{retry_after:?}"
    );
    assert!(started.elapsed() < LEASE / 2);
    idem.complete(lease, charge("ok")).await.expect("complete");
}

/// C6: a lease completes once: the store refuses a second completion (`LeaseLost`), releasing
/// or renewing it again is `LeaseLost`, and the stored response stays as it was. The engine's
/// `complete` of a lease whose record is already completed under its token answers what was
/// stored (what every retry replays), never a contradicting response.
pub async fn c06_completion_is_fenced_and_happens_once<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let req = request(&unique_consumer("c06"), "k", b"{}");
    let lease = acquire(&idem, &req).await;
    idem.complete(lease.clone(), charge("first"))
        .await
        .expect("complete");
    assert!(matches!(
        store
            .complete(
                &idem.completion(&lease, charge("second")),
                Deadline::default()
            )
            .await,
        Err(Error::LeaseLost)
    ));
    assert_eq!(
        idem.complete(lease.clone(), charge("second"))
            .await
            .expect("completed under this token"),
        charge("first")
    );
    assert!(matches!(
        idem.release(lease.clone()).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(
        idem.renew(&mut lease.clone()).await,
        Err(Error::LeaseLost)
    ));
    assert_eq!(
        idem.begin(&req).await.expect("begin"),
        replay(charge("first"))
    );
}

/// C7: a retry gets the stored response byte for byte (status, allowed headers, body) and no
/// new effect; cookies, dates, credentials and rate-limit headers are never stored, on the
/// closure path and on the store's own completion path alike.
pub async fn c07_sequential_replay_same_bytes_no_new_effect<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let req = request(&unique_consumer("c07"), "k", b"{\"amount\":42}");
    let effects = counter();
    let body: Vec<u8> = (0..=255u8).chain(*b"{\"id\":\"ch_1\"}").collect();
    let full = StoredResponse::new(201, body.clone())
        .with_header("Content-Type", "application/json")
        .with_header("Location", "/charges/ch_1")
        .with_header("Set-Cookie", "session=secret")
        .with_header("Date", "Sun, 29 Nov 2026 10:00:00 GMT")
        .with_header("Authorization", "Bearer t")
        .with_header("X-RateLimit-Remaining", "99");
    let Outcome::Executed(first) = run_counted(&idem, &req, &effects, full.clone())
        .await
        .expect("run")
    else {
        panic!("the first call executes");
    };
    let names: Vec<&str> = first.headers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["content-type", "location"]);
    assert_eq!(first.body, body);
    for _ in 0..3 {
        let again = run_counted(&idem, &req, &effects, full.clone())
            .await
            .expect("run");
        assert_eq!(again, Outcome::Answered(Answer::Replay(first.clone())));
    }
    assert_eq!(effects.load(Ordering::SeqCst), 1);

    // The store's own path takes only an engine-made completion, which is filtered too.
    let other = request(&unique_consumer("c07s"), "k", b"{}");
    let lease = acquire(&idem, &other).await;
    store
        .complete(&idem.completion(&lease, full), Deadline::default())
        .await
        .expect("complete");
    let Begin::Answered(Answer::Replay(stored)) = idem.begin(&other).await.expect("begin") else {
        panic!("a replay");
    };
    assert_eq!(stored, first);
}

/// C7: the headers that give a body its meaning travel with it even when the allow-list does not
/// name them: a gzip body is replayed as gzip, in its language, with its location.
pub async fn c07_body_meaning_headers_travel_with_the_body<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let mut bare = policy();
    bare.stored_headers.clear();
    let idem = engine(&store, bare);
    let req = request(&unique_consumer("c07e"), "k", b"{}");
    let gzip = StoredResponse::new(201, vec![0x1f, 0x8b, 8, 0, 0, 0])
        .with_header("Content-Type", "application/json")
        .with_header("Content-Encoding", "gzip")
        .with_header("Content-Language", "de")
        .with_header("Location", "/charges/ch_9")
        .with_header("Content-Location", "/charges/ch_9")
        .with_header("X-Debug", "dropped");
    let calls = counter();
    let first = run_counted(&idem, &req, &calls, gzip.clone())
        .await
        .expect("run");
    let Outcome::Answered(Answer::Replay(replayed)) =
        run_counted(&idem, &req, &calls, gzip).await.expect("run")
    else {
        panic!("a replay");
    };
    assert_eq!(first.response(), Some(&replayed));
    assert_eq!(replayed.header("content-encoding"), Some(&b"gzip"[..]));
    assert_eq!(replayed.header("content-language"), Some(&b"de"[..]));
    assert_eq!(replayed.header("location"), Some(&b"/charges/ch_9"[..]));
    assert_eq!(
        replayed.header("content-location"),
        Some(&b"/charges/ch_9"[..])
    );
    assert_eq!(replayed.header("x-debug"), None);
}

/// C8: a handler that says nothing happened releases the reservation (nothing half-recorded)
/// and the retry runs once.
pub async fn c08_nothing_happened_releases_and_retry_runs_once<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let req = request(&unique_consumer("c08"), "k", b"{}");
    let calls = counter();
    let c = Arc::clone(&calls);
    let failed = idem
        .run(&req, move |_| async move {
            c.fetch_add(1, Ordering::SeqCst);
            Err::<StoredResponse, _>(Failure::nothing_happened("card declined before sending"))
        })
        .await;
    assert!(matches!(
        failed,
        Err(RunError::Released("card declined before sending"))
    ));
    assert_eq!(
        store
            .lookup(req.id(), Deadline::default())
            .await
            .expect("lookup"),
        None
    );
    let executed = run_counted(&idem, &req, &calls, charge("charged"))
        .await
        .expect("run");
    assert_eq!(executed, Outcome::Executed(charge("charged")));
    let again = run_counted(&idem, &req, &calls, charge("charged"))
        .await
        .expect("run");
    assert_eq!(again, Outcome::Answered(Answer::Replay(charge("charged"))));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// C8: a handler error whose outcome is unknown (the default, what `?` gives) keeps the key:
/// a 500 problem is stored and every retry gets it, even after the lease; the handler never runs
/// again. With `unknown_with`, the handler's own answer (a 202) is stored instead.
pub async fn c08_unknown_outcome_keeps_the_key_and_replays_the_answer<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c08u");
    let req = request(&consumer, "k", b"{}");
    let calls = counter();
    let c = Arc::clone(&calls);
    let failed = idem
        .run(&req, move |_| async move {
            c.fetch_add(1, Ordering::SeqCst);
            Err::<StoredResponse, Fail>("upstream timed out".into())
        })
        .await;
    let Err(RunError::Unknown { error, response }) = failed else {
        panic!("expected an unknown outcome, got {failed:?}");
    };
    assert_eq!(error, "upstream timed out");
    assert_eq!(response.status, 500);
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    let retry = run_counted(&idem, &req, &calls, charge("second charge"))
        .await
        .expect("run");
    assert_eq!(retry, Outcome::Answered(Answer::Replay(response)));

    let pending = StoredResponse::new(202, "{\"status\":\"reconciling\"}");
    let req = request(&consumer, "k202", b"{}");
    let p = pending.clone();
    let failed = idem
        .run(&req, move |_| async move {
            Err::<StoredResponse, _>(Failure::unknown_with("upstream timed out", p))
        })
        .await;
    assert!(matches!(failed, Err(RunError::Unknown { ref response, .. }) if *response == pending));
    let retry = run_counted(&idem, &req, &calls, charge("second charge"))
        .await
        .expect("run");
    assert_eq!(retry, Outcome::Answered(Answer::Replay(pending)));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// C8: a response the handler chose, whatever its status (402 declined, 500), is stored and
/// replayed: it is an answer, not an error.
pub async fn c08_error_status_response_is_stored_and_replayed<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c08b");
    for status in [402u16, 500] {
        let req = request(&consumer, &format!("k{status}"), b"{}");
        let calls = counter();
        let declined = StoredResponse::new(status, "{\"error\":\"card_declined\"}");
        for expect_replay in [false, true] {
            let outcome = run_counted(&idem, &req, &calls, declined.clone())
                .await
                .expect("run");
            assert_eq!(outcome.response(), Some(&declined));
            assert_eq!(
                matches!(outcome, Outcome::Answered(Answer::Replay(_))),
                expect_replay
            );
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}

/// C8: a request refused before it executed (a status of `Policy::refusals`: a validation 400,
/// a 422, a 404...) is answered but not stored, and the key is released: the corrected retry
/// with the same key executes. The handler may say otherwise either way: `Reply::Executed`
/// stores a 422 that followed its effect, `Reply::Refused` releases a 200.
pub async fn c08_a_refusal_before_execution_releases_the_key_and_the_corrected_retry_runs<
    H: Harness,
>(
    harness: &H,
) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c08r");
    for status in [400u16, 401, 403, 404, 422, 429] {
        let req = request(&consumer, &format!("k{status}"), b"{}");
        let calls = counter();
        let refused = StoredResponse::new(status, "{\"error\":\"amount is missing\"}");
        let outcome = run_counted(&idem, &req, &calls, refused.clone())
            .await
            .expect("run");
        assert_eq!(outcome, Outcome::Refused(refused), "{status}");
        let corrected = StoredResponse::new(201, "{\"id\":\"ch_1\"}");
        let retry = run_counted(&idem, &req, &calls, corrected.clone())
            .await
            .expect("run");
        assert_eq!(
            retry,
            Outcome::Executed(corrected.clone()),
            "{status}: the retry ran"
        );
        let replay = run_counted(&idem, &req, &calls, corrected.clone())
            .await
            .expect("run");
        assert_eq!(replay, Outcome::Answered(Answer::Replay(corrected)));
        assert_eq!(calls.load(Ordering::SeqCst), 2, "{status}");
    }
    // The handler says otherwise: a 422 after the effect is stored, a 200 refused is not.
    let req = request(&consumer, "k-executed-422", b"{}");
    let calls = counter();
    for _ in 0..2 {
        let calls = Arc::clone(&calls);
        let outcome = idem
            .run(&req, move |_| async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Fail>(Reply::Executed(StoredResponse::new(
                    422,
                    "charged; bad receipt",
                )))
            })
            .await
            .expect("run");
        assert_eq!(outcome.response().map(|r| r.status), Some(422));
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "an executed 422 is replayed"
    );
    let req = request(&consumer, "k-refused-200", b"{}");
    let calls = counter();
    for _ in 0..2 {
        let calls = Arc::clone(&calls);
        let outcome = idem
            .run(&req, move |_| async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Fail>(Reply::Refused(StoredResponse::new(200, "not yet")))
            })
            .await
            .expect("run");
        assert!(matches!(outcome, Outcome::Refused(_)), "{outcome:?}");
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "a refused 200 is never replayed"
    );
}

/// C8: a response that cannot be stored (a header value with CR/LF, a status out of range) after
/// the effect ran becomes a stored 500 problem: never a 4xx, never a key given back; the retry
/// after the lease replays the 500 and the effect does not run again.
pub async fn c08_invalid_response_becomes_a_stored_500<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c08i");
    for (i, bad) in [
        StoredResponse::new(201, "ok").with_header("location", "/a\r\nSet-Cookie: x=1"),
        StoredResponse::new(1000, "ok"),
    ]
    .into_iter()
    .enumerate()
    {
        let req = request(&consumer, &format!("k{i}"), b"{}");
        let calls = counter();
        let first = run_counted(&idem, &req, &calls, bad.clone())
            .await
            .expect("run");
        let Outcome::Executed(stored) = first else {
            panic!("the effect ran: {first:?}");
        };
        assert_eq!(stored.status, 500);
        tokio::time::sleep(LEASE + Duration::from_millis(50)).await;
        let retry = run_counted(&idem, &req, &calls, bad).await.expect("run");
        assert_eq!(retry, Outcome::Answered(Answer::Replay(stored)));
        assert_eq!(calls.load(Ordering::SeqCst), 1, "the effect ran again");
    }
}

/// C8: a caller that stops waiting (a client disconnect drops the server's future) does not
/// cancel an execution that has started: it completes on its own task, and the retry after
/// the lease replays it instead of running the effect a second time.
pub async fn c08_dropped_caller_does_not_cancel_the_execution<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let req = request(&unique_consumer("c08d"), "k", b"{}");
    let effects = counter();
    let e = Arc::clone(&effects);
    let dropped = tokio::time::timeout(
        Duration::from_millis(50),
        idem.run(&req, move |_| async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            e.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok::<_, Fail>(charge("charged while nobody waited"))
        }),
    )
    .await;
    assert!(dropped.is_err(), "the caller gave up first");
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    let retry = run_counted(&idem, &req, &effects, charge("second"))
        .await
        .expect("run");
    assert_eq!(
        retry,
        Outcome::Answered(Answer::Replay(charge("charged while nobody waited")))
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

/// C8: a handler that panics after its effect may have run keeps the key: a 500 is stored and
/// replayed, and the panic still reaches the caller.
pub async fn c08_panicking_handler_keeps_the_key<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let req = request(&unique_consumer("c08p"), "k", b"{}");
    let effects = counter();
    let (e, idem2, req2) = (Arc::clone(&effects), idem.clone(), req.clone());
    let joined = tokio::spawn(async move {
        let _ = idem2
            .run(&req2, move |_| async move {
                e.fetch_add(1, Ordering::SeqCst);
                if e.load(Ordering::SeqCst) > 0 {
                    panic!("bug after the effect");
                }
                Ok::<_, Fail>(charge("never"))
            })
            .await;
    })
    .await;
    assert!(joined.expect_err("the panic reaches the caller").is_panic());

    // A handler that panics before it even returns its future, after an effect.
    let sync_req = request(&unique_consumer("c08ps"), "k", b"{}");
    let (e, idem2, req2) = (Arc::clone(&effects), idem.clone(), sync_req.clone());
    let joined = tokio::spawn(async move {
        let _ = idem2
            .run(&req2, move |_| {
                e.fetch_add(1, Ordering::SeqCst);
                if e.load(Ordering::SeqCst) > 0 {
                    panic!("bug before the future");
                }
                async { Ok::<_, Fail>(charge("never")) }
            })
            .await;
    })
    .await;
    assert!(joined.expect_err("the panic reaches the caller").is_panic());

    tokio::time::sleep(LEASE + Duration::from_millis(50)).await;
    for req in [&req, &sync_req] {
        let retry = run_counted(&idem, req, &effects, charge("second"))
            .await
            .expect("run");
        let Outcome::Answered(Answer::Replay(stored)) = retry else {
            panic!("expected the stored 500, got {retry:?}");
        };
        assert_eq!(stored.status, 500);
    }
    assert_eq!(effects.load(Ordering::SeqCst), 2, "one effect per key");
}

/// C9 (and C6): after the lease passes, the next attempt takes the orphan over with a new
/// token; the old holder wakes up and is fenced out of complete, release and renew; only the
/// new holder's response is recorded.
pub async fn c09_orphan_is_taken_over_and_stale_holder_fenced_out<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let req = request(&unique_consumer("c09"), "k", b"{}");
    let stale = acquire(&idem, &req).await;
    assert!(matches!(
        idem.begin(&req).await.expect("begin"),
        Begin::Answered(Answer::InFlight { .. })
    ));
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;

    let fresh_lease = acquire(&idem, &req).await;
    assert_eq!(fresh_lease.acquired(), Acquire::take_over(stale.token()));
    assert_ne!(fresh_lease.token(), stale.token());
    assert!(matches!(
        idem.complete(stale.clone(), charge("stale")).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(
        idem.release(stale.clone()).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(
        idem.renew(&mut stale.clone()).await,
        Err(Error::LeaseLost)
    ));
    let record = store
        .lookup(req.id(), Deadline::default())
        .await
        .expect("lookup")
        .expect("the new holder's record");
    assert_eq!(record.token, fresh_lease.token());
    assert!(record.is_in_progress());

    idem.complete(fresh_lease, charge("fresh"))
        .await
        .expect("complete");
    assert_eq!(
        idem.begin(&req).await.expect("begin"),
        replay(charge("fresh"))
    );
}

/// C9 (and C4): when an orphan's lease has passed, of 32 concurrent retries exactly one takes
/// it over; the others see it in flight.
pub async fn c09_concurrent_takeover_has_one_winner<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let req = Arc::new(request(&unique_consumer("c09c"), "k", b"{}"));
    let orphan = acquire(&idem, &req).await;
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(32));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (idem, req, barrier) = (idem.clone(), Arc::clone(&req), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                idem.begin(&req).await
            })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        match task.await.expect("task").expect("begin") {
            Begin::Acquired(lease) => winners.push(lease),
            Begin::Answered(Answer::InFlight { .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one takes the orphan over");
    assert_eq!(winners[0].acquired(), Acquire::take_over(orphan.token()));
}

/// C9 (and C6): a holder whose lease passed completes at the very moment retries try to take
/// the record over. Either the completion lands and every retry replays it, or one retry takes
/// over and the completion is `LeaseLost`; never both. Eight keys race at once.
pub async fn c09_late_completion_and_takeover_never_both_win<H: Harness>(harness: &H) {
    const TAKERS: usize = 8;
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = Arc::new(unique_consumer("c09l"));
    let races: Vec<_> = (0..8)
        .map(|k| {
            let (idem, store, consumer) = (idem.clone(), Arc::clone(&store), Arc::clone(&consumer));
            tokio::spawn(async move {
                let req = Arc::new(request(&consumer, &format!("k{k}"), b"{}"));
                let holder = acquire(&idem, &req).await;
                tokio::time::sleep(LEASE + Duration::from_millis(50)).await;
                let barrier = Arc::new(tokio::sync::Barrier::new(TAKERS + 1));
                let takers: Vec<_> = (0..TAKERS)
                    .map(|_| {
                        let (idem, req, barrier) =
                            (idem.clone(), Arc::clone(&req), Arc::clone(&barrier));
                        tokio::spawn(async move {
                            barrier.wait().await;
                            idem.begin(&req).await.expect("begin")
                        })
                    })
                    .collect();
                barrier.wait().await;
                // One attempt on the store itself: the engine's retries are not under test.
                let completion = idem.completion(&holder, charge("late"));
                let completed = store.complete(&completion, Deadline::default()).await;
                let mut acquired = 0;
                for taker in takers {
                    match taker.await.expect("task") {
                        Begin::Acquired(lease) => {
                            assert!(lease.acquired().kind() == EventKind::TakenOver);
                            acquired += 1;
                        }
                        Begin::Answered(Answer::Replay(r)) => assert_eq!(r, charge("late")),
                        Begin::Answered(Answer::InFlight { .. }) => {}
                        Begin::Answered(Answer::Mismatch) => panic!("same request, no mismatch"),
                    }
                }
                match completed {
                    Ok(()) => {
                        assert_eq!(acquired, 0, "a completed record was taken over");
                        assert_eq!(
                            idem.begin(&req).await.expect("begin"),
                            replay(charge("late"))
                        );
                    }
                    Err(Error::LeaseLost) => {
                        assert_eq!(acquired, 1, "the completion lost to no taker")
                    }
                    Err(other) => panic!("unexpected {other:?}"),
                }
            })
        })
        .collect();
    for race in races {
        race.await.expect("race");
    }
}

/// C9: a long handler that renews its lease keeps it past the original deadline: duplicates
/// stay in flight and the holder completes.
pub async fn c09_renew_keeps_a_long_handler_lease<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let req = request(&unique_consumer("c09r"), "k", b"{}");
    let started = Instant::now();
    let (idem2, req2) = (idem.clone(), req.clone());
    let outcome = idem
        .run(&req, move |mut ctx| async move {
            for _ in 0..4 {
                tokio::time::sleep(LEASE / 2).await;
                let before = ctx.lease().lease_until();
                ctx.renew().await.map_err(Failure::nothing_happened)?;
                assert!(ctx.lease().lease_until() >= before);
                let answer = idem2
                    .begin(&req2)
                    .await
                    .map_err(Failure::nothing_happened)?;
                assert!(matches!(answer, Begin::Answered(Answer::InFlight { .. })));
            }
            Ok::<_, Failure<Error>>(charge("long"))
        })
        .await
        .expect("run");
    assert!(started.elapsed() >= LEASE * 2);
    assert_eq!(outcome, Outcome::Executed(charge("long")));
    assert_eq!(
        idem.begin(&req).await.expect("begin"),
        replay(charge("long"))
    );
}

/// C9: a handler slower than its lease that never renews is not taken over while it runs: the
/// engine renews the lease on a heartbeat. A duplicate stays in flight, another body stays a
/// mismatch, and the effect runs once.
pub async fn c09_slow_handler_keeps_its_lease_without_renewing<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c09s");
    let req = request(&consumer, "k", b"{\"amount\":100}");
    let effects = counter();
    let e = Arc::clone(&effects);
    let slow = {
        let (idem, req) = (idem.clone(), req.clone());
        tokio::spawn(async move {
            idem.run(&req, move |_| async move {
                e.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(LEASE * 5 / 2).await;
                Ok::<_, Fail>(charge("slow"))
            })
            .await
        })
    };
    tokio::time::sleep(LEASE * 3 / 2).await;
    let duplicate = run_counted(&idem, &req, &effects, charge("twice"))
        .await
        .expect("run");
    assert!(
        matches!(duplicate, Outcome::Answered(Answer::InFlight { .. })),
        "{duplicate:?}"
    );
    let other = request(&consumer, "k", b"{\"amount\":999}");
    let other = run_counted(&idem, &other, &effects, charge("other"))
        .await
        .expect("run");
    assert_eq!(other, Outcome::Answered(Answer::Mismatch));
    let first = slow.await.expect("task").expect("run");
    assert_eq!(first, Outcome::Executed(charge("slow")));
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

/// C10: after the retention the key is new again, even with another body; before it, a replay.
pub async fn c10_retention_passed_is_treated_as_new<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy().retention(SHORT_RETENTION));
    let consumer = unique_consumer("c10");
    let same = request(&consumer, "k", b"{\"amount\":1}");
    let lease = acquire(&idem, &same).await;
    idem.complete(lease, charge("old")).await.expect("complete");
    assert_eq!(
        idem.begin(&same).await.expect("begin"),
        replay(charge("old"))
    );
    let other_key = request(&consumer, "k2", b"{\"amount\":1}");
    let lease = acquire(&idem, &other_key).await;
    idem.complete(lease, charge("old2"))
        .await
        .expect("complete");

    tokio::time::sleep(SHORT_RETENTION + Duration::from_millis(100)).await;
    let again = acquire(&idem, &same).await;
    assert!(
        matches!(
            again.acquired().kind(),
            EventKind::StartedOver | EventKind::Acquired
        ),
        "{:?}",
        again.acquired()
    );
    idem.complete(again, charge("new")).await.expect("complete");
    assert_eq!(
        idem.begin(&same).await.expect("begin"),
        replay(charge("new"))
    );
    let reused = request(&consumer, "k2", b"{\"amount\":2}");
    assert!(matches!(
        acquire(&idem, &reused).await.acquired().kind(),
        EventKind::StartedOver | EventKind::Acquired
    ));
}

/// C10: expired records (completed past retention, orphans past the lease) leave the store and
/// live ones stay. A purging store deletes at most `limit` per call; a store whose server
/// expires records by itself lets them go without a purge.
pub async fn c10_expired_records_leave_in_bounded_batches<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let short = engine(
        &store,
        policy().lease(SHORT_RETENTION).retention(SHORT_RETENTION),
    );
    let long = engine(&store, policy().lease(Duration::from_secs(3600)));
    let consumer = unique_consumer("c10p");
    let mut expiring = Vec::new();
    for i in 0..5 {
        let req = request(&consumer, &format!("done-{i}"), b"{}");
        let lease = acquire(&short, &req).await;
        short
            .complete(lease, charge("short"))
            .await
            .expect("complete");
        expiring.push(req.id().clone());
    }
    for i in 0..2 {
        let req = request(&consumer, &format!("orphan-{i}"), b"{}");
        let _abandoned = acquire(&short, &req).await;
        expiring.push(req.id().clone());
    }
    let mut live = Vec::new();
    for i in 0..2 {
        let req = request(&consumer, &format!("live-{i}"), b"{}");
        let lease = acquire(&long, &req).await;
        long.complete(lease, charge("long"))
            .await
            .expect("complete");
        live.push(req.id().clone());
    }
    let running = request(&consumer, "running", b"{}");
    let _running = acquire(&long, &running).await;
    live.push(running.id().clone());

    tokio::time::sleep(SHORT_RETENTION + Duration::from_millis(100)).await;
    if !store.capabilities().server_ttl {
        let first = store
            .purge_expired(2, Deadline::default())
            .await
            .expect("purge");
        assert_eq!(first, 2, "a batch is full while expired records remain");
        let mut rounds = 0;
        loop {
            let left = count_present(&*store, &expiring).await;
            if left == 0 {
                break;
            }
            let purged = store
                .purge_expired(2, Deadline::default())
                .await
                .expect("purge");
            assert!(purged <= 2, "purged {purged} with a limit of 2");
            assert!(purged > 0, "{left} expired records left but nothing purged");
            rounds += 1;
            assert!(rounds < 100, "purge does not converge");
        }
        assert_eq!(
            store
                .purge_expired(2, Deadline::default())
                .await
                .expect("purge"),
            0
        );
    } else {
        let deadline = Instant::now() + Duration::from_secs(10);
        while count_present(&*store, &expiring).await > 0 {
            assert!(Instant::now() < deadline, "the server kept expired records");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for id in &live {
        assert!(
            store
                .lookup(id, Deadline::default())
                .await
                .expect("lookup")
                .is_some(),
            "live record {id:?} left"
        );
    }
}

async fn count_present<S: Store>(store: &S, ids: &[RecordId]) -> usize {
    let mut present = 0;
    for id in ids {
        present += usize::from(
            store
                .lookup(id, Deadline::default())
                .await
                .expect("lookup")
                .is_some(),
        );
    }
    present
}

/// C12: a body over the limit is a typed error (413) and nothing is written; at the limit it
/// is accepted.
pub async fn c12_oversized_body_is_rejected_and_nothing_is_written<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c12");
    let limit = idem.policy().max_body_bytes;
    let big = vec![b'x'; limit + 1];
    let err = idem
        .request(&consumer, "POST", "/charges")
        .key(Some("k"))
        .body(&big)
        .build()
        .expect_err("over the limit");
    assert!(
        matches!(err, Error::BodyTooLarge { limit: l, actual } if l == limit && actual == limit + 1)
    );
    let id = RecordId::new(
        Scope::new(&consumer, "POST /charges").expect("scope"),
        crate::IdempotencyKey::new("k").expect("key"),
    );
    assert_eq!(
        store
            .lookup(&id, Deadline::default())
            .await
            .expect("lookup"),
        None
    );
    let at_limit = idem
        .request(&consumer, "POST", "/charges")
        .key(Some("k"))
        .body(&big[..limit])
        .build()
        .expect("at the limit");
    assert_eq!(acquire(&idem, &at_limit).await.acquired(), Acquire::FRESH);
}

/// C12: the engine applies its own policy's body limit to every request, also one built without
/// it (`Request::builder` uses the default 1 MiB): 413, nothing recorded, nothing run.
pub async fn c12_engine_enforces_its_body_limit_however_the_request_was_built<H: Harness>(
    harness: &H,
) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy().max_body_bytes(100));
    let req = Request::builder(&unique_consumer("c12e"), "POST", "/charges")
        .key(Some("k"))
        .body(&[b'x'; 101])
        .build()
        .expect("within the builder's default limit");
    let err = idem.begin(&req).await.expect_err("over the engine's limit");
    assert!(matches!(
        err,
        Error::BodyTooLarge {
            limit: 100,
            actual: 101
        }
    ));
    let calls = counter();
    let run = run_counted(&idem, &req, &calls, charge("never")).await;
    assert!(matches!(
        run,
        Err(RunError::Idem(Error::BodyTooLarge { .. }))
    ));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(
        store
            .lookup(req.id(), Deadline::default())
            .await
            .expect("lookup"),
        None
    );
}

/// C12: an in-progress record that also carries a response is inconsistent: every store answers
/// `CorruptRecord` for it (never "in flight", never a takeover once its lease has passed), and
/// nothing runs.
pub async fn c12_an_in_progress_record_with_a_response_is_corrupt<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let req = request(&unique_consumer("c12p"), "k", b"{}");
    let _lease = acquire(&idem, &req).await;
    if !harness.corrupt_in_progress(&store, req.id()).await {
        return; // the store's records cannot hold that state
    }
    assert!(matches!(
        store
            .reserve(Reservation::new(&req, LEASE).claim(), Deadline::default())
            .await,
        Err(Error::CorruptRecord(_))
    ));
    assert!(matches!(
        store.lookup(req.id(), Deadline::default()).await,
        Err(Error::CorruptRecord(_))
    ));
    // Past its lease too: an expired corrupt record is not an orphan to take over.
    tokio::time::sleep(LEASE + Duration::from_millis(50)).await;
    let ran = counter();
    let outcome = run_counted(&idem, &req, &ran, charge("again")).await;
    assert!(
        matches!(outcome, Err(RunError::Idem(Error::CorruptRecord(_)))),
        "{outcome:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

/// C12: a stored record that does not decode is a typed error on begin, run and lookup; it is
/// never treated as absent, so the handler never runs a second time.
pub async fn c12_corrupt_record_is_a_typed_error<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let req = request(&unique_consumer("c12c"), "k", b"{}");
    let lease = acquire(&idem, &req).await;
    idem.complete(lease, charge("stored"))
        .await
        .expect("complete");
    harness.corrupt_response(&store, req.id()).await;

    assert!(matches!(
        idem.begin(&req).await,
        Err(Error::CorruptRecord(_))
    ));
    assert!(matches!(
        store.lookup(req.id(), Deadline::default()).await,
        Err(Error::CorruptRecord(_))
    ));
    let ran = counter();
    let outcome = run_counted(&idem, &req, &ran, charge("again")).await;
    assert!(
        matches!(outcome, Err(RunError::Idem(Error::CorruptRecord(_)))),
        "{outcome:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

/// C16: a store call is one atomic step that reports what it found; the engine decides and
/// loops. `reserve` writes a fresh record with the claim's token, then reports it as it is;
/// on an expired record it reports the record and writes nothing (no takeover of its own);
/// `replace` with a view that is no longer true writes nothing and says so, once.
pub async fn c16_a_store_step_reports_what_it_found_and_never_loops<H: Harness>(harness: &H) {
    let store = fresh(harness).await;
    let req = request(&unique_consumer("c16s"), "k", b"{}");
    let first = Reservation::new(&req, LEASE);
    let mine = first.claim().token();
    let until = match store
        .reserve(first.claim(), Deadline::default())
        .await
        .expect("reserve")
    {
        Reserved::Written { until } => until,
        other => panic!("a fresh key is inserted: {other:?}"),
    };
    match store
        .reserve(first.claim(), Deadline::default())
        .await
        .expect("reserve again")
    {
        Reserved::Found { record, .. } => {
            assert_eq!(record.token, mine);
            assert_eq!(record.deadline(), until);
            assert!(record.is_in_progress());
        }
        other => panic!("the record is found, not written again: {other:?}"),
    }
    tokio::time::sleep(LEASE + Duration::from_millis(50)).await;
    let second = Reservation::new(&req, LEASE);
    match store
        .reserve(second.claim(), Deadline::default())
        .await
        .expect("reserve expired")
    {
        Reserved::Found { record, now, .. } => {
            assert_eq!(record.token, mine, "an expired record is reported as it is");
            assert!(!record.is_live(now));
        }
        other => panic!("an expired record is reported, never taken over: {other:?}"),
    }
    let still = store
        .lookup(req.id(), Deadline::default())
        .await
        .expect("lookup");
    assert_eq!(still.map(|r| r.token), Some(mine), "reserve wrote nothing");
    let stale = Acquire::take_over(FencingToken::generate());
    assert_eq!(
        store
            .replace(second.claim(), stale, Deadline::default())
            .await
            .expect("replace"),
        Reserved::Lost,
        "another token: nothing written"
    );
    let wrong_state = Acquire::start_over(mine);
    assert_eq!(
        store
            .replace(second.claim(), wrong_state, Deadline::default())
            .await
            .expect("replace"),
        Reserved::Lost,
        "in progress, not completed: nothing written"
    );
    let still = store
        .lookup(req.id(), Deadline::default())
        .await
        .expect("lookup");
    assert_eq!(still.map(|r| r.token), Some(mine));
    let takeover = Acquire::take_over(mine);
    let replaced = store
        .replace(second.claim(), takeover, Deadline::default())
        .await;
    let until = match replaced.expect("replace") {
        Reserved::Written { until } => until,
        other => panic!("the record the decision saw is replaced: {other:?}"),
    };
    let now = store
        .lookup(req.id(), Deadline::default())
        .await
        .expect("lookup");
    assert_eq!(now.map(|r| r.token), Some(second.claim().token()));
    // A record gone since a decision read it is a change, never a busy row.
    let lease = Lease::new(&req, second.claim().token(), until, takeover);
    store
        .release(&lease, Deadline::default())
        .await
        .expect("release");
    let third = Reservation::new(&req, LEASE);
    let gone = Acquire::take_over(second.claim().token());
    assert_eq!(
        store
            .replace(third.claim(), gone, Deadline::default())
            .await
            .expect("replace"),
        Reserved::Lost,
        "a record gone: nothing written"
    );
    assert_eq!(
        store
            .lookup(req.id(), Deadline::default())
            .await
            .expect("lookup"),
        None
    );
}

/// C3, C4, C9: an orphan under a request's alternative fingerprint is in flight while
/// its lease lives (never 422), then taken over once, under the request's own fingerprint, by
/// one of many concurrent retries; nobody gets 422.
pub async fn c09_an_orphan_under_the_alternative_fingerprint_is_taken_over_under_its_own<
    H: Harness,
>(
    harness: &H,
) {
    let store = fresh(harness).await;
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c09-alt");
    for key in ["one", "many"] {
        let (raw, canonical) = sent_and_canonical(&consumer, key, 1);
        orphan(&*store, &raw, LEASE).await;
        let ran = counter();
        let live = run_counted(&idem, &canonical, &ran, charge("x")).await;
        assert!(
            matches!(live, Ok(Outcome::Answered(Answer::InFlight { .. }))),
            "{key}: {live:?}"
        );
        tokio::time::sleep(LEASE + Duration::from_millis(150)).await;
        let mut tasks = Vec::new();
        let n = if key == "one" { 1 } else { 16 };
        for _ in 0..n {
            let (idem, canonical, ran) = (idem.clone(), canonical.clone(), Arc::clone(&ran));
            tasks.push(tokio::spawn(async move {
                run_counted(&idem, &canonical, &ran, charge("taken")).await
            }));
        }
        for task in tasks {
            let outcome = task.await.expect("joined");
            assert!(
                matches!(
                    outcome,
                    Ok(Outcome::Executed(_))
                        | Ok(Outcome::Answered(Answer::InFlight { .. }))
                        | Ok(Outcome::Answered(Answer::Replay(_)))
                ),
                "{key}: {outcome:?}"
            );
        }
        assert_eq!(ran.load(Ordering::SeqCst), 1, "{key}: one effect");
        let stored = store
            .lookup(canonical.id(), Deadline::default())
            .await
            .expect("lookup")
            .expect("a record");
        assert_eq!(stored.fingerprint, *canonical.fingerprint(), "{key}");
        let again = run_counted(&idem, &canonical, &ran, charge("again")).await;
        assert!(
            matches!(&again, Ok(Outcome::Answered(Answer::Replay(r))) if r.body == b"taken"),
            "{key}: {again:?}"
        );
    }
}
