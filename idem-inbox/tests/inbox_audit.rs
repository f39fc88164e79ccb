//! The inbox's audit trail under concurrency and failures (docs/inbox.md, "The audit trail"):
//! an event processed out of the caller's sight ends processed, counts are exact, ranges and
//! purges are bounded right.

use idem_core::store::Deadline;
use idem_core::{Idempotency, ManualClock, MemoryStore, Policy, Store, Timestamp};
use idem_inbox::{
    Ack, Audit, AuditEntry, AuditOutcome, Delivery, Event, Inbox, MemoryAudit, Receipt,
};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio::time::timeout;

const LIMIT: Duration = Duration::from_secs(20);

fn inbox() -> (Inbox<MemoryStore>, Arc<MemoryAudit>) {
    let audit = Arc::new(MemoryAudit::default());
    let idem = Idempotency::with_policy(
        MemoryStore::new(),
        Policy::default().lease(Duration::from_millis(200)),
    )
    .expect("policy");
    (Inbox::new(idem).with_audit(audit.clone()), audit)
}

fn event(inbox: &Inbox<MemoryStore>, source: &str, id: &[u8], body: &'static [u8]) -> Event {
    let source: &'static str = Box::leak(source.to_owned().into_boxed_str());
    inbox
        .event(&Delivery::trusted(source, body), id)
        .expect("event")
}

async fn done(inbox: &Inbox<MemoryStore>, ev: &Event) -> Receipt {
    inbox
        .receive(ev, |_ctx| async { Ok::<_, std::io::Error>(Ack::Done) })
        .await
        .expect("store answers")
}

async fn all(audit: &MemoryAudit, source: &str) -> Vec<AuditEntry> {
    audit
        .query(
            source,
            Timestamp::from_millis(0),
            Timestamp::from_millis(u64::MAX),
            100_000,
        )
        .await
        .expect("query")
}

// ---------------------------------------------------------------------------------------------
// An event processed where no caller saw it (a dropped caller, an error after the commit, a
// lost audit write): the next delivery, a duplicate, records it processed.
// ---------------------------------------------------------------------------------------------

/// The sender's connection times out while the handler runs (hyper drops the service future):
/// the execution is detached and processes the event, while the audit's own write ran in the
/// dropped future. The redelivery, a duplicate, records the event processed (as after a crash
/// between the commit and the 200, docs/inbox.md).
/// A [`MemoryAudit`] that fails, freezes, takes its time or panics on demand, counting the
/// writes a freeze holds.
#[derive(Default)]
struct Faulty {
    inner: MemoryAudit,
    /// The next delivery write fails (1), once.
    fail_next: AtomicUsize,
    /// What a delivery write takes, in ms (so that it goes on past the answer's 20 ms).
    delivered_ms: AtomicUsize,
    /// What an outcome write takes, in ms.
    settled_ms: AtomicUsize,
    /// Writes of a delivery panic after their time.
    panics: AtomicBool,
    /// Delivery writes wait until [`thawed`](Self::thawed): a frozen database.
    frozen_deliveries: AtomicBool,
    /// Writes of how a delivery ended wait alike.
    frozen_outcomes: AtomicBool,
    thawed: Notify,
    /// The writes a freeze holds now, and at most so far.
    waiting: Arc<AtomicUsize>,
    peak: AtomicUsize,
}

impl Faulty {
    /// A trail whose writes take `delivered_ms` and `settled_ms`.
    fn slow(delivered_ms: usize, settled_ms: usize) -> Self {
        Self {
            delivered_ms: AtomicUsize::new(delivered_ms),
            settled_ms: AtomicUsize::new(settled_ms),
            ..Self::default()
        }
    }

    /// Freezes while `frozen`, then takes `ms` of time.
    async fn hold(&self, frozen: &AtomicBool, ms: &AtomicUsize) {
        self.freeze_if(frozen).await;
        let ms = ms.load(Ordering::SeqCst) as u64;
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }

