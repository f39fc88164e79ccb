//! The feature `metrics`: attempts by endpoint and outcome, their durations, and the age of the
//! oldest pending delivery, through the `metrics` facade (a recorder of this test binary's
//! own; PostgreSQL at `IDEM_PG_URL`).

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use idem_outbox::metrics::{ATTEMPTS_TOTAL, ATTEMPT_DURATION, OLDEST_PENDING_AGE};
use idem_outbox::{Message, PgOutbox};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::*;

/// What the recorder saw: counters summed over snapshots (a snapshot resets them), histogram
/// values appended, each gauge's values in order (a gauge not set since the previous
/// snapshot reads 0).
#[derive(Debug, Default)]
struct Seen {
    counters: HashMap<(String, Vec<(String, String)>), u64>,
    histograms: HashMap<String, Vec<f64>>,
    gauges: HashMap<String, Vec<f64>>,
}

impl Seen {
    fn take(&mut self, snapshotter: &Snapshotter) {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let name = key.key().name().to_owned();
            let mut labels: Vec<(String, String)> = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            match value {
                DebugValue::Counter(n) => *self.counters.entry((name, labels)).or_default() += n,
                DebugValue::Histogram(values) => self
                    .histograms
                    .entry(name)
                    .or_default()
                    .extend(values.into_iter().map(|v| v.into_inner())),
                DebugValue::Gauge(value) => {
                    self.gauges
                        .entry(name)
                        .or_default()
                        .push(value.into_inner());
                }
            }
        }
    }

    fn attempts(&self, endpoint: &str, outcome: &str) -> u64 {
        let labels = vec![
            ("endpoint".to_owned(), endpoint.to_owned()),
            ("outcome".to_owned(), outcome.to_owned()),
        ];
        self.counters
            .get(&(ATTEMPTS_TOTAL.to_owned(), labels))
            .copied()
            .unwrap_or(0)
    }
}

async fn enqueue(store: &idem_postgres::PgStore, outbox: &PgOutbox, endpoint: &str) {
    let mut tx = store.pool().begin().await.expect("a transaction");
    let message = Message::bytes("text/plain", "paid").to(endpoint);
    outbox.enqueue(&mut tx, &message).await.expect("enqueued");
    tx.commit().await.expect("committed");
}

#[test]
fn c17_metrics_count_attempts_by_outcome_and_gauge_the_oldest_pending_age() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).expect("the only recorder of this test binary");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let mut seen = Seen::default();
    runtime.block_on(async {
        let url = fresh_database().await;
        let (store, outbox) = pg_outbox(&url).await;
        // "merchant" answers 500, then 200 after the schedule's 400 ms; "gone" answers 410.
        let merchant = Receiver::start().await;
        merchant.plan(|plan| plan.statuses.push_back(500));
        let gone = Receiver::start().await;
        gone.plan(|plan| plan.statuses.push_back(410));
        let schedule = || quick(3, Duration::from_millis(400));
        outbox
            .register(&endpoint("merchant", &merchant.url(), schedule()))
            .await
            .expect("registered");
        outbox
            .register(&endpoint("gone", &gone.url(), schedule()))
            .await
            .expect("registered");
        // Pending for 300 ms before any dispatcher runs.
        enqueue(&store, &outbox, "merchant").await;
        enqueue(&store, &outbox, "gone").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let dispatching = outbox
            .dispatcher()
            .allow_loopback(true)
            .poll_interval(Duration::from_millis(50))
            .start()
            .expect("started");
        // A snapshot resets the gauge: one every three polls reads the age last set.
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(150)).await;
            seen.take(&snapshotter);
            let drained = seen
                .gauges
                .get(OLDEST_PENDING_AGE)
                .and_then(|ages| ages.last())
                .is_some_and(|age| *age == 0.0);
            if seen.attempts("merchant", "delivered") == 1 && drained {
                break;
            }
        }
        dispatching.stop().await;
    });
    assert_eq!(
        (
            seen.attempts("merchant", "retrying"),
            seen.attempts("merchant", "delivered"),
            seen.attempts("gone", "dead"),
        ),
        (1, 1, 1),
        "attempts by endpoint and outcome: {seen:#?}"
    );
    assert_eq!(
        seen.histograms.get(ATTEMPT_DURATION).map(Vec::len),
        Some(3),
        "one duration per attempt: {seen:#?}"
    );
    let ages = seen
        .gauges
        .get(OLDEST_PENDING_AGE)
        .cloned()
        .unwrap_or_default();
    assert!(
        ages.first().is_some_and(|age| *age >= 0.3),
        "the first reading: the oldest delivery waited 300 ms or more: {ages:?}"
    );
    assert!(
        ages.iter().any(|age| *age >= 0.4),
        "still pending while the retry waits its 400 ms: {ages:?}"
    );
    assert_eq!(
        ages.last(),
        Some(&0.0),
        "nothing pending at the end: {ages:?}"
    );
}
