//! The inbox under attack (docs/inbox.md): each event processed once under slow, blocking,
//! failing and panicking handlers, dropped callers, acknowledgements that were never committed,
//! and what each receipt tells the sender.

use idem_core::store::Deadline;
use idem_core::{Idempotency, MemoryStore, Policy, Store};
use idem_inbox::{Ack, Delivery, Inbox, MemoryAudit, Receipt};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::timeout;

const LIMIT: Duration = Duration::from_secs(20);

fn inbox_with(policy: Policy) -> Inbox<MemoryStore> {
    let idem = Idempotency::with_policy(MemoryStore::new(), policy).expect("policy");
    Inbox::new(idem).with_audit(Arc::new(MemoryAudit::default()))
}

fn short_lease() -> Inbox<MemoryStore> {
    inbox_with(Policy::default().lease(Duration::from_millis(200)))
}

fn event(inbox: &Inbox<MemoryStore>, id: &[u8], body: &'static [u8]) -> idem_inbox::Event {
    inbox
        .event(&Delivery::trusted("stripe", body), id)
        .expect("event")
}

async fn done(
    inbox: &Inbox<MemoryStore>,
    ev: &idem_inbox::Event,
    runs: &Arc<AtomicUsize>,
) -> Receipt {
    let runs = Arc::clone(runs);
    inbox
        .receive(ev, move |_ctx| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(Ack::Done)
        })
        .await
        .expect("store answers")
}

