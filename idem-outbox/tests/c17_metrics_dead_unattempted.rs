//! The feature `metrics` and deliveries that end dead without an attempt (a recorder of this
//! test binary's own; SQLite).

mod support;

use idem_outbox::metrics::ATTEMPTS_TOTAL;
use idem_outbox::OutboxEventKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use support::*;

/// C17 + docs/outbox.md ("With the feature `metrics`: attempts by outcome"): the outcome
/// `dead` is the metrics' signal of a dead delivery. A delivery ended dead without an attempt
/// (its endpoint deleted: `DeadReason::NoEndpoint`; an undecodable row:
/// `DeadReason::Undecodable`) is counted there as the observer sees it: each delivery's end
/// reported once, everywhere it is reported.
#[test]
fn c17_a_delivery_dead_without_an_attempt_is_counted_dead_in_the_metrics() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).expect("the only recorder of this test binary");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("a directory");
        let receiver = Receiver::start().await;
        let (store, outbox, _id) =
            sqlite_with_one_message(dir.path(), "retired", &receiver.url()).await;
        store
            .try_call(|db| {
                db.execute(
                    "DELETE FROM idem_outbox_endpoints WHERE name = 'retired'",
                    [],
                )
            })
            .await
            .expect("deleted");
        let seen = std::sync::Arc::clone(&events);
        let dispatcher = outbox
            .dispatcher()
            .allow_loopback(true)
            .on_event(move |event| seen.lock().expect("events").push(event.kind.clone()));
        dispatcher.dispatch_due().await.expect("dispatched");
    });
    let observed = events.lock().expect("events").clone();
    assert!(
        observed
            .iter()
            .any(|kind| matches!(kind, OutboxEventKind::Dead(_))),
        "the observer saw it dead: {observed:?}"
    );
    let mut dead = 0;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let outcome_dead = key
            .key()
            .labels()
            .any(|l| l.key() == "outcome" && l.value() == "dead");
        if key.key().name() == ATTEMPTS_TOTAL && outcome_dead {
            if let DebugValue::Counter(n) = value {
                dead += n;
            }
        }
    }
    assert_eq!(
        dead, 1,
        "the observer saw {observed:?}; the metrics counted {dead} dead"
    );
}