    async fn freeze_if(&self, frozen: &AtomicBool) {
        if !frozen.load(Ordering::SeqCst) {
            return;
        }
        let now = self.waiting.fetch_add(1, Ordering::SeqCst) + 1;
        let _waiting = Waiting(Arc::clone(&self.waiting));
        self.peak.fetch_max(now, Ordering::SeqCst);
        loop {
            let thawed = self.thawed.notified();
            if !frozen.load(Ordering::SeqCst) {
                return;
            }
            thawed.await;
        }
    }

    /// Lets the writes `frozen` holds go on.
    fn thaw(&self, frozen: &AtomicBool) {
        frozen.store(false, Ordering::SeqCst);
        self.thawed.notify_waiters();
    }
}

/// One write a freeze of [`Faulty`] holds, until it goes on or is dropped.
struct Waiting(Arc<AtomicUsize>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[idem_core::store::async_trait]
impl Audit for Faulty {
    async fn delivered(&self, s: &str, id: &[u8], at: Timestamp) -> Result<(), idem_core::Error> {
        self.hold(&self.frozen_deliveries, &self.delivered_ms).await;
        assert!(!self.panics.load(Ordering::SeqCst), "the audit panicked");
        if self.fail_next.swap(0, Ordering::SeqCst) == 1 {
            return Err(idem_core::Error::store(
                "audit",
                idem_core::StoreErrorKind::Unavailable,
                "blip",
            ));
        }
        self.inner.delivered(s, id, at).await
    }
    async fn settled(
        &self,
        s: &str,
        id: &[u8],
        o: AuditOutcome,
        at: Timestamp,
    ) -> Result<(), idem_core::Error> {
        self.hold(&self.frozen_outcomes, &self.settled_ms).await;
        self.inner.settled(s, id, o, at).await
    }
    async fn conflicted(&self, s: &str, id: &[u8], at: Timestamp) -> Result<(), idem_core::Error> {
        self.hold(&self.frozen_outcomes, &self.settled_ms).await;
        self.inner.conflicted(s, id, at).await
    }
    async fn query(
        &self,
        s: &str,
        f: Timestamp,
        t: Timestamp,
        l: usize,
    ) -> Result<Vec<AuditEntry>, idem_core::Error> {
        self.inner.query(s, f, t, l).await
    }
    async fn purge(&self, b: Timestamp, l: usize) -> Result<usize, idem_core::Error> {
        self.inner.purge(b, l).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c08_audit_event_processed_after_the_caller_went_away_ends_processed() {
    timeout(LIMIT, async {
        let (inbox, audit) = inbox();
        let ev = event(&inbox, "stripe", b"evt_timeout", br#"{"id":"evt_timeout"}"#);
        let (started, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let task = {
            let (inbox, ev, started, go) = (inbox.clone(), ev.clone(), started.clone(), go.clone());
            tokio::spawn(async move {
                inbox
                    .receive(&ev, move |_ctx| async move {
                        started.notify_one();
                        go.notified().await;
                        Ok::<_, std::io::Error>(Ack::Done)
                    })
                    .await
            })
        };
        started.notified().await;
        task.abort(); // the sender hung up
        let _ = task.await;
        go.notify_one();
        inbox.idem().drain().await;
        let again = done(&inbox, &ev).await;
        assert!(matches!(again, Receipt::Duplicate(_)), "{again:?}");
        let entry = &all(&audit, "stripe").await[0];
        assert_eq!(entry.deliveries, 2);
        assert_eq!(
            entry.outcome,
            AuditOutcome::Processed,
            "the event was processed (the sender got a duplicate 200): {entry:?}"
        );
        assert!(entry.processed.is_some(), "{entry:?}");
    })
    .await
    .expect("bounded");
}

/// The handler committed its effect and the acknowledgement, then returned an error (a step
/// after the commit failed, or a COMMIT whose answer was lost). The key's give-back is fenced
/// out by the committed acknowledgement, so the event is processed: the first receipt says so,
/// every later delivery is a duplicate, and the trail says `processed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c08_audit_error_after_commit_then_duplicate_ends_processed() {
    timeout(LIMIT, async {
        let (inbox, audit) = inbox();
        let ev = event(&inbox, "stripe", b"evt_late", br#"{"id":"evt_late"}"#);
        let first = inbox
            .receive(&ev, |ctx| async move {
                let c = ctx.completion();
                ctx.idem()
                    .store()
                    .complete(&c, Deadline::default())
                    .await
                    .expect("committed");
                Err::<Ack, _>("a step after the commit failed")
            })
            .await
            .expect("store answers");
        assert!(matches!(first, Receipt::Processed(_)), "{first:?}");
        let again = done(&inbox, &ev).await;
        assert!(matches!(again, Receipt::Duplicate(_)), "{again:?}");
        let entry = &all(&audit, "stripe").await[0];
        assert_eq!(
            entry.outcome,
            AuditOutcome::Processed,
            "acknowledged as processed to the sender, so processed in the trail: {entry:?}"
        );
    })
    .await
    .expect("bounded");
}

/// The first delivery's `delivered` write was lost (the audit's database blipped: "logged and
/// never fails a delivery"), so `settled` found no row. The redelivery creates the row as a
/// Duplicate and it stays `received`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c08_audit_lost_first_write_then_duplicate_ends_processed() {
    timeout(LIMIT, async {
        let flaky = Arc::new(Faulty {
            fail_next: AtomicUsize::new(1),
            ..Faulty::default()
        });
        let inbox = Inbox::new(Idempotency::new(MemoryStore::new())).with_audit(flaky.clone());
        let ev = event(&inbox, "stripe", b"evt_blip", br#"{"id":"evt_blip"}"#);
        assert!(matches!(done(&inbox, &ev).await, Receipt::Processed(_)));
        assert!(matches!(done(&inbox, &ev).await, Receipt::Duplicate(_)));
        let entries = flaky
            .query(
                "stripe",
                Timestamp::from_millis(0),
                Timestamp::from_millis(u64::MAX),
                10,
            )
            .await
            .expect("query");
        assert_eq!(entries.len(), 1);
        assert_eq!(
            entries[0].outcome,
            AuditOutcome::Processed,
            "{:?}",
            entries[0]
        );
    })
    .await
    .expect("bounded");
}

// ---------------------------------------------------------------------------------------------
// What held.
// ---------------------------------------------------------------------------------------------

/// 400 concurrent deliveries of 20 events (and 40 conflicting ones): exact counts, one outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn audit_counts_are_exact_under_concurrency() {
    timeout(LIMIT, async {
        let (inbox, audit) = inbox();
        let mut tasks = Vec::new();
        for round in 0..20 {
            for n in 0..20u32 {
                let inbox = inbox.clone();
                tasks.push(tokio::spawn(async move {
                    let id = format!("evt_{n}");
                    let body: &'static [u8] = Box::leak(
                        format!(r#"{{"id":"{id}"}}"#)
                            .into_bytes()
                            .into_boxed_slice(),
                    );
                    let ev = event(&inbox, "stripe", id.as_bytes(), body);
                    loop {
                        let r = done(&inbox, &ev).await;
                        if r.is_acknowledged() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    if round < 2 {
                        let bad = event(&inbox, "stripe", id.as_bytes(), b"{\"other\":1}");
                        assert_eq!(done(&inbox, &bad).await, Receipt::Conflict);
                    }
                }));
            }
        }
        for t in tasks {
            t.await.expect("join");
        }
        let entries = all(&audit, "stripe").await;
        assert_eq!(entries.len(), 20);
        for e in &entries {
            assert_eq!(e.outcome, AuditOutcome::Processed);
            assert_eq!(e.conflicts, 2, "{e:?}");
            assert!(e.deliveries >= 22, "{e:?}");
            assert!(e.processed.is_some() && e.first_received <= e.last_received);
        }
    })
    .await
    .expect("bounded");
}

/// `[from, to)`, oldest first, limit, per source; purge by cutoff (exclusive) and batch.
#[tokio::test]
async fn audit_query_range_and_purge_boundaries() {
    let clock = ManualClock::new(Timestamp::from_millis(1_000));
    let audit = Arc::new(MemoryAudit::default());
    let inbox = Inbox::new(Idempotency::new(MemoryStore::new()))
        .with_audit(audit.clone())
        .with_clock(Arc::new(clock.clone()));
    for (i, t) in [1_000u64, 2_000, 3_000].iter().enumerate() {
        clock.set(Timestamp::from_millis(*t));
        let id = format!("evt_{i}");
        let ev = event(&inbox, "stripe", id.as_bytes(), b"{}");
        assert!(matches!(done(&inbox, &ev).await, Receipt::Processed(_)));
        let other = event(&inbox, "stripe2", id.as_bytes(), b"{}");
        assert!(matches!(done(&inbox, &other).await, Receipt::Processed(_)));
    }
    let q = |from: u64, to: u64, limit: usize| {
        let audit = audit.clone();
        async move {
            audit
                .query(
                    "stripe",
                    Timestamp::from_millis(from),
                    Timestamp::from_millis(to),
                    limit,
                )
                .await
                .expect("query")
                .into_iter()
                .map(|e| e.first_received.as_millis())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(q(1_000, 3_000, 10).await, vec![1_000, 2_000]);
    assert_eq!(q(1_001, 3_001, 10).await, vec![2_000, 3_000]);
    assert_eq!(q(0, u64::MAX, 1).await, vec![1_000]);
    assert_eq!(q(3_000, 3_000, 10).await, Vec::<u64>::new());
    assert_eq!(q(3_000, 1_000, 10).await, Vec::<u64>::new());
    // Now 4 000: a retention of 2 000 ms cuts at 2 000, exclusive: only the entries at 1 000.
    clock.set(Timestamp::from_millis(4_000));
    assert_eq!(
        inbox
            .purge_audit(Duration::from_millis(2_000), 1)
            .await
            .expect("purge"),
        1
    );
    assert_eq!(
        inbox
            .purge_audit(Duration::from_millis(2_000), 10)
            .await
            .expect("purge"),
        1
    );
    assert_eq!(
        inbox
            .purge_audit(Duration::from_millis(2_000), 10)
            .await
            .expect("purge"),
        0
    );
    assert_eq!(q(0, u64::MAX, 10).await, vec![2_000, 3_000]);
    assert_eq!(
        inbox.purge_audit(Duration::MAX, 10).await.expect("purge"),
        0
    );
    assert_eq!(
        inbox
            .purge_audit(Duration::from_secs(1), 0)
            .await
            .expect("purge"),
        0
    );
}

/// Failed never overwrites Processed, even when a failed attempt settles after the successful
/// one; a conflict while the first runs is counted and does not change the outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_settling_late_does_not_overwrite_processed() {
    timeout(LIMIT, async {
        let (inbox, audit) = inbox();
        let ev = event(&inbox, "stripe", b"evt_x", b"{\"a\":1}");
        let (started, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let first = {
            let (inbox, ev, started, go) = (inbox.clone(), ev.clone(), started.clone(), go.clone());
            tokio::spawn(async move {
                inbox
                    .receive(&ev, move |_ctx| async move {
                        started.notify_one();
                        go.notified().await;
                        Ok::<_, std::io::Error>(Ack::Done)
                    })
                    .await
                    .expect("answers")
            })
        };
        started.notified().await;
        let bad = event(&inbox, "stripe", b"evt_x", b"{\"a\":2}");
        assert_eq!(done(&inbox, &bad).await, Receipt::Conflict);
        go.notify_one();
        assert!(matches!(first.await.expect("join"), Receipt::Processed(_)));
        audit
            .settled(
                "stripe",
                b"evt_x",
                AuditOutcome::Failed,
                Timestamp::from_millis(u64::MAX),
            )
            .await
            .expect("settle");
        let e = &all(&audit, "stripe").await[0];
        assert_eq!(
            (e.outcome, e.conflicts, e.deliveries),
            (AuditOutcome::Processed, 1, 2)
        );
    })
    .await
    .expect("bounded");
}

/// The store budget in the frozen-audit tests.
const BUDGET: Duration = Duration::from_millis(400);

/// An inbox over `audit` whose engine has [`BUDGET`].
fn budgeted(audit: &Arc<Faulty>) -> Inbox<MemoryStore> {
    let policy = Policy::default().store_timeout(BUDGET);
    let idem = Idempotency::with_policy(MemoryStore::new(), policy).expect("policy");
    Inbox::new(idem).with_audit(audit.clone())
}

/// C5, C13: an audit trail that never answers neither holds nor fails a delivery: its write
/// goes on in the background (given up at the budget), the event is processed at once, and a
/// later delivery, a duplicate, records it processed. (The write came first and spent the
/// budget: the event was store-down while the trail stayed frozen.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_frozen_audit_trail_neither_holds_nor_fails_a_delivery() {
    let audit = Arc::new(Faulty::default());
    audit.frozen_deliveries.store(true, Ordering::SeqCst);
    let inbox = budgeted(&audit);
    let ev = event(&inbox, "stripe", b"evt_frozen", br#"{"id":"evt_frozen"}"#);
    let runs = Arc::new(AtomicUsize::new(0));
    let receive = || {
        let runs = Arc::clone(&runs);
        inbox.receive(&ev, move |_ctx| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(Ack::Done)
        })
    };

    let started = Instant::now();
    let processed = timeout(LIMIT, receive()).await.expect("bounded");
    assert!(
        matches!(processed, Ok(Receipt::Processed(_))),
        "{processed:?}"
    );
    assert!(
        started.elapsed() < BUDGET / 2,
        "answered after {:?}",
        started.elapsed()
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The write is given up at the budget.
    timeout(LIMIT, inbox.drain_audit()).await.expect("drained");

    audit.frozen_deliveries.store(false, Ordering::SeqCst);
    let again = timeout(LIMIT, receive()).await.expect("bounded");
    assert!(matches!(again, Ok(Receipt::Duplicate(_))), "{again:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let entries = all(&audit.inner, "stripe").await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].outcome, AuditOutcome::Processed, "{entries:?}");
}

/// C5, C13: a trail that stops answering after the delivery was recorded holds the processed
/// event's answer 20 ms at most; its write goes on in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_an_audit_trail_frozen_after_the_effect_does_not_hold_the_answer() {
    let audit = Arc::new(Faulty::default());
    audit.frozen_outcomes.store(true, Ordering::SeqCst);
    let inbox = budgeted(&audit);
    let ev = event(&inbox, "stripe", b"evt_late", br#"{"id":"evt_late"}"#);

    let started = Instant::now();
    let handled = timeout(
        LIMIT,
        inbox.receive(&ev, |_ctx| async {
            tokio::time::sleep(BUDGET * 2).await;
            Ok::<_, std::io::Error>(Ack::Done)
        }),
    )
    .await
    .expect("bounded");
    assert!(matches!(handled, Ok(Receipt::Processed(_))), "{handled:?}");
    let took = started.elapsed();
    // The handler's 800 ms, then at most 20 ms for the trail: its write goes on in the
    // background (it held the answer for what the store steps left of the budget, 400 ms).
    assert!(took >= BUDGET * 2, "{took:?}");
    assert!(
        took < BUDGET * 2 + BUDGET * 3 / 4,
        "answered after {took:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Writes that go on past the answer (each holds it 20 ms at most): order, counts, drain.
// ---------------------------------------------------------------------------------------------

/// An inbox over `audit` with a lease the tests' retries outlast.
fn slow_inbox(audit: &Arc<Faulty>) -> Inbox<MemoryStore> {
    let idem = Idempotency::with_policy(
        MemoryStore::new(),
        Policy::default().lease(Duration::from_millis(200)),
    )
    .expect("policy");
    Inbox::new(idem).with_audit(audit.clone())
}

/// 200 concurrent deliveries of one event (and 20 with another payload), every delivery
/// write 60 ms (in the background past 20 ms) and every outcome at once: once drained, the
/// trail counts each delivery and conflict exactly once, and the outcomes landed after their
/// deliveries (an outcome before its row would be lost: the entry would stay `received`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn audit_background_writes_keep_order_and_exact_counts() {
    timeout(LIMIT, async {
        let audit = Arc::new(Faulty::slow(60, 0));
        let inbox = slow_inbox(&audit);
        let mut tasks = Vec::new();
        for n in 0..220u32 {
            let inbox = inbox.clone();
            tasks.push(tokio::spawn(async move {
                let body: &'static [u8] = if n < 200 {
                    br#"{"id":"evt_bg"}"#
                } else {
                    b"{\"other\":1}"
                };
                let ev = event(&inbox, "stripe", b"evt_bg", body);
                let started = Instant::now();
                let r = done(&inbox, &ev).await;
                // Two writes, each 20 ms at most on the answer's path, and a loaded machine.
                assert!(started.elapsed() < Duration::from_millis(500), "{r:?}");
                r
            }));
        }
        let mut processed = 0;
        let mut conflicts = 0;
        for t in tasks {
            match t.await.expect("join") {
                Receipt::Processed(_) => processed += 1,
                Receipt::Conflict => conflicts += 1,
                _ => {}
            }
        }
        assert_eq!(processed, 1);
        inbox.drain_audit().await;
        let entries = all(&audit.inner, "stripe").await;
        let [entry] = entries.as_slice() else {
            panic!("{entries:?}")
        };
        assert_eq!(entry.deliveries, 220, "{entry:?}");
        assert_eq!(entry.conflicts, conflicts, "{entry:?}");
        assert_eq!(entry.outcome, AuditOutcome::Processed, "{entry:?}");
    })
    .await
    .expect("bounded");
}

/// A panic inside an audit write that went on in the background is that task's: the
/// delivery's outcome still follows it, and `drain_audit` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_a_panicking_background_write_neither_hangs_the_drain_nor_the_outcome() {
    timeout(LIMIT, async {
        let audit = Arc::new(Faulty::slow(40, 0));
        audit.panics.store(true, Ordering::SeqCst);
        let inbox = slow_inbox(&audit);
        let ev = event(&inbox, "stripe", b"evt_panic", br#"{"id":"evt_panic"}"#);
        assert!(matches!(done(&inbox, &ev).await, Receipt::Processed(_)));
        timeout(Duration::from_secs(2), inbox.drain_audit())
            .await
            .expect("drained");
        audit.panics.store(false, Ordering::SeqCst);
        assert!(matches!(done(&inbox, &ev).await, Receipt::Duplicate(_)));
        inbox.drain_audit().await;
        let entries = all(&audit.inner, "stripe").await;
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert_eq!(entries[0].outcome, AuditOutcome::Processed, "{entries:?}");
    })
    .await
    .expect("bounded");
}

/// The runtime a delivery was answered on is dropped (a per-request runtime, a test's end)
/// while its writes go on: they are dropped with it, and `drain_audit` on another runtime
/// returns at once rather than waiting for writes that no longer exist.
#[test]
fn audit_writes_of_a_dropped_runtime_do_not_hang_the_drain() {
    let audit = Arc::new(Faulty::slow(10_000, 0));
    let inbox = slow_inbox(&audit);
    let ev = event(&inbox, "stripe", b"evt_rt", br#"{"id":"evt_rt"}"#);
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let r = first.block_on(done(&inbox, &ev));
    assert!(matches!(r, Receipt::Processed(_)), "{r:?}");
    drop(first);
    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    second.block_on(async {
        timeout(Duration::from_secs(2), inbox.drain_audit())
            .await
            .expect("drained");
    });
}

/// A current-thread runtime: writes that go on past the answer land once the caller awaits
/// the drain.
#[tokio::test]
async fn audit_background_writes_land_on_a_current_thread_runtime() {
    timeout(LIMIT, async {
        let audit = Arc::new(Faulty::slow(40, 40));
        let inbox = slow_inbox(&audit);
        let ev = event(&inbox, "stripe", b"evt_ct", br#"{"id":"evt_ct"}"#);
        assert!(matches!(done(&inbox, &ev).await, Receipt::Processed(_)));
        assert!(matches!(done(&inbox, &ev).await, Receipt::Duplicate(_)));
        inbox.drain_audit().await;
        let entries = all(&audit.inner, "stripe").await;
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert_eq!(entries[0].deliveries, 2, "{entries:?}");
        assert_eq!(entries[0].outcome, AuditOutcome::Processed, "{entries:?}");
    })
    .await
    .expect("bounded");
}

/// C13: the engine refuses to run without Tokio's time driver (a configuration error, the
/// handler never run); an audited inbox says the same, never a panic. (An audit write made
/// its time on the answer's path with a Tokio timer, which panics without one.)
#[test]
fn c13_an_audited_inbox_on_a_runtime_without_timers_errs_not_panics() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime without timers");
    let (inbox, _audit) = inbox();
    let ev = event(&inbox, "stripe", b"evt_notime", br#"{"id":"evt_notime"}"#);
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let received = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(inbox.receive(&ev, move |_ctx| async move {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(Ack::Done)
        }))
    }));
    let received = received.expect("an error, not a panic");
    assert!(received.is_err(), "{received:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// C13: the same outside any Tokio runtime (a caller polling on another executor).
#[test]
fn c13_an_audited_inbox_outside_a_tokio_runtime_errs_not_panics() {
    let (inbox, _audit) = inbox();
    let ev = event(&inbox, "stripe", b"evt_nort", br#"{"id":"evt_nort"}"#);
    let received = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        block_on(inbox.receive(&ev, |_ctx| async { Ok::<_, std::io::Error>(Ack::Done) }))
    }));
    let received = received.expect("an error, not a panic");
    assert!(received.is_err(), "{received:?}");
}

/// A minimal executor: polls `future` on this thread until it is ready.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

/// C13: a storm of deliveries against a frozen trail. Each write past its 20 ms goes on in
/// the background until its budget; their number must be bounded too, not grow with the
/// storm's rate times the budget (a write waiting for a pool connection, or queued on
/// SQLite's one writer ahead of the engine's reservations and completions). Before writes
/// went on past the answer, the deliveries in flight bounded them. Every event is still
/// processed at once, and the trail lands what it kept once it thaws.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c13_a_delivery_storm_on_a_frozen_trail_keeps_a_bounded_backlog() {
    const WORKERS: usize = 32;
    const EACH: usize = 80;
    let audit = Arc::new(Faulty::default());
    audit.frozen_deliveries.store(true, Ordering::SeqCst);
    // A budget the storm does not outlast: no write is given up while it lasts.
    let policy = Policy::default().store_timeout(Duration::from_secs(60));
    let idem = Idempotency::with_policy(MemoryStore::new(), policy).expect("policy");
    let inbox = Inbox::new(idem).with_audit(audit.clone());
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let inbox = inbox.clone();
        tasks.push(tokio::spawn(async move {
            for n in 0..EACH {
                let id = format!("evt_{w}_{n}");
                let ev = event(&inbox, "stripe", id.as_bytes(), b"{}");
                let r = done(&inbox, &ev).await;
                assert!(matches!(r, Receipt::Processed(_)), "{r:?}");
            }
        }));
    }
    for t in tasks {
        timeout(LIMIT, t).await.expect("bounded").expect("join");
    }
    let peak = audit.peak.load(Ordering::SeqCst);
    audit.thaw(&audit.frozen_deliveries);
    timeout(LIMIT, inbox.drain_audit()).await.expect("drained");
    assert_eq!(audit.waiting.load(Ordering::SeqCst), 0);
    assert!(
        peak <= 1024 + WORKERS,
        "{peak} writes of {} deliveries waited at once on the frozen trail",
        WORKERS * EACH
    );
    let landed = all(&audit.inner, "stripe").await;
    assert!(!landed.is_empty());
    for entry in &landed {
        assert_eq!(entry.outcome, AuditOutcome::Processed, "{entry:?}");
    }
}