/// A receipt that says "acknowledged" must be a 2xx, and vice versa.
fn assert_consistent(receipt: &Receipt) {
    let status = receipt.to_http().status;
    assert_eq!(
        receipt.is_acknowledged(),
        (200..300).contains(&status),
        "is_acknowledged() and the HTTP status disagree: {receipt:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Ack::Written with a completion that is not in the store.
// ---------------------------------------------------------------------------------------------

/// The handler says it wrote the acknowledgement in its transaction but did not (its
/// transaction rolled back, or a bug). On SQL stores that means nothing committed: the event
/// must stay retryable (docs/inbox.md: "a crash before the commit leaves neither, and the
/// redelivery runs once"), and it must never be reported as processed / acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c06_written_ack_never_stored_is_not_processed_and_stays_retryable() {
    timeout(LIMIT, async {
        let inbox = short_lease();
        let ev = event(&inbox, b"evt_unwritten", br#"{"id":"evt_unwritten"}"#);
        let first = inbox
            .receive(&ev, |ctx| async move {
                // The transaction that would have written it rolled back.
                Ok::<_, std::io::Error>(Ack::Written(ctx.completion()))
            })
            .await
            .expect("store answers");
        assert_consistent(&first);
        assert!(
            matches!(first, Receipt::Failed(_)),
            "an acknowledgement that was never written is not a processed event: {first:?}"
        );
        // The sender delivers again: the handler must run (nothing was committed).
        let runs = Arc::new(AtomicUsize::new(0));
        let again = done(&inbox, &ev, &runs).await;
        assert_consistent(&again);
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "the redelivery runs it: {again:?}"
        );
        assert!(matches!(again, Receipt::Processed(_)), "{again:?}");
    })
    .await
    .expect("bounded");
}

/// Same, with the completion of ANOTHER event (a handler mixing up contexts). The event whose
/// handler returned it was not acknowledged by anything: it must not be reported processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c06_written_ack_of_another_event_is_not_processed() {
    timeout(LIMIT, async {
        let inbox = short_lease();
        let a = event(&inbox, b"evt_a", br#"{"id":"evt_a"}"#);
        let b = event(&inbox, b"evt_b", br#"{"id":"evt_b"}"#);
        // B processed normally first; keep a completion of B's lease around.
        let stolen = Arc::new(std::sync::Mutex::new(None));
        let s = Arc::clone(&stolen);
        let rb = inbox
            .receive(&b, move |ctx| async move {
                let completion = ctx.completion();
                ctx.idem()
                    .store()
                    .complete(&completion, Deadline::default())
                    .await
                    .expect("write B");
                *s.lock().expect("lock") = Some(completion.clone());
                Ok::<_, std::io::Error>(Ack::Written(completion))
            })
            .await
            .expect("store answers");
        assert!(matches!(rb, Receipt::Processed(_)));
        let b_completion = stolen.lock().expect("lock").clone().expect("completion");
        let ra = inbox
            .receive(&a, move |_ctx| async move {
                Ok::<_, std::io::Error>(Ack::Written(b_completion))
            })
            .await
            .expect("store answers");
        assert_consistent(&ra);
        assert!(
            !ra.is_acknowledged(),
            "A was acknowledged by nothing: {ra:?}"
        );
        let runs = Arc::new(AtomicUsize::new(0));
        let again = done(&inbox, &a, &runs).await;
        assert_consistent(&again);
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "A's redelivery runs it: {again:?}"
        );
    })
    .await
    .expect("bounded");
}

// ---------------------------------------------------------------------------------------------
// Once under concurrency, slow handlers, panics, failures.
// ---------------------------------------------------------------------------------------------

/// A handler 5x slower than the 200 ms lease, with redeliveries every 10 ms from several tasks:
/// the heartbeat keeps the lease, exactly one run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c04_slow_async_handler_runs_once_under_a_200ms_lease() {
    timeout(LIMIT, async {
        let inbox = short_lease();
        let ev = event(&inbox, b"evt_slow", br#"{"id":"evt_slow"}"#);
        let runs = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (inbox, ev, runs) = (inbox.clone(), ev.clone(), Arc::clone(&runs));
            tasks.push(tokio::spawn(async move {
                loop {
                    let runs = Arc::clone(&runs);
                    let r = inbox
                        .receive(&ev, move |_ctx| async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(1000)).await;
                            Ok::<_, std::io::Error>(Ack::Done)
                        })
                        .await
                        .expect("store answers");
                    if r.is_acknowledged() {
                        return r;
                    }
                    assert!(matches!(r, Receipt::InProgress { .. }), "{r:?}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }));
        }
        for t in tasks {
            t.await.expect("join");
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    })
    .await
    .expect("bounded");
}

/// A handler that BLOCKS its worker thread for 3x the lease (a sync DB driver, say) while
/// redeliveries arrive on the other workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c04_blocking_handler_runs_once_under_a_200ms_lease() {
    timeout(LIMIT, async {
        let inbox = short_lease();
        let ev = event(&inbox, b"evt_block", br#"{"id":"evt_block"}"#);
        let runs = Arc::new(AtomicUsize::new(0));
        let started = Arc::new(Notify::new());
        let first = {
            let (inbox, ev, runs, started) = (
                inbox.clone(),
                ev.clone(),
                Arc::clone(&runs),
                Arc::clone(&started),
            );
            tokio::spawn(async move {
                inbox
                    .receive(&ev, move |_ctx| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        started.notify_one();
                        std::thread::sleep(Duration::from_millis(600));
                        Ok::<_, std::io::Error>(Ack::Done)
                    })
                    .await
                    .expect("store answers")
            })
        };
        started.notified().await;
        for _ in 0..60 {
            let r = done(&inbox, &ev, &runs).await;
            if r.is_acknowledged() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        first.await.expect("join");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    })
    .await
    .expect("bounded");
}

/// Failures and panics interleaved with concurrent deliveries: the event ends processed, by
/// exactly one successful run; no failure is ever acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c04_failures_panics_then_success_under_concurrency_one_success() {
    timeout(LIMIT, async {
        let inbox = short_lease();
        let ev = event(&inbox, b"evt_flaky", br#"{"id":"evt_flaky"}"#);
        let attempts = Arc::new(AtomicUsize::new(0));
        let successes = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let (inbox, ev, attempts, successes) = (
                inbox.clone(),
                ev.clone(),
                Arc::clone(&attempts),
                Arc::clone(&successes),
            );
            tasks.push(tokio::spawn(async move {
                loop {
                    let (a, s) = (Arc::clone(&attempts), Arc::clone(&successes));
                    let r = inbox
                        .receive(&ev, move |_ctx| async move {
                            let n = a.fetch_add(1, Ordering::SeqCst);
                            tokio::task::yield_now().await;
                            match n {
                                0..=4 => Err::<Ack, _>(format!("fail {n}")),
                                5..=7 => panic!("boom {n}"),
                                _ => {
                                    s.fetch_add(1, Ordering::SeqCst);
                                    Ok(Ack::Done)
                                }
                            }
                        })
                        .await
                        .expect("store answers");
                    assert_consistent(&r);
                    if r.is_acknowledged() {
                        return;
                    }
                    assert!(
                        matches!(r, Receipt::InProgress { .. } | Receipt::Failed(_)),
                        "{r:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }));
        }
        for t in tasks {
            t.await.expect("join");
        }
        assert_eq!(successes.load(Ordering::SeqCst), 1);
    })
    .await
    .expect("bounded");
}

/// A written acknowledgement done right, then an error returned after the commit: the record
/// is completed, so the event is processed (the give-back is fenced out and the stored
/// acknowledgement answered) and the redelivery is a duplicate (no second run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c04_error_after_commit_never_runs_twice() {
    timeout(LIMIT, async {
        let inbox = short_lease();
        let ev = event(&inbox, b"evt_late_err", br#"{"id":"evt_late_err"}"#);
        let r = inbox
            .receive(&ev, |ctx| async move {
                let c = ctx.completion();
                ctx.idem()
                    .store()
                    .complete(&c, Deadline::default())
                    .await
                    .expect("write");
                Err::<Ack, _>("failed after the commit")
            })
            .await
            .expect("store answers");
        assert!(matches!(r, Receipt::Processed(_)), "{r:?}");
        let runs = Arc::new(AtomicUsize::new(0));
        let again = done(&inbox, &ev, &runs).await;
        assert!(matches!(again, Receipt::Duplicate(_)));
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    })
    .await
    .expect("bounded");
}

/// The caller's future dropped mid-handler (the sender's connection timed out): the execution
/// is detached, finishes once, and the redelivery is a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c04_dropped_caller_runs_once() {
    timeout(LIMIT, async {
        let inbox = short_lease();
        let ev = event(&inbox, b"evt_drop", br#"{"id":"evt_drop"}"#);
        let runs = Arc::new(AtomicUsize::new(0));
        let (started, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let task = {
            let (inbox, ev, runs, started, go) = (
                inbox.clone(),
                ev.clone(),
                Arc::clone(&runs),
                Arc::clone(&started),
                Arc::clone(&go),
            );
            tokio::spawn(async move {
                inbox
                    .receive(&ev, move |_ctx| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        started.notify_one();
                        go.notified().await;
                        Ok::<_, std::io::Error>(Ack::Done)
                    })
                    .await
            })
        };
        started.notified().await;
        task.abort();
        let _ = task.await;
        go.notify_one();
        inbox.idem().drain().await;
        let again = done(&inbox, &ev, &runs).await;
        assert!(matches!(again, Receipt::Duplicate(_)), "{again:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    })
    .await
    .expect("bounded");
}

// ---------------------------------------------------------------------------------------------
// The inbox's records never share a scope with HTTP requests.
// ---------------------------------------------------------------------------------------------

/// On an engine shared with the HTTP layer, a request of an API consumer whose id equals a
/// source name, with the (valid, custom) method EVENT on /inbox and the event's key, must not
/// occupy the event's record: the inbox's route is not a path, so no HTTP request reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c02_an_http_request_cannot_occupy_an_inbox_event_record() {
    timeout(LIMIT, async {
        let inbox = short_lease();
        let key = blake3::hash(b"evt_squat").to_hex().to_string();
        let squat = inbox
            .idem()
            .request("stripe", "EVENT", "/inbox")
            .key(Some(key.as_str()))
            .body(b"anything")
            .build()
            .expect("a valid HTTP request");
        let _ = inbox
            .idem()
            .run(&squat, |_ctx| async {
                Ok::<_, idem_core::Failure<std::io::Error>>(idem_core::StoredResponse::new(
                    200, "ok",
                ))
            })
            .await
            .expect("run");
        let ev = event(&inbox, b"evt_squat", br#"{"id":"evt_squat"}"#);
        let runs = Arc::new(AtomicUsize::new(0));
        let r = done(&inbox, &ev, &runs).await;
        assert!(matches!(r, Receipt::Processed(_)), "{r:?}");
    })
    .await
    .expect("bounded");
}
