//! The scenarios. Each names the rule (DESIGN §2) it proves.

use super::{
    policy, request, request_on, unique_consumer, EXPIRED_RECORDS, LEASE, SHORT_RETENTION,
};
use crate::{
    Acquire, Begin, Error, Field, Idempotency, Outcome, Policy, RecordId, Request, RunError, Scope,
    Store, StoredResponse,
};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn engine<S: Store + 'static>(store: &Arc<S>, policy: Policy) -> Idempotency<Arc<S>> {
    Idempotency::with_policy(Arc::clone(store), policy).expect("the suite's policies are valid")
}

async fn acquire<S: Store + 'static>(
    idem: &Idempotency<Arc<S>>,
    request: &Request,
) -> crate::Lease {
    match idem.begin(request).await.expect("begin") {
        Begin::Acquired(lease) => lease,
        other => panic!("expected to acquire, got {other:?}"),
    }
}

fn charge(body: &str) -> StoredResponse {
    StoredResponse::new(201, body).with_header("content-type", "application/json")
}

/// C1: keys that are empty, too long, or not visible ASCII, and a missing key, are typed errors
/// before the store is touched; the valid key is then still fresh.
pub async fn c01_invalid_key_is_rejected_and_nothing_is_written<S: Store + 'static>(store: Arc<S>) {
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
        assert!(
            matches!(
                err,
                Error::InvalidInput {
                    field: Field::Key,
                    ..
                }
            ),
            "{bad:?}: {err:?}"
        );
        assert_eq!(err.http_status(), 400);
    }
    let good = idem
        .request(&consumer, "POST", "/charges")
        .key(Some("k"))
        .body(b"{}")
        .build()
        .expect("valid");
    assert_eq!(store.lookup(&good.id).await.expect("lookup"), None);
    assert_eq!(acquire(&idem, &good).await.acquired, Acquire::Fresh);
}

/// C2: the same key under another consumer or another route is another record: consumer B can
/// neither replay, nor block, nor mismatch consumer A's key.
pub async fn c02_scopes_are_isolated<S: Store + 'static>(store: Arc<S>) {
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
    assert_eq!(lease_b.acquired, Acquire::Fresh);
    // While B holds its lease, A still replays its own response.
    assert_eq!(
        idem.begin(&done).await.expect("begin"),
        Begin::Replay(charge("a's charge"))
    );
    idem.release(lease_b).await.expect("release");
    let b_other = request(&b, "shared", b"{\"amount\":999}");
    assert_eq!(acquire(&idem, &b_other).await.acquired, Acquire::Fresh);

    // A, another route: unrelated.
    let other_route = request_on(&a, "POST /refunds", "shared", b"{\"amount\":1}");
    assert_eq!(acquire(&idem, &other_route).await.acquired, Acquire::Fresh);

    // A in flight on a key does not block B on the same key.
    let held = request(&a, "held", b"x");
    let _a_lease = acquire(&idem, &held).await;
    assert_eq!(
        acquire(&idem, &request(&b, "held", b"x")).await.acquired,
        Acquire::Fresh
    );
    assert!(matches!(
        idem.begin(&held).await.expect("begin"),
        Begin::InFlight { .. }
    ));
    assert_eq!(
        idem.begin(&done).await.expect("begin"),
        Begin::Replay(charge("a's charge"))
    );
}

/// C2: triples that a naive `consumer:route:key` join would confuse are different records.
pub async fn c02_scope_parts_cannot_collide<S: Store + 'static>(store: Arc<S>) {
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
            lease.acquired,
            Acquire::Fresh,
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
            Begin::Replay(charge(&format!("triple {i}")))
        );
    }
    // Route and consumer are validated: a scope cannot smuggle in control characters.
    assert!(Scope::new("a\0b", "r").is_err());
}

/// C3: the same key with another body after completion is a mismatch (422): the handler does not
/// run and the stored record is untouched.
pub async fn c03_mismatch_on_completed_runs_nothing_and_keeps_the_record<S: Store + 'static>(
    store: Arc<S>,
) {
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c03");
    let first = request(&consumer, "k", b"{\"amount\":100}");
    let lease = acquire(&idem, &first).await;
    idem.complete(lease, charge("100 charged"))
        .await
        .expect("complete");
    let before = store.lookup(&first.id).await.expect("lookup");

    let reused = request(&consumer, "k", b"{\"amount\":200}");
    let ran = AtomicUsize::new(0);
    let outcome = idem
        .run(&reused, |_| async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(charge("200 charged"))
        })
        .await
        .expect("run");
    assert_eq!(outcome, Outcome::Mismatch);
    assert_eq!(outcome.http_status(idem.policy()), 422);
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    assert_eq!(store.lookup(&first.id).await.expect("lookup"), before);
    assert_eq!(
        idem.begin(&first).await.expect("begin"),
        Begin::Replay(charge("100 charged"))
    );
}

/// C3: while the first request is in flight, another body under its key is a mismatch (422
/// wins over 409), and the in-flight record keeps its holder.
pub async fn c03_mismatch_beats_in_flight<S: Store + 'static>(store: Arc<S>) {
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c03b");
    let first = request(&consumer, "k", b"{\"amount\":100}");
    let lease = acquire(&idem, &first).await;
    let reused = request(&consumer, "k", b"{\"amount\":200}");
    assert_eq!(idem.begin(&reused).await.expect("begin"), Begin::Mismatch);
    assert!(matches!(
        idem.begin(&first).await.expect("begin"),
        Begin::InFlight { .. }
    ));
    let record = store
        .lookup(&first.id)
        .await
        .expect("lookup")
        .expect("present");
    assert_eq!(record.token, lease.token);
    assert_eq!(record.fingerprint, first.fingerprint);
    idem.complete(lease, charge("done"))
        .await
        .expect("the holder still completes");
}

/// C4: 64 tasks fire the same request at once, 20 rounds: exactly one effect per round; every
/// other caller gets in-flight or the replay of that one response.
pub async fn c04_concurrent_same_key_one_effect<S: Store + 'static>(store: Arc<S>) {
    const TASKS: usize = 64;
    const ROUNDS: usize = 20;
    let idem = Arc::new(engine(&store, policy()));
    let consumer = unique_consumer("c04");
    for round in 0..ROUNDS {
        let req = Arc::new(request(
            &consumer,
            &format!("round-{round}"),
            b"{\"amount\":5}",
        ));
        let effects = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
        let mut tasks = Vec::with_capacity(TASKS);
        for _ in 0..TASKS {
            let (idem, req, effects, barrier) = (
                Arc::clone(&idem),
                Arc::clone(&req),
                Arc::clone(&effects),
                Arc::clone(&barrier),
            );
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                idem.run(&req, |_| async {
                    effects.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    Ok::<_, Error>(charge(&format!("round {round}")))
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
                Ok(Outcome::Replayed(r)) => {
                    assert_eq!(r, charge(&format!("round {round}")));
                    replayed += 1;
                }
                Ok(Outcome::InFlight { retry_after }) => {
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
pub async fn c04_concurrent_distinct_keys_all_run<S: Store + 'static>(store: Arc<S>) {
    let idem = Arc::new(engine(&store, policy()));
    let consumer = Arc::new(unique_consumer("c04d"));
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let (idem, consumer) = (Arc::clone(&idem), Arc::clone(&consumer));
            tokio::spawn(async move {
                let req = request(&consumer, &format!("key-{i}"), b"{}");
                idem.run(&req, |_| async { Ok::<_, Error>(charge(&i.to_string())) })
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
pub async fn c05_in_flight_duplicate_is_answered_at_once<S: Store + 'static>(store: Arc<S>) {
    let idem = engine(&store, policy());
    let req = request(&unique_consumer("c05"), "k", b"{}");
    let lease = acquire(&idem, &req).await;
    let started = Instant::now();
    let answer = tokio::time::timeout(LEASE / 2, idem.begin(&req))
        .await
        .expect("an in-flight duplicate must not wait for the lease")
        .expect("begin");
    let Begin::InFlight { retry_after } = answer else {
        panic!("expected in flight, got {answer:?}");
    };
    assert!(
        retry_after > Duration::ZERO && retry_after <= LEASE,
        "{retry_after:?}"
    );
    assert!(started.elapsed() < LEASE / 2);
    idem.complete(lease, charge("ok")).await.expect("complete");
}

/// C6: a lease completes once; completing, releasing or renewing it again is `LeaseLost` and
/// leaves the stored response as it was.
pub async fn c06_completion_is_fenced_and_happens_once<S: Store + 'static>(store: Arc<S>) {
    let idem = engine(&store, policy());
    let req = request(&unique_consumer("c06"), "k", b"{}");
    let lease = acquire(&idem, &req).await;
    idem.complete(lease.clone(), charge("first"))
        .await
        .expect("complete");
    assert!(matches!(
        idem.complete(lease.clone(), charge("second")).await,
        Err(Error::LeaseLost)
    ));
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
        Begin::Replay(charge("first"))
    );
}

/// C7: a retry gets the stored response byte for byte (status, allowed headers, body) and no
/// new effect; cookies, dates, credentials and rate-limit headers are never stored.
pub async fn c07_sequential_replay_same_bytes_no_new_effect<S: Store + 'static>(store: Arc<S>) {
    let idem = engine(&store, policy());
    let req = request(&unique_consumer("c07"), "k", b"{\"amount\":42}");
    let effects = AtomicUsize::new(0);
    let body: Vec<u8> = (0..=255u8).chain(*b"{\"id\":\"ch_1\"}").collect();
    let handler = || async {
        effects.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>(
            StoredResponse::new(201, body.clone())
                .with_header("Content-Type", "application/json")
                .with_header("Location", "/charges/ch_1")
                .with_header("Set-Cookie", "session=secret")
                .with_header("Date", "Sun, 29 Nov 2026 10:00:00 GMT")
                .with_header("Authorization", "Bearer t")
                .with_header("X-RateLimit-Remaining", "99"),
        )
    };
    let Outcome::Executed(first) = idem.run(&req, |_| handler()).await.expect("run") else {
        panic!("the first call executes");
    };
    let names: Vec<&str> = first.headers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["content-type", "location"]);
    assert_eq!(first.body, body);
    for _ in 0..3 {
        let again = idem.run(&req, |_| handler()).await.expect("run");
        assert_eq!(again, Outcome::Replayed(first.clone()));
    }
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

/// C8: a handler error releases the reservation (nothing half-recorded) and the retry runs once.
pub async fn c08_handler_error_releases_and_retry_runs_once<S: Store + 'static>(store: Arc<S>) {
    let idem = engine(&store, policy());
    let req = request(&unique_consumer("c08"), "k", b"{}");
    let calls = AtomicUsize::new(0);
    let failed = idem
        .run(&req, |_| async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<StoredResponse, _>("card network timeout")
        })
        .await;
    assert!(matches!(
        failed,
        Err(RunError::Handler("card network timeout"))
    ));
    assert_eq!(store.lookup(&req.id).await.expect("lookup"), None);
    for expect_replay in [false, true] {
        let outcome = idem
            .run(&req, |_| async {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, &str>(charge("charged"))
            })
            .await
            .expect("run");
        let expected = if expect_replay {
            Outcome::Replayed(charge("charged"))
        } else {
            Outcome::Executed(charge("charged"))
        };
        assert_eq!(outcome, expected);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// C8: a response the handler chose, whatever its status (402 declined, 500), is stored and
/// replayed: it is an answer, not an error.
pub async fn c08_error_status_response_is_stored_and_replayed<S: Store + 'static>(store: Arc<S>) {
    let idem = engine(&store, policy());
    let consumer = unique_consumer("c08b");
    for status in [402u16, 500] {
        let req = request(&consumer, &format!("k{status}"), b"{}");
        let calls = AtomicUsize::new(0);
        let declined = StoredResponse::new(status, "{\"error\":\"card_declined\"}");
        for expect_replay in [false, true] {
            let outcome = idem
                .run(&req, |_| async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(declined.clone())
                })
                .await
                .expect("run");
            assert_eq!(outcome.http_status(idem.policy()), status);
            assert_eq!(outcome.response(), Some(&declined));
            assert_eq!(matches!(outcome, Outcome::Replayed(_)), expect_replay);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}

/// C9 (and C6): after the lease passes, the next attempt takes the orphan over with a new
/// token; the old holder wakes up and is fenced out of complete, release and renew; only the
/// new holder's response is recorded.
pub async fn c09_orphan_is_taken_over_and_stale_holder_fenced_out<S: Store + 'static>(
    store: Arc<S>,
) {
    let _no_purge = EXPIRED_RECORDS.read().await;
    let idem = engine(&store, policy());
    let req = request(&unique_consumer("c09"), "k", b"{}");
    let stale = acquire(&idem, &req).await;
    assert!(matches!(
        idem.begin(&req).await.expect("begin"),
        Begin::InFlight { .. }
    ));
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;

    let fresh = acquire(&idem, &req).await;
    assert_eq!(
        fresh.acquired,
        Acquire::TakeOver {
            previous: stale.token
        }
    );
    assert_ne!(fresh.token, stale.token);
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
        .lookup(&req.id)
        .await
        .expect("lookup")
        .expect("the new holder's record");
    assert_eq!(record.token, fresh.token);
    assert!(record.is_in_progress());

    idem.complete(fresh, charge("fresh"))
        .await
        .expect("complete");
    assert_eq!(
        idem.begin(&req).await.expect("begin"),
        Begin::Replay(charge("fresh"))
    );
}

/// C9 (and C4): when an orphan's lease has passed, of 32 concurrent retries exactly one takes
/// it over; the others see it in flight.
pub async fn c09_concurrent_takeover_has_one_winner<S: Store + 'static>(store: Arc<S>) {
    let _no_purge = EXPIRED_RECORDS.read().await;
    let idem = Arc::new(engine(&store, policy()));
    let req = Arc::new(request(&unique_consumer("c09c"), "k", b"{}"));
    let orphan = acquire(&idem, &req).await;
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(32));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (idem, req, barrier) = (Arc::clone(&idem), Arc::clone(&req), Arc::clone(&barrier));
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
            Begin::InFlight { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one takes the orphan over");
    assert_eq!(
        winners[0].acquired,
        Acquire::TakeOver {
            previous: orphan.token
        }
    );
}

/// C9 (and C6): a holder whose lease passed completes at the very moment retries try to take
/// the record over. Either the completion lands and every retry replays it, or one retry takes
/// over and the completion is `LeaseLost`; never both. Eight keys race at once.
pub async fn c09_late_completion_and_takeover_never_both_win<S: Store + 'static>(store: Arc<S>) {
    const TAKERS: usize = 8;
    let _no_purge = EXPIRED_RECORDS.read().await;
    let idem = Arc::new(engine(&store, policy()));
    let consumer = Arc::new(unique_consumer("c09l"));
    let races: Vec<_> = (0..8)
        .map(|k| {
            let (idem, consumer) = (Arc::clone(&idem), Arc::clone(&consumer));
            tokio::spawn(async move {
                let req = Arc::new(request(&consumer, &format!("k{k}"), b"{}"));
                let holder = acquire(&idem, &req).await;
                tokio::time::sleep(LEASE + Duration::from_millis(50)).await;
                let barrier = Arc::new(tokio::sync::Barrier::new(TAKERS + 1));
                let takers: Vec<_> = (0..TAKERS)
                    .map(|_| {
                        let (idem, req, barrier) =
                            (Arc::clone(&idem), Arc::clone(&req), Arc::clone(&barrier));
                        tokio::spawn(async move {
                            barrier.wait().await;
                            idem.begin(&req).await.expect("begin")
                        })
                    })
                    .collect();
                barrier.wait().await;
                let completed = idem.complete(holder, charge("late")).await;
                let mut acquired = 0;
                for taker in takers {
                    match taker.await.expect("task") {
                        Begin::Acquired(lease) => {
                            assert!(matches!(lease.acquired, Acquire::TakeOver { .. }));
                            acquired += 1;
                        }
                        Begin::Replay(r) => assert_eq!(r, charge("late")),
                        Begin::InFlight { .. } => {}
                        Begin::Mismatch => panic!("same request, no mismatch"),
                    }
                }
                match completed {
                    Ok(_) => {
                        assert_eq!(acquired, 0, "a completed record was taken over");
                        assert_eq!(
                            idem.begin(&req).await.expect("begin"),
                            Begin::Replay(charge("late"))
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
pub async fn c09_renew_keeps_a_long_handler_lease<S: Store + 'static>(store: Arc<S>) {
    let idem = engine(&store, policy());
    let req = request(&unique_consumer("c09r"), "k", b"{}");
    let started = Instant::now();
    let outcome = idem
        .run(&req, |mut ctx| {
            let idem = &idem;
            let req = &req;
            async move {
                for _ in 0..4 {
                    tokio::time::sleep(LEASE / 2).await;
                    let before = ctx.lease().lease_until;
                    ctx.renew().await?;
                    assert!(ctx.lease().lease_until >= before);
                    assert!(matches!(idem.begin(req).await?, Begin::InFlight { .. }));
                }
                Ok::<_, Error>(charge("long"))
            }
        })
        .await
        .expect("run");
    assert!(started.elapsed() >= LEASE * 2);
    assert_eq!(outcome, Outcome::Executed(charge("long")));
    assert_eq!(
        idem.begin(&req).await.expect("begin"),
        Begin::Replay(charge("long"))
    );
}

/// C10: after the retention the key is new again, even with another body; before it, a replay.
pub async fn c10_retention_passed_is_treated_as_new<S: Store + 'static>(store: Arc<S>) {
    let _no_purge = EXPIRED_RECORDS.read().await;
    let idem = engine(&store, policy().retention(SHORT_RETENTION));
    let consumer = unique_consumer("c10");
    let same = request(&consumer, "k", b"{\"amount\":1}");
    let lease = acquire(&idem, &same).await;
    idem.complete(lease, charge("old")).await.expect("complete");
    assert_eq!(
        idem.begin(&same).await.expect("begin"),
        Begin::Replay(charge("old"))
    );
    let other_key = request(&consumer, "k2", b"{\"amount\":1}");
    let lease = acquire(&idem, &other_key).await;
    idem.complete(lease, charge("old2"))
        .await
        .expect("complete");

    tokio::time::sleep(SHORT_RETENTION + Duration::from_millis(100)).await;
    let again = acquire(&idem, &same).await;
    assert!(
        matches!(again.acquired, Acquire::StartOver { .. }),
        "{:?}",
        again.acquired
    );
    idem.complete(again, charge("new")).await.expect("complete");
    assert_eq!(
        idem.begin(&same).await.expect("begin"),
        Begin::Replay(charge("new"))
    );
    let reused = request(&consumer, "k2", b"{\"amount\":2}");
    assert!(matches!(
        acquire(&idem, &reused).await.acquired,
        Acquire::StartOver { .. }
    ));
}

/// C10: purge deletes expired records (completed past retention, orphans past the lease), at
/// most `limit` per call, and never a live one.
pub async fn c10_purge_deletes_only_expired_records_in_batches<S: Store + 'static>(store: Arc<S>) {
    let _exclusive = EXPIRED_RECORDS.write().await;
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
        expiring.push(req.id);
    }
    for i in 0..2 {
        let req = request(&consumer, &format!("orphan-{i}"), b"{}");
        let _abandoned = acquire(&short, &req).await;
        expiring.push(req.id);
    }
    let mut live = Vec::new();
    for i in 0..2 {
        let req = request(&consumer, &format!("live-{i}"), b"{}");
        let lease = acquire(&long, &req).await;
        long.complete(lease, charge("long"))
            .await
            .expect("complete");
        live.push(req.id);
    }
    let running = request(&consumer, "running", b"{}");
    let _running = acquire(&long, &running).await;
    live.push(running.id);

    tokio::time::sleep(SHORT_RETENTION + Duration::from_millis(100)).await;
    let first = store.purge_expired(2).await.expect("purge");
    assert_eq!(first, 2, "a batch is full while expired records remain");
    let mut rounds = 0;
    loop {
        let mut left = 0;
        for id in &expiring {
            left += usize::from(store.lookup(id).await.expect("lookup").is_some());
        }
        if left == 0 {
            break;
        }
        let purged = store.purge_expired(2).await.expect("purge");
        assert!(purged <= 2, "purged {purged} with a limit of 2");
        assert!(purged > 0, "{left} expired records left but nothing purged");
        rounds += 1;
        assert!(rounds < 100_000, "purge does not converge");
    }
    for id in &live {
        assert!(
            store.lookup(id).await.expect("lookup").is_some(),
            "live record {id:?} was purged"
        );
    }
}

/// C12: a body over the limit is a typed error (413) and nothing is written; at the limit it
/// is accepted.
pub async fn c12_oversized_body_is_rejected_and_nothing_is_written<S: Store + 'static>(
    store: Arc<S>,
) {
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
    assert_eq!(err.http_status(), 413);
    let id = RecordId::new(
        Scope::new(&consumer, "POST /charges").expect("scope"),
        crate::IdempotencyKey::new("k").expect("key"),
    );
    assert_eq!(store.lookup(&id).await.expect("lookup"), None);
    let at_limit = idem
        .request(&consumer, "POST", "/charges")
        .key(Some("k"))
        .body(&big[..limit])
        .build()
        .expect("at the limit");
    assert_eq!(acquire(&idem, &at_limit).await.acquired, Acquire::Fresh);
}

/// C12: a stored record that does not decode is a typed error on begin, run and lookup; it is
/// never treated as absent, so the handler never runs a second time.
pub async fn c12_corrupt_record_is_a_typed_error<S, C, Fut>(store: Arc<S>, corrupt: C)
where
    S: Store + 'static,
    C: FnOnce(Arc<S>, RecordId) -> Fut,
    Fut: Future<Output = ()>,
{
    let idem = engine(&store, policy());
    let req = request(&unique_consumer("c12c"), "k", b"{}");
    let lease = acquire(&idem, &req).await;
    idem.complete(lease, charge("stored"))
        .await
        .expect("complete");
    corrupt(Arc::clone(&store), req.id.clone()).await;

    assert!(matches!(
        idem.begin(&req).await,
        Err(Error::CorruptRecord(_))
    ));
    assert!(matches!(
        store.lookup(&req.id).await,
        Err(Error::CorruptRecord(_))
    ));
    let ran = AtomicUsize::new(0);
    let outcome = idem
        .run(&req, |_| async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(charge("again"))
        })
        .await;
    assert!(
        matches!(outcome, Err(RunError::Idem(Error::CorruptRecord(_)))),
        "{outcome:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}
