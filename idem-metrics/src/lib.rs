//! # idem-metrics
//!
//! Metrics through the [`metrics`] facade (in the `idem` facade: feature `metrics`): [`Metrics`], an
//! [`Observer`] of the engine's events (C16). Every metric is derived from the events the engine
//! emits for tracing too, whichever way it is called (closure, transactional closure, guard, the
//! HTTP layer): one vocabulary, [`EventKind::name`], and no store call of its own.
//!
//! Give the observer to the engine; everything else stays the same:
//!
//! ```
//! use idem_metrics::Metrics;
//! use idem_core::{Begin, Idempotency, StoredResponse};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), idem_core::Error> {
//! # let store = idem_core::MemoryStore::new();
//! // `store` is the backend: an idem_sqlite::SqliteStore here, or a PgStore, a RedisStore...
//! let idem = Idempotency::builder(store).observer(Metrics::new("sqlite")).build()?;
//! let request = idem.request("acct_42", "POST", "/v1/charges").key(Some("k-1")).body(b"{}").build()?;
//! let Begin::Acquired(lease) = idem.begin(&request).await? else { unreachable!() };
//! idem.complete(lease, StoredResponse::new(201, "charged")).await?;
//! // Recorded: idem_requests_total{store="sqlite",route="POST /v1/charges",outcome="acquired"} 1,
//! // then outcome="executed" 1, and idem_store_duration_seconds for "reserve" and "complete".
//! # Ok(())
//! # }
//! ```
//!
//! Nothing leaves the process until the application installs a `metrics` recorder, so any
//! exporter works; none is a dependency of idem: `metrics-exporter-prometheus`
//! (`PrometheusBuilder::new().install()`), `metrics-exporter-statsd`,
//! `metrics-exporter-dogstatsd`, or OpenTelemetry through `metrics-exporter-otel` or
//! `metrics-exporter-opentelemetry`. [`Metrics::new`] describes the metrics (units and help
//! texts) to the recorder installed at that time; call [`describe`] again if the recorder is
//! installed later.
//!
//! # Metrics
//!
//! | name | type | unit | labels | counts |
//! |---|---|---|---|---|
//! | `idem_requests_total` | counter | requests | `store`, `route`, `outcome` | the engine's events that answer, acquire or end a request, by name ([`OUTCOMES`]) |
//! | `idem_store_errors_total` | counter | errors | `store`, `operation`, `kind` | store calls that failed, by operation and kind (below) |
//! | `idem_store_duration_seconds` | histogram | seconds | `store`, `operation` | the time of every store call the engine made, failed or not |
//! | `idem_purged_total` | counter | records | `store` | expired records deleted by `purge_expired` |
//! | `idem_reconciliations_total` | counter | decisions | `store`, `route`, `decision` | decisions about records in doubt (below) |
//! | `idem_in_progress` | gauge | reservations | `store`, `route` | reservations this process holds (below) |
//! | `idem_replay_cache_total` | counter | replays | `store`, `result` | replays answered from the engine's `ReplayCache` (`hit`) or by the store (`miss`; all of them without a cache) |
//!
//! Labels:
//!
//! - `store`: the name given to [`Metrics::new`] (`"postgres"`, `"sqlite"`...).
//! - `route`: the record's route, `"METHOD route"` as the request was built
//!   (`"POST /v1/charges"`; with the HTTP layer on axum, the matched template, such as
//!   `"POST /customers/{id}/refunds"`). Routes are templates, so the label is bounded; if yours
//!   are concrete paths carrying ids, turn it off with [`Metrics::with_route_label`]`(false)`,
//!   and the metrics that have it are recorded without it.
//! - `outcome` of `idem_requests_total`: the [`EventKind::name`] of the event, one count per
//!   event, for the kinds in [`OUTCOMES`]: the answers that ran nothing (`rejected`,
//!   `replayed`, `in_flight`, `mismatch`), the acquisitions (`acquired`, `taken_over`,
//!   `started_over`) and the ends of an execution (`executed`, `released`, `lease_lost`,
//!   `outcome_unknown`, `in_doubt`). What each means is on [`EventKind`]. The steps inside an
//!   execution (`completion_landed`, `completion_retried`, `completion_refused`,
//!   `lease_renewed`) are not outcomes and are not counted here: a completion retried or refused
//!   is a failed `complete` in `idem_store_errors_total`, a renewal a `renew` in
//!   `idem_store_duration_seconds`. Neither are `store_call` and `purged`, which have metrics of
//!   their own.
//! - `operation`: the [`Operation::name`] of a `store_call` event: `reserve`, `complete`,
//!   `release`, `renew`, `purge`, `lookup` or `transaction` (a SQL store's transactional
//!   execution), and a reconciliation's `list`, `inspect` and `resolve`. Calls the engine does
//!   not make (`stats`, and the listings of the `idem` command) are not measured.
//! - `kind` of `idem_store_errors_total`: `unavailable` (a call past
//!   [`Policy::store_timeout`](idem_core::Policy::store_timeout) included), `transaction_conflict`,
//!   `misconfigured`, `other` (the [`StoreErrorKind`] of an [`Error::Store`]; a table at another
//!   schema version, [`Error::SchemaVersion`], counts as `misconfigured`), `corrupt_record`
//!   ([`Error::CorruptRecord`]), or `invalid_input` (a store refusing input, rare). A fenced call
//!   (`complete`, `release`, `renew`, `transaction`) refused with [`Error::LeaseLost`] is the
//!   fence working, not an error: it is timed, and its outcome is counted where the engine
//!   reports it.
//!
//! - `decision` of `idem_reconciliations_total`: what a reconciler or an operator decided about a
//!   record in doubt (idem-ops' `reconcile`): `settled` (the real answer stored), `released`
//!   (the key given back), `deferred` (still unknown, checked again later) or `contested` (the
//!   record changed since it was read: nothing written). Records put in doubt are the
//!   `outcome_unknown` outcomes of `idem_requests_total`; those still in doubt are what
//!   `idem stats` counts.
//!
//! No metric carries the idempotency key or the consumer: their number has no bound.
//!
//! # The gauge of reservations in progress
//!
//! The stores cannot count their in-progress records cheaply, so `idem_in_progress` counts the
//! reservations **this process's executions** hold, from the events: a record goes up when it is
//! acquired here (`acquired`, `taken_over`, `started_over`) and down when its execution ends here
//! (`executed`, `released`, `lease_lost`, `outcome_unknown`, `in_doubt`). A record counts once
//! however many events its execution ends with, and, as a store holds at most one live
//! reservation per record (C4), a record reserved again here while an earlier holder of this
//! process still counted it replaces that holder (whose lease had passed or whose record was
//! deleted) rather than counting twice; that holder's late `lease_lost` is then taken as its own
//! end, not the new holder's (the events carry the execution's fencing token). Every
//! acquisition the engine drives ends with exactly one end event, so the gauge is exact for
//! [`Idempotency::run`](idem_core::Idempotency::run), the transactional closure
//! ([`Idempotency::transact`](idem_core::Idempotency::transact), the SQL stores'
//! `run_in_transaction`, whose acquisition is reported while the effect runs) and the HTTP
//! layer, and for guard-style callers that end every lease with `complete`, `release`, or,
//! after committing a completion written in their own transaction (`complete_in`),
//! [`Idempotency::committed`](idem_core::Idempotency::committed).
//!
//! A guard-style caller that drops a lease without any of them emits no end: its record stays
//! in the gauge until this process reserves the same record again (a retry taking the orphan
//! over after its lease, or reserving it afresh once purged), or for the life of the process if
//! none does. The gauge never counts records left in progress
//! by processes that crashed (orphans), nor other processes' executions: sum it over the
//! processes for a fleet. Its value is set, not incremented: give each [`Metrics`] in a process
//! its own store name, or give several engines the same one in an `Arc`.
#![cfg_attr(docsrs, feature(doc_cfg))]

use idem_core::{Error, FencingToken, RecordId, StoreErrorKind};
use idem_core::{Event, EventKind, Observer, Operation};
use metrics::{Label, Unit};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Counter of the engine's outcome events: labels `store`, `route`, `outcome`.
pub const REQUESTS_TOTAL: &str = "idem_requests_total";
/// Counter of failed store calls: labels `store`, `operation`, `kind`.
pub const STORE_ERRORS_TOTAL: &str = "idem_store_errors_total";
/// Histogram of store call durations in seconds: labels `store`, `operation`.
pub const STORE_DURATION_SECONDS: &str = "idem_store_duration_seconds";
/// Counter of expired records deleted by `purge_expired`: label `store`.
pub const PURGED_TOTAL: &str = "idem_purged_total";
/// Counter of requests whose store budget ran out (C13): labels `store`, `operation` (the step
/// that spent the rest).
pub const BUDGET_SPENT_TOTAL: &str = "idem_store_budget_spent_total";
/// Gauge of the reservations this process holds: labels `store`, `route`.
pub const IN_PROGRESS: &str = "idem_in_progress";
/// The counter of decisions about records in doubt, by `decision`.
pub const RECONCILIATIONS_TOTAL: &str = "idem_reconciliations_total";
/// Counter of replays by where they came from: labels `store`, `result` (`hit`: the engine's
/// replay cache, `miss`: the store).
pub const REPLAY_CACHE_TOTAL: &str = "idem_replay_cache_total";

/// The events counted in `idem_requests_total`, whose [`EventKind::name`] is the `outcome`
/// label: the answers that ran nothing, the acquisitions and the ends of an execution, in the
/// order of [`EventKind::ALL`].
///
/// ```
/// use idem_metrics::OUTCOMES;
/// use idem_core::EventKind;
/// assert!(OUTCOMES.contains(&EventKind::Replayed));
/// assert!(!OUTCOMES.contains(&EventKind::StoreCall));
/// ```
pub const OUTCOMES: &[EventKind] = &[
    EventKind::Rejected,
    EventKind::Replayed,
    EventKind::InFlight,
    EventKind::Mismatch,
    EventKind::Acquired,
    EventKind::TakenOver,
    EventKind::StartedOver,
    EventKind::Executed,
    EventKind::Released,
    EventKind::LeaseLost,
    EventKind::OutcomeUnknown,
    EventKind::InDoubt,
];

/// Describes the metrics (unit, help text) to the current recorder. [`Metrics::new`] calls it;
/// call it again if the recorder is installed after the observer was made.
///
/// ```
/// idem_metrics::describe();
/// ```
pub fn describe() {
    let outcomes: Vec<&str> = OUTCOMES.iter().map(|kind| kind.name()).collect();
    metrics::describe_counter!(
        REQUESTS_TOTAL,
        Unit::Count,
        format!(
            "Idempotent requests by outcome (the engine's event names): {}.",
            outcomes.join(", ")
        )
    );
    metrics::describe_counter!(
        STORE_ERRORS_TOTAL,
        Unit::Count,
        "Failed idempotency store calls, by operation and kind."
    );
    metrics::describe_histogram!(
        STORE_DURATION_SECONDS,
        Unit::Seconds,
        "Duration of idempotency store calls, by operation."
    );
    metrics::describe_counter!(
        PURGED_TOTAL,
        Unit::Count,
        "Expired idempotency records deleted."
    );
    metrics::describe_counter!(
        BUDGET_SPENT_TOTAL,
        Unit::Count,
        "Requests whose idempotency store budget ran out, by the step that spent it."
    );
    metrics::describe_counter!(
        RECONCILIATIONS_TOTAL,
        Unit::Count,
        "Decisions about idempotency records in doubt: settled, released, deferred, contested."
    );
    metrics::describe_counter!(
        REPLAY_CACHE_TOTAL,
        Unit::Count,
        "Idempotent replays answered from the process's replay cache (hit) or the store (miss)."
    );
    metrics::describe_gauge!(
        IN_PROGRESS,
        Unit::Count,
        "Idempotency reservations held by this process's executions."
    );
}

/// The [`Observer`] that records the engine's events as metrics: the names, units and labels
/// are in the [module docs](self). Set it on the engine with
/// [`IdempotencyBuilder::observer`](idem_core::IdempotencyBuilder::observer); several engines may
/// share one in an `Arc`.
///
/// ```
/// use idem_metrics::Metrics;
/// use idem_core::{Idempotency, MemoryStore};
/// use std::sync::Arc;
///
/// let metrics = Arc::new(Metrics::new("memory").with_route_label(false));
/// let payments = Idempotency::builder(MemoryStore::new()).observer(Arc::clone(&metrics)).build()?;
/// let refunds = Idempotency::builder(MemoryStore::new()).observer(metrics).build()?;
/// # let _ = (payments, refunds);
/// # Ok::<(), idem_core::Error>(())
/// ```
pub struct Metrics {
    store: &'static str,
    route_label: bool,
    held: Mutex<Held>,
}

/// The records whose reservation this process's executions hold, for the gauge.
#[derive(Default)]
struct Held {
    records: HashMap<RecordId, Holding>,
    /// How many are held per route label (`None` when the route label is off).
    per_route: HashMap<Option<String>, u64>,
}

/// One record held by an execution of this process.
#[derive(Default)]
struct Holding {
    /// The fencing token of the current holder (the latest acquisition here): the end of an
    /// earlier holder it replaced (its lease had passed) is that holder's own, not this one's.
    token: Option<FencingToken>,
}

impl Metrics {
    /// An observer labelling its metrics `store="{store}"`, with the route label on; describes
    /// the metrics to the current recorder.
    ///
    /// ```
    /// let metrics = idem_metrics::Metrics::new("postgres");
    /// assert_eq!(metrics.store(), "postgres");
    /// ```
    pub fn new(store: &'static str) -> Self {
        describe();
        Self {
            store,
            route_label: true,
            held: Mutex::new(Held::default()),
        }
    }

    /// Whether the metrics that have a `route` label carry it (on by default). Turn it off when
    /// the routes given to requests are concrete paths rather than templates.
    ///
    /// ```
    /// let metrics = idem_metrics::Metrics::new("sqlite").with_route_label(false);
    /// assert!(!metrics.has_route_label());
    /// ```
    pub fn with_route_label(mut self, on: bool) -> Self {
        self.route_label = on;
        self
    }

    /// The `store` label.
    pub fn store(&self) -> &'static str {
        self.store
    }

    /// Whether the metrics that have a `route` label carry it.
    pub fn has_route_label(&self) -> bool {
        self.route_label
    }

    /// How many reservations this process's executions hold now, over every route (what the
    /// `idem_in_progress` gauges add up to).
    ///
    /// ```
    /// assert_eq!(idem_metrics::Metrics::new("memory").in_progress(), 0);
    /// ```
    pub fn in_progress(&self) -> u64 {
        self.held().per_route.values().sum()
    }

    fn route(&self, id: &RecordId) -> Option<String> {
        self.route_label.then(|| id.route().to_owned())
    }

    fn count(&self, event: &Event<'_>) {
        let mut labels = Vec::with_capacity(3);
        labels.push(Label::new("store", self.store));
        if self.route_label {
            // Every outcome event of the engine is about a record; were one not, it would still
            // carry the label, so that a metric has one set of label names.
            let route = event
                .id()
                .map_or_else(String::new, |id| id.route().to_owned());
            labels.push(Label::new("route", route));
        }
        labels.push(Label::new("outcome", event.kind().name()));
        metrics::counter!(REQUESTS_TOTAL, labels).increment(1);
    }

    fn reconciliation(&self, event: &Event<'_>) {
        let decision = match event.kind() {
            EventKind::DoubtSettled => "settled",
            EventKind::DoubtReleased => "released",
            EventKind::DoubtDeferred => "deferred",
            _ => "contested",
        };
        let mut labels = Vec::with_capacity(3);
        labels.push(Label::new("store", self.store));
        if self.route_label {
            let route = event
                .id()
                .map_or_else(String::new, |id| id.route().to_owned());
            labels.push(Label::new("route", route));
        }
        labels.push(Label::new("decision", decision));
        metrics::counter!(RECONCILIATIONS_TOTAL, labels).increment(1);
    }

    fn store_call(&self, event: &Event<'_>) {
        // The engine names the operation of every store call; one without is not recorded
        // rather than recorded under a name that is no operation.
        let Some(operation) = event.operation() else {
            return;
        };
        metrics::histogram!(
            STORE_DURATION_SECONDS,
            "store" => self.store,
            "operation" => operation.name()
        )
        .record(event.elapsed().as_secs_f64());
        if let Some(kind) = event.error().and_then(|error| error_kind(operation, error)) {
            metrics::counter!(
                STORE_ERRORS_TOTAL,
                "store" => self.store,
                "operation" => operation.name(),
                "kind" => kind
            )
            .increment(1);
        }
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        // Every change under the lock is whole (an insert or a remove, and the count with it).
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the gauge for `route` to what `held` counts. Called under the lock, so that two
    /// settings cannot land out of order.
    fn set_gauge(&self, held: &Held, route: Option<String>) {
        let value = held.per_route.get(&route).copied().unwrap_or(0);
        let mut labels = Vec::with_capacity(2);
        labels.push(Label::new("store", self.store));
        if let Some(route) = route {
            labels.push(Label::new("route", route));
        }
        // An f64 holds every count below 2^53 exactly.
        metrics::gauge!(IN_PROGRESS, labels).set(value as f64);
    }

    /// An execution of this process acquired `id`.
    fn acquired(&self, id: &RecordId, token: Option<FencingToken>) {
        let mut held = self.held();
        if let Some(holding) = held.records.get_mut(id) {
            // Reserved again while an earlier holder here still counted it: the store gave the
            // reservation anew (that holder's lease passed, or the record was deleted), so the
            // record still counts once, now for the new holder.
            holding.token = token;
        } else {
            held.records.insert(id.clone(), Holding { token });
            *held.per_route.entry(self.route(id)).or_insert(0) += 1;
        }
        self.set_gauge(&held, self.route(id));
    }

    /// An execution of this process on `id`, holding `token`, ended.
    fn ended(&self, id: &RecordId, token: Option<FencingToken>) {
        let mut held = self.held();
        let Some(holding) = held.records.get_mut(id) else {
            // Already ended, or never acquired here.
            return;
        };
        let route = self.route(id);
        if token.is_some() && holding.token.is_some() && token != holding.token {
            // The end of a holder that was replaced: the current one still holds the record.
        } else {
            held.records.remove(id);
            if let Some(count) = held.per_route.get_mut(&route) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    held.per_route.remove(&route);
                }
            }
        }
        self.set_gauge(&held, route);
    }
}

impl Observer for Metrics {
    fn observe(&self, event: &Event<'_>) {
        let kind = event.kind();
        match kind {
            EventKind::StoreCall => self.store_call(event),
            EventKind::Purged => {
                metrics::counter!(PURGED_TOTAL, "store" => self.store).increment(event.count());
            }
            EventKind::BudgetSpent => {
                let operation = event.operation().map_or("unknown", |o| o.name());
                metrics::counter!(BUDGET_SPENT_TOTAL, "store" => self.store, "operation" => operation)
                    .increment(1);
            }
            EventKind::DoubtSettled
            | EventKind::DoubtReleased
            | EventKind::DoubtDeferred
            | EventKind::DoubtContested => self.reconciliation(event),
            _ => {
                if OUTCOMES.contains(&kind) {
                    self.count(event);
                }
                if kind == EventKind::Replayed {
                    let hit = event.operation() == Some(Operation::Cache);
                    let result = if hit { "hit" } else { "miss" };
                    metrics::counter!(REPLAY_CACHE_TOTAL, "store" => self.store, "result" => result)
                        .increment(1);
                }
                if let Some(id) = event.id() {
                    if kind.is_acquisition() {
                        self.acquired(id, event.token());
                    } else if kind.ends_execution() {
                        self.ended(id, event.token());
                    }
                }
            }
        }
    }
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics")
            .field("store", &self.store)
            .field("route_label", &self.route_label)
            .field("in_progress", &self.in_progress())
            .finish()
    }
}

/// The `kind` label of a failed call of `operation`, or `None` when the failure is no error: a
/// fenced call refused because the lease no longer holds.
fn error_kind(operation: Operation, error: &Error) -> Option<&'static str> {
    Some(match error {
        Error::Store(e) => match e.kind() {
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::TransactionConflict => "transaction_conflict",
            StoreErrorKind::Misconfigured => "misconfigured",
            // StoreErrorKind::Other, and any kind a later idem-core adds.
            _ => "other",
        },
        Error::CorruptRecord(_) => "corrupt_record",
        Error::SchemaVersion { .. } => "misconfigured",
        Error::KeyMissing | Error::InvalidInput { .. } | Error::BodyTooLarge { .. } => {
            "invalid_input"
        }
        Error::LeaseLost => match operation {
            Operation::Complete
            | Operation::Release
            | Operation::Renew
            | Operation::Transaction => return None,
            // Only the fenced operations may lose a lease; from any other it is the store's
            // fault.
            _ => "other",
        },
        _ => "other",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use idem_core::store::Completion;
    use idem_core::store::Lease;
    use idem_core::store::Record;
    use idem_core::store::Store;
    use idem_core::store::{Acquire, Claim, Deadline, Reserved};
    use idem_core::Answer;
    use idem_core::Begin;
    use idem_core::FencingToken;
    use idem_core::Idempotency;
    use idem_core::MemoryStore;
    use idem_core::Policy;
    use idem_core::Request;
    use idem_core::StoredResponse;
    use idem_core::{Failure, Outcome, RunError};
    use idem_core::{ManualClock, Timestamp};
    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
    use std::future::Future;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    const ROUTE: &str = "POST /v1/charges";
    const CONSUMER: &str = "acct_42";

    /// Runs `test` on a current-thread runtime with a recorder of its own (tests run in
    /// parallel, without a global recorder); `test` gets the recorder's snapshotter.
    fn recorded<F, Fut>(test: F)
    where
        F: FnOnce(Snapshotter) -> Fut,
        Fut: Future<Output = ()>,
    {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        metrics::with_local_recorder(&recorder, || runtime.block_on(test(snapshotter)));
    }

    /// One metric with one set of labels, as seen over the snapshots taken.
    #[derive(Debug)]
    struct Row {
        name: String,
        labels: Vec<(String, String)>,
        unit: Option<Unit>,
        description: Option<String>,
        value: DebugValue,
    }

    /// What the recorder saw. A snapshot resets counters, gauges and histograms, so counters are
    /// summed over snapshots and histograms appended; a gauge reads the value last set since
    /// the previous snapshot, or 0 when none was.
    #[derive(Debug, Default)]
    struct Seen(Vec<Row>);

    impl Seen {
        fn take(&mut self, snapshotter: &Snapshotter) {
            for (key, unit, description, value) in snapshotter.snapshot().into_vec() {
                let (_, key) = key.into_parts();
                let mut labels: Vec<(String, String)> = key
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect();
                labels.sort();
                let name = key.name().to_owned();
                match self
                    .0
                    .iter_mut()
                    .find(|r| r.name == name && r.labels == labels)
                {
                    Some(row) => {
                        row.value = match (&row.value, value) {
                            (DebugValue::Counter(a), DebugValue::Counter(b)) => {
                                DebugValue::Counter(a + b)
                            }
                            (DebugValue::Histogram(a), DebugValue::Histogram(b)) => {
                                DebugValue::Histogram(a.iter().copied().chain(b).collect())
                            }
                            (_, latest) => latest,
                        }
                    }
                    None => self.0.push(Row {
                        name,
                        labels,
                        unit,
                        description: description.map(|d| d.to_string()),
                        value,
                    }),
                }
            }
        }

        /// A fresh view: one snapshot, taken now.
        fn now(snapshotter: &Snapshotter) -> Self {
            let mut seen = Seen::default();
            seen.take(snapshotter);
            seen
        }

        fn rows(&self, name: &str) -> Vec<&Row> {
            self.0.iter().filter(|r| r.name == name).collect()
        }

        fn row(&self, name: &str, labels: &[(&str, &str)]) -> Option<&Row> {
            let mut want: Vec<(String, String)> = labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            want.sort();
            self.0.iter().find(|r| r.name == name && r.labels == want)
        }

        fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
            match self.row(name, labels).map(|r| &r.value) {
                Some(DebugValue::Counter(n)) => *n,
                other => panic!("{name} {labels:?}: not a counter: {other:?}"),
            }
        }

        fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
            match self.row(name, labels).map(|r| &r.value) {
                Some(DebugValue::Gauge(v)) => v.into_inner(),
                other => panic!("{name} {labels:?}: not a gauge: {other:?}"),
            }
        }

        fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
            match self.row(name, labels).map(|r| &r.value) {
                Some(DebugValue::Histogram(values)) => {
                    values.iter().map(|v| v.into_inner()).collect()
                }
                other => panic!("{name} {labels:?}: not a histogram: {other:?}"),
            }
        }

        /// `idem_in_progress{store="memory", route=ROUTE}` after a fresh snapshot: the value
        /// last set since the previous snapshot, or 0 when none was.
        fn in_progress(&mut self, snapshotter: &Snapshotter) -> f64 {
            self.take(snapshotter);
            self.gauge(IN_PROGRESS, &[("store", "memory"), ("route", ROUTE)])
        }

        /// `idem_requests_total` of store "memory" and route ROUTE has exactly the outcomes
        /// `expected`, with these counts, and no other.
        fn assert_outcomes(&self, expected: &[(&str, u64)]) {
            for (name, count) in expected {
                assert_eq!(
                    self.counter(REQUESTS_TOTAL, &outcome(name)),
                    *count,
                    "outcome {name}"
                );
            }
            let rows = self.rows(REQUESTS_TOTAL);
            assert_eq!(rows.len(), expected.len(), "no other outcome: {rows:#?}");
        }

        /// Every row of `name` has exactly the label names `keys`, the documented unit and a
        /// description; returns how many rows there are.
        fn assert_labels(&self, name: &str, keys: &[&str], unit: Unit) -> usize {
            let rows = self.rows(name);
            let mut keys: Vec<&str> = keys.to_vec();
            keys.sort_unstable();
            for row in &rows {
                let got: Vec<&str> = row.labels.iter().map(|(k, _)| k.as_str()).collect();
                assert_eq!(got, keys, "{name}: labels of {row:?}");
                assert_eq!(row.unit, Some(unit), "{name}: unit");
                assert!(
                    row.description.as_ref().is_some_and(|d| !d.is_empty()),
                    "{name}: described"
                );
                for (_, value) in &row.labels {
                    assert!(!value.contains(CONSUMER), "{name}: the consumer in {row:?}");
                    assert!(!value.contains("key-"), "{name}: a key in {row:?}");
                }
            }
            rows.len()
        }
    }

    /// The gauge is back to 0: nothing held in the observer, and the last value recorded 0.
    fn assert_gauge_back_to_zero(metrics: &Metrics, seen: &Seen) {
        assert_eq!(metrics.in_progress(), 0);
        assert!(metrics.held().records.is_empty(), "{metrics:?}");
        assert_eq!(
            seen.gauge(IN_PROGRESS, &[("store", "memory"), ("route", ROUTE)]),
            0.0
        );
    }

    fn outcome(outcome: &str) -> [(&str, &str); 3] {
        [("store", "memory"), ("route", ROUTE), ("outcome", outcome)]
    }

    /// An engine over `store` with a [`Metrics`] labelled "memory" (kept, to look at its
    /// state), after the default tracing observer.
    fn engine<S: Store>(store: S) -> (Idempotency<S>, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new("memory"));
        let idem = Idempotency::builder(store)
            .observer(Arc::clone(&metrics))
            .build()
            .expect("a valid policy");
        (idem, metrics)
    }

    /// A memory store on a manual clock, shared (a second engine over it is another process).
    fn clocked() -> (Arc<MemoryStore>, ManualClock) {
        let clock = ManualClock::new(Timestamp::from_millis(1_000));
        (Arc::new(MemoryStore::with_clock(clock.clone())), clock)
    }

    fn request(idem: &Idempotency<impl Store>, key: &str, body: &[u8]) -> Request {
        idem.request(CONSUMER, "POST", "/v1/charges")
            .key(Some(key))
            .body(body)
            .build()
            .expect("a valid request")
    }

    async fn acquire(idem: &Idempotency<impl Store>, request: &Request) -> Lease {
        match idem.begin(request).await.expect("begin") {
            Begin::Acquired(lease) => lease,
            Begin::Answered(answer) => panic!("not acquired: {answer:?}"),
        }
    }

    async fn answer(idem: &Idempotency<impl Store>, request: &Request) -> Answer {
        match idem.begin(request).await.expect("begin") {
            Begin::Answered(answer) => answer,
            Begin::Acquired(lease) => panic!("acquired: {lease:?}"),
        }
    }

    async fn complete(idem: &Idempotency<impl Store + 'static>, lease: Lease) {
        idem.complete(lease, StoredResponse::new(201, "ok"))
            .await
            .expect("complete");
    }

    type Ran = Result<Outcome, RunError<std::io::Error>>;

    /// The closure form with a handler that answers 201.
    async fn run_ok<S: Store + 'static>(idem: &Idempotency<S>, request: &Request) -> Ran {
        idem.run(request, |_ctx| async {
            Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "ok"))
        })
        .await
    }

    fn boom() -> std::io::Error {
        std::io::Error::other("boom")
    }

    // ---- The guard style: begin, then complete or release ----

    #[test]
    fn c16_guard_executed_counts_acquired_then_executed() {
        recorded(|snapshotter| async move {
            let (idem, metrics) = engine(MemoryStore::new());
            let lease = acquire(&idem, &request(&idem, "key-1", b"{}")).await;
            assert_eq!(metrics.in_progress(), 1);
            complete(&idem, lease).await;
            let seen = Seen::now(&snapshotter);
            seen.assert_outcomes(&[("acquired", 1), ("executed", 1)]);
            assert_gauge_back_to_zero(&metrics, &seen);
        });
    }

    #[test]
    fn c16_guard_replayed_is_counted_and_holds_nothing() {
        recorded(|snapshotter| async move {
            let (idem, metrics) = engine(MemoryStore::new());
            let first = request(&idem, "key-1", b"{}");
            let lease = acquire(&idem, &first).await;
            complete(&idem, lease).await;
            assert!(answer(&idem, &first).await.is_replay());
            assert_eq!(metrics.in_progress(), 0);
            let seen = Seen::now(&snapshotter);
            seen.assert_outcomes(&[("acquired", 1), ("executed", 1), ("replayed", 1)]);
            assert_gauge_back_to_zero(&metrics, &seen);
        });
    }

    #[test]
    fn c16_guard_in_flight_is_counted_and_holds_nothing() {
        recorded(|snapshotter| async move {
            let (idem, metrics) = engine(MemoryStore::new());
            let first = request(&idem, "key-1", b"{}");
            let lease = acquire(&idem, &first).await;
            assert!(matches!(
                answer(&idem, &first).await,
                Answer::InFlight { .. }
            ));
            assert_eq!(metrics.in_progress(), 1);
            complete(&idem, lease).await;
            let seen = Seen::now(&snapshotter);
            seen.assert_outcomes(&[("acquired", 1), ("in_flight", 1), ("executed", 1)]);
            assert_gauge_back_to_zero(&metrics, &seen);
        });
    }

    #[test]
    fn c16_guard_mismatch_is_counted_and_holds_nothing() {
        recorded(|snapshotter| async move {
            let (idem, metrics) = engine(MemoryStore::new());
            let lease = acquire(&idem, &request(&idem, "key-1", b"{}")).await;
            let other = request(&idem, "key-1", b"{\"other\":1}");
            assert_eq!(answer(&idem, &other).await, Answer::Mismatch);
            assert_eq!(metrics.in_progress(), 1);
            complete(&idem, lease).await;
            let seen = Seen::now(&snapshotter);
            seen.assert_outcomes(&[("acquired", 1), ("mismatch", 1), ("executed", 1)]);
            assert_gauge_back_to_zero(&metrics, &seen);
        });
    }

    #[test]
    fn c16_guard_taken_over_counts_the_record_once_and_the_old_holder_lease_lost() {
        recorded(|snapshotter| async move {
            let (store, clock) = clocked();
            let (idem, metrics) = engine(store);
            let third = request(&idem, "key-3", b"{}");
            let old = acquire(&idem, &third).await;
            clock.advance(idem.policy().lease + Duration::from_secs(1));
            let new = acquire(&idem, &third).await;
            assert!(new.acquired().kind() == EventKind::TakenOver);
            // One live reservation of the record in the store (C4): counted once.
            assert_eq!(metrics.in_progress(), 1);
            assert!(matches!(
                idem.complete(old, StoredResponse::new(201, "late")).await,
                Err(Error::LeaseLost)
            ));
            // The old holder's end is its own: the new one still holds the record.
            assert_eq!(metrics.in_progress(), 1);
            complete(&idem, new).await;
            let seen = Seen::now(&snapshotter);
            seen.assert_outcomes(&[
                ("acquired", 1),
                ("taken_over", 1),
                ("lease_lost", 1),
                ("executed", 1),
            ]);
            assert_gauge_back_to_zero(&metrics, &seen);
            assert!(
                seen.rows(STORE_ERRORS_TOTAL).is_empty(),
                "a lost lease is no store error"
            );
        });
    }

    #[test]
    fn c16_guard_lease_lost_on_renew_ends_the_replaced_holder_only() {
        recorded(|snapshotter| async move {
            let (store, clock) = clocked();
            let (idem, metrics) = engine(store);
            let first = request(&idem, "key-1", b"{}");
            let mut old = acquire(&idem, &first).await;
            clock.advance(idem.policy().lease + Duration::from_secs(1));
            let new = acquire(&idem, &first).await;
            assert!(matches!(idem.renew(&mut old).await, Err(Error::LeaseLost)));
            assert_eq!(metrics.in_progress(), 1);
            complete(&idem, new).await;
            let seen = Seen::now(&snapshotter);
            seen.assert_outcomes(&[
                ("acquired", 1),
                ("taken_over", 1),
                ("lease_lost", 1),
                ("executed", 1),
            ]);
            assert_gauge_back_to_zero(&metrics, &seen);
        });
    }

    #[test]
    fn c16_guard_started_over_after_the_retention() {
        recorded(|snapshotter| async move {
            let (store, clock) = clocked();
            let (idem, metrics) = engine(store);
            let first = request(&idem, "key-1", b"{}");
            let lease = acquire(&idem, &first).await;
            complete(&idem, lease).await;
            clock.advance(idem.policy().retention + Duration::from_secs(1));
            let again = acquire(&idem, &first).await;
            assert!(again.acquired().kind() == EventKind::StartedOver);
            assert_eq!(metrics.in_progress(), 1);
            complete(&idem, again).await;
            let seen = Seen::now(&snapshotter);
            seen.assert_outcomes(&[("acquired", 1), ("executed", 2), ("started_over", 1)]);
            assert_gauge_back_to_zero(&metrics, &seen);
        });
    }

    #[test]
    fn c16_guard_released_counts_acquired_then_released() {
        recorded(|snapshotter| async move {
            let (idem, metrics) = engine(MemoryStore::new());
            let lease = acquire(&idem, &request(&idem, "key-1", b"{}")).await;
            assert_eq!(metrics.in_progress(), 1);
            idem.release(lease).await.expect("release");
            let seen = Seen::now(&snapshotter);
            seen.assert_outcomes(&[("acquired", 1), ("released", 1)]);
            assert_gauge_back_to_zero(&metrics, &seen);
        });
    }

    #[test]
    fn c16_guard_dropped_lease_counts_until_the_record_is_reserved_again_here() {
        recorded(|snapshotter| async move {
            let (store, clock) = clocked();
            let (idem, metrics) = engine(store);
            let first = request(&idem, "key-1", b"{}");
            // A guard-style caller that dropped its lease: no completion, no release.
            drop(acquire(&idem, &first).await);
            assert_eq!(metrics.in_progress(), 1);
            clock.advance(idem.policy().lease + Duration::from_secs(1));
            // A retry takes the orphan over; its end ends the record here.
            assert!(matches!(
                run_ok(&idem, &first).await,
                Ok(Outcome::Executed(_))
            ));
            let seen = Seen::now(&snapshotter);
            seen.assert_outcomes(&[("acquired", 1), ("taken_over", 1), ("executed", 1)]);
            assert_gauge_back_to_zero(&metrics, &seen);
        });
    }

    // ---- The closure style: run ----

    #[test]
    fn c16_run_executed_counts_acquired_then_executed() {
        recorded(|snapshotter| async move {
            let (idem, metrics) = engine(MemoryStore::new());
            let first = request(&idem, "key-1", b"{}");
            let during = Arc::clone(&metrics);
            let ran: Ran = idem
                .run(&first, move |_ctx| async move {
                    assert_eq!(during.in_progress(), 1, "held while the handler runs");
                    Ok(StoredResponse::new(201, "ok"))
                })
                .await;
            assert!(matches!(ran, Ok(Outcome::Executed(_))));
            let seen = Seen::now(&snapshotter);
            seen.assert_outcomes(&[("acquired", 1), ("executed", 1)]);
            assert_gauge_back_to_zero(&metrics, &seen);
        });
    }

    #[test]
    fn c16_run_replayed_is_counted_and_holds_nothing() {
        recorded(|snapshotter| async move {
            let (idem, metrics) = engine(MemoryStore::new());
            let first = request(&idem, "key-1", b"{}");
            assert!(matches!(
                run_ok(&idem, &first).await,
                Ok(Outcome::Executed(_))
            ));
            assert!(matches!(
                run_ok(&idem, &first).await,
                Ok(Outcome::Answered(Answer::Replay(_)))
            ));
            let seen = Seen::now(&snapshotter);
            seen.assert_outcomes(&[("acquired", 1), ("executed", 1), ("replayed", 1)]);
            assert_gauge_back_to_zero(&metrics, &seen);
        });
    }

    #[test]
    fn c16_run_in_flight_is_counted_and_holds_nothing() {
        recorded(|snapshotter| async move {
            let (idem, metrics) = engine(MemoryStore::new());
            let first = request(&idem, "key-1", b"{}");
            let duplicate = first.clone();
            let during = Arc::clone(&metrics);
            let ran: Ran = idem
                .run(&first, move |ctx| async move {
                    let answer = ctx.idem().begin(&duplicate).await.expect("begin");
                    assert!(matches!(answer, Begin::Answered(Answer::InFlight { .. })));
                    assert_eq!(during.in_progress(), 1);
                    Ok(StoredResponse::new(201, "ok"))
                })
                .await;
            assert!(matches!(ran, Ok(Outcome::Executed(_))));
            let seen = Seen::now(&snapshotter);
            seen.assert_outcomes(&[("acquired", 1), ("in_flight", 1), ("executed", 1)]);
            assert_gauge_back_to_zero(&metrics, &seen);
        });
    }

    #[test]
    fn c16_run_mismatch_is_counted_and_holds_nothing() {
        recorded(|snapshotter| async move {
            let (idem, metrics) = engine(MemoryStore::new());
            let first = request(&idem, "key-1", b"{}");
            let other = request(&idem, "key-1", b"{\"other\":1}");
            let during = Arc::clone(&metrics);
            let ran: Ran = idem
                .run(&first, move |ctx| async move {
                    let answer = ctx.idem().begin(&other).await.expect("begin");
                    assert!(matches!(answer, Begin::Answered(Answer::Mismatch)));
                    assert_eq!(during.in_progress(), 1);
                    Ok(StoredResponse::new(201, "ok"))
                })
                .await;
            assert!(matches!(ran, Ok(Outcome::Executed(_))));
            let seen = Seen::now(&snapshotter);
            seen.assert_outcomes(&[("acquired", 1), ("mismatch", 1), ("executed", 1)]);
            assert_gauge_back_to_zero(&metrics, &seen);
        });
    }

    #[test]
    fn c16_run_taken_over_an_orphan_of_another_process() {
        recorded(|snapshotter| async move {
            let (store, clock) = clocked();
            let (idem, metrics) = engine(Arc::clone(&store));
            // Another process (no metrics of this one) reserved and crashed.
            let crashed = Idempotency::new(idem_core::testing::Elsewhere::new(store));
            let first = request(&idem, "key-1", b"{}");
            drop(acquire(&crashed, &first).await);
            clock.advance(idem.policy().lease + Duration::from_secs(1));
            assert!(matches!(
                run_ok(&idem, &first).await,
                Ok(Outcome::Executed(_))
            ));
            let seen = Seen::now(&snapshotter);
            seen.assert_outcomes(&[("taken_over", 1), ("executed", 1)]);
            assert_gauge_back_to_zero(&metrics, &seen);
        });
    }

    #[test]
    fn c16_run_started_over_after_the_retention() {
        recorded(|snapshotter| async move {
            let (store, clock) = clocked();
            let (idem, metrics) = engine(store);
            let first = request(&idem, "key-1", b"{}");
            assert!(matches!(
                run_ok(&idem, &first).await,
                Ok(Outcome::Executed(_))
            ));
            clock.advance(idem.policy().retention + Duration::from_secs(1));
            assert!(matches!(
                run_ok(&idem, &first).await,
                Ok(Outcome::Executed(_))
            ));
            let seen = Seen::now(&snapshotter);
            seen.assert_outcomes(&[("acquired", 1), ("started_over", 1), ("executed", 2)]);
            assert_gauge_back_to_zero(&metrics, &seen);
        });
    }

    #[test]
    fn c16_run_released_when_nothing_happened() {
        recorded(|snapshotter| async move {
            let (idem, metrics) = engine(MemoryStore::new());
            let first = request(&idem, "key-1", b"{}");
            let ran = idem
                .run(&first, |_ctx| async {
                    Err::<StoredResponse, _>(Failure::nothing_happened(boom()))
                })
                .await;
            assert!(matches!(ran, Err(RunError::Released(_))));
            let seen = Seen::now(&snapshotter);
            seen.assert_outcomes(&[("acquired", 1), ("released", 1)]);
            assert_gauge_back_to_zero(&metrics, &seen);
        });
    }

    #[test]
    fn c16_run_lease_lost_to_another_process() {
        recorded(|snapshotter| async move {
            let (store, clock) = clocked();
            let (idem, metrics) = engine(Arc::clone(&store));
            let other = Idempotency::new(idem_core::testing::Elsewhere::new(store));
            let first = request(&idem, "key-1", b"{}");
            let duplicate = first.clone();
            let lease = idem.policy().lease;
            let ran: Ran = idem
                .run(&first, move |_ctx| async move {
                    // The store's clock passes the lease; another process takes the record.
                    clock.advance(lease + Duration::from_secs(1));
                    let taken = other.begin(&duplicate).await.expect("begin");
                    assert!(matches!(taken, Begin::Acquired(_)));
                    Ok(StoredResponse::new(201, "late"))
                })
                .await;
            assert!(matches!(ran, Err(RunError::Incomplete(Error::LeaseLost))));
            let seen = Seen::now(&snapshotter);
            seen.assert_outcomes(&[("acquired", 1), ("lease_lost", 1)]);
            assert_gauge_back_to_zero(&metrics, &seen);
            assert!(
                seen.rows(STORE_ERRORS_TOTAL).is_empty(),
                "the fence working"
            );
        });
    }

    #[test]
    fn c16_decisions_about_records_in_doubt_are_counted_by_decision() {
        recorded(|snapshotter| async move {
            let (idem, _metrics) = engine(MemoryStore::new());
            for key in ["key-1", "key-2"] {
                let ran = idem
                    .run(&request(&idem, key, b"{}"), |_ctx| async {
                        Err::<StoredResponse, _>(Failure::unknown(boom()))
                    })
                    .await;
                assert!(matches!(ran, Err(RunError::Unknown { .. })));
            }
            let settle = idem_ops::reconcile::Finding::settled(StoredResponse::new(201, "ok"));
            let first = request(&idem, "key-1", b"{}");
            let case = idem_ops::reconcile::in_doubt(&idem, first.id())
                .await
                .expect("read")
                .expect("in doubt");
            idem_ops::reconcile::resolve(&idem, &case, settle.clone(), "test")
                .await
                .expect("settled");
            idem_ops::reconcile::resolve(&idem, &case, settle, "late")
                .await
                .expect("contested");
            let second = request(&idem, "key-2", b"{}");
            let case = idem_ops::reconcile::in_doubt(&idem, second.id())
                .await
                .expect("read")
                .expect("in doubt");
            let unknown = idem_ops::reconcile::Finding::still_unknown();
            idem_ops::reconcile::resolve(&idem, &case, unknown, "test")
                .await
                .expect("deferred");
            let seen = Seen::now(&snapshotter);
            let decision =
                |d: &'static str| [("store", "memory"), ("route", ROUTE), ("decision", d)];
            assert_eq!(seen.counter(RECONCILIATIONS_TOTAL, &decision("settled")), 1);
            assert_eq!(
                seen.counter(RECONCILIATIONS_TOTAL, &decision("contested")),
                1
            );
            assert_eq!(
                seen.counter(RECONCILIATIONS_TOTAL, &decision("deferred")),
                1
            );
            assert!(seen
                .row(RECONCILIATIONS_TOTAL, &decision("released"))
                .is_none());
            assert_eq!(seen.counter(REQUESTS_TOTAL, &outcome("outcome_unknown")), 2);
        });
    }

    #[test]
    fn c16_run_outcome_unknown_keeps_the_key_and_ends_the_execution() {
        recorded(|snapshotter| async move {
            let (idem, metrics) = engine(MemoryStore::new());
            let first = request(&idem, "key-1", b"{}");
            let ran = idem
                .run(&first, |_ctx| async {
                    Err::<StoredResponse, _>(Failure::unknown(boom()))
                })
                .await;
            assert!(matches!(ran, Err(RunError::Unknown { .. })));
            let seen = Seen::now(&snapshotter);
            seen.assert_outcomes(&[("acquired", 1), ("outcome_unknown", 1)]);
            assert_gauge_back_to_zero(&metrics, &seen);
        });
    }

    #[test]
    fn c16_run_completion_written_by_the_handler_is_executed() {
        recorded(|snapshotter| async move {
            let (idem, metrics) = engine(MemoryStore::new());
            let first = request(&idem, "key-1", b"{}");
            // As a SQL store's complete_in in the effect's transaction: written around the
            // engine, returned to it, checked by its lookup.
            let ran = idem
                .run(&first, |ctx| async move {
                    let completion = ctx.completion(StoredResponse::new(201, "ok"));
                    ctx.idem()
                        .store()
                        .complete(&completion, Deadline::default())
                        .await
                        .map_err(Failure::unknown)?;
                    Ok::<_, Failure<Error>>(completion)
                })
                .await;
            assert!(matches!(ran, Ok(Outcome::Executed(_))));
            let seen = Seen::now(&snapshotter);
            seen.assert_outcomes(&[("acquired", 1), ("executed", 1)]);
            assert_gauge_back_to_zero(&metrics, &seen);
            let lookups = seen.histogram(
                STORE_DURATION_SECONDS,
                &[("store", "memory"), ("operation", "lookup")],
            );
            assert_eq!(lookups.len(), 1, "the engine's check, and no other call");
        });
    }

    // ---- Each metric: labels, unit, description ----

    #[test]
    fn c16_requests_total_counts_each_outcome_by_store_route_and_outcome() {
        recorded(|snapshotter| async move {
            let (store, clock) = clocked();
            let (idem, metrics) = engine(store);

            // acquired, in_flight, mismatch, executed, replayed
            let first = request(&idem, "key-1", b"{}");
            let lease = acquire(&idem, &first).await;
            assert!(matches!(
                answer(&idem, &first).await,
                Answer::InFlight { .. }
            ));
            let other = request(&idem, "key-1", b"{\"other\":1}");
            assert_eq!(answer(&idem, &other).await, Answer::Mismatch);
            complete(&idem, lease).await;
            assert!(answer(&idem, &first).await.is_replay());

            // acquired, released
            let second = request(&idem, "key-2", b"{}");
            let lease = acquire(&idem, &second).await;
            idem.release(lease).await.expect("release");

            // acquired, taken over after the lease; the old holder's completion is refused
            // (lease_lost), the new holder's lands (executed).
            let third = request(&idem, "key-3", b"{}");
            let old = acquire(&idem, &third).await;
            clock.advance(idem.policy().lease + Duration::from_secs(1));
            let new = acquire(&idem, &third).await;
            assert!(matches!(
                idem.complete(old, StoredResponse::new(201, "late")).await,
                Err(Error::LeaseLost)
            ));
            complete(&idem, new).await;

            // started over after the retention, then an unknown outcome
            clock.advance(idem.policy().retention + Duration::from_secs(1));
            let ran = idem
                .run(&first, |_ctx| async {
                    Err::<StoredResponse, _>(Failure::unknown(boom()))
                })
                .await;
            assert!(matches!(ran, Err(RunError::Unknown { .. })));

            // rejected: a body over the limit
            let limit = idem.policy().max_body_bytes;
            let big = Request::builder(CONSUMER, "POST", "/v1/charges")
                .max_body_bytes(limit * 2)
                .key(Some("key-4"))
                .body(&vec![b' '; limit + 1])
                .build()
                .expect("a request without the engine's limit");
            assert!(idem.begin(&big).await.is_err());

            let seen = Seen::now(&snapshotter);
            seen.assert_outcomes(&[
                ("rejected", 1),
                ("replayed", 1),
                ("in_flight", 1),
                ("mismatch", 1),
                ("acquired", 3),
                ("taken_over", 1),
                ("started_over", 1),
                ("executed", 2),
                ("released", 1),
                ("lease_lost", 1),
                ("outcome_unknown", 1),
            ]);
            let rows =
                seen.assert_labels(REQUESTS_TOTAL, &["store", "route", "outcome"], Unit::Count);
            assert_eq!(rows, 11);
            assert_gauge_back_to_zero(&metrics, &seen);
        });
    }

    #[test]
    fn c16_requests_total_without_the_route_label() {
        recorded(|snapshotter| async move {
            let metrics = Arc::new(Metrics::new("memory").with_route_label(false));
            let idem = Idempotency::builder(MemoryStore::new())
                .observer(Arc::clone(&metrics))
                .build()
                .expect("a valid policy");
            let first = request(&idem, "key-1", b"{}");
            let lease = acquire(&idem, &first).await;
            complete(&idem, lease).await;
            let _held = acquire(&idem, &request(&idem, "key-2", b"{}")).await;
            let seen = Seen::now(&snapshotter);
            let labels = [("store", "memory"), ("outcome", "acquired")];
            assert_eq!(seen.counter(REQUESTS_TOTAL, &labels), 2);
            let labels = [("store", "memory"), ("outcome", "executed")];
            assert_eq!(seen.counter(REQUESTS_TOTAL, &labels), 1);
            seen.assert_labels(REQUESTS_TOTAL, &["store", "outcome"], Unit::Count);
            assert_eq!(seen.gauge(IN_PROGRESS, &[("store", "memory")]), 1.0);
            seen.assert_labels(IN_PROGRESS, &["store"], Unit::Count);
            assert_eq!(metrics.in_progress(), 1);
        });
    }

    /// Makes the error a [`Failing`] store fails with.
    type Fail = fn() -> Error;

    /// A store whose every call fails with the error its `Fail` makes, except `complete` when
    /// `lose_leases`: refused as a lost lease, so that the engine looks the record up.
    struct Failing {
        fail: Fail,
        lose_leases: bool,
    }

    #[async_trait]
    impl Store for Failing {
        async fn reserve(&self, _: &Claim<'_>, _deadline: Deadline) -> Result<Reserved, Error> {
            Err((self.fail)())
        }
        async fn replace(
            &self,
            _: &Claim<'_>,
            _: Acquire,
            _deadline: Deadline,
        ) -> Result<Reserved, Error> {
            Err((self.fail)())
        }
        async fn complete(&self, _: &Completion, _deadline: Deadline) -> Result<(), Error> {
            if self.lose_leases {
                return Err(Error::LeaseLost);
            }
            Err((self.fail)())
        }
        async fn release(&self, _: &Lease, _deadline: Deadline) -> Result<(), Error> {
            Err((self.fail)())
        }
        async fn renew(
            &self,
            _: &Lease,
            _: Duration,
            _deadline: Deadline,
        ) -> Result<Timestamp, Error> {
            Err((self.fail)())
        }
        async fn purge_expired(&self, _: usize, _deadline: Deadline) -> Result<usize, Error> {
            Err((self.fail)())
        }
        async fn lookup(&self, _: &RecordId, _deadline: Deadline) -> Result<Option<Record>, Error> {
            Err((self.fail)())
        }
        async fn resolve(
            &self,
            _: &idem_core::store::Resolution,
            _deadline: Deadline,
        ) -> Result<bool, Error> {
            Err((self.fail)())
        }
    }

    /// The events an engine emitted on the test's thread, as a second observer sees them: the
    /// test's recorder is the thread's (`recorded`), so the heartbeat thread's renewals are
    /// counted by neither.
    struct Tally {
        thread: std::thread::ThreadId,
        events: Mutex<Vec<(EventKind, Option<Operation>, bool)>>,
    }

    impl Default for Tally {
        fn default() -> Self {
            Self {
                thread: std::thread::current().id(),
                events: Mutex::default(),
            }
        }
    }

    impl Observer for Tally {
        fn observe(&self, event: &Event<'_>) {
            if std::thread::current().id() != self.thread {
                return;
            }
            let failed = event
                .error()
                .is_some_and(|error| !matches!(error, Error::LeaseLost));
            self.events
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((event.kind(), event.operation(), failed));
        }
    }

    impl Tally {
        /// Store calls of `operation`, and how many of them failed (a lost lease aside).
        fn calls(&self, operation: Operation) -> (usize, usize) {
            let events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
            let calls: Vec<bool> = events
                .iter()
                .filter(|(k, o, _)| *k == EventKind::StoreCall && *o == Some(operation))
                .map(|(_, _, failed)| *failed)
                .collect();
            (calls.len(), calls.iter().filter(|failed| **failed).count())
        }

        fn events(&self, kind: EventKind) -> u64 {
            let events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
            events.iter().filter(|(k, _, _)| *k == kind).count() as u64
        }
    }

    /// An engine over `store` with a short store timeout, the metrics labelled "failing" and
    /// `tally`.
    fn failing(store: Failing, tally: &Arc<Tally>) -> Idempotency<Failing> {
        Idempotency::builder(store)
            .policy(Policy::default().store_timeout(Duration::from_millis(20)))
            .observer(Metrics::new("failing"))
            .observer(Arc::clone(tally))
            .build()
            .expect("a valid policy")
    }

    #[test]
    fn c16_store_errors_total_counts_each_kind_by_store_operation_and_kind() {
        let kinds: [(&str, Fail, bool); 6] = [
            (
                "unavailable",
                || Error::store("failing", StoreErrorKind::Unavailable, "down"),
                true,
            ),
            (
                "transaction_conflict",
                || Error::store("failing", StoreErrorKind::TransactionConflict, "40001"),
                true,
            ),
            (
                "misconfigured",
                || Error::store("failing", StoreErrorKind::Misconfigured, "no table"),
                false,
            ),
            (
                "other",
                || Error::store("failing", StoreErrorKind::Other, "oops"),
                false,
            ),
            (
                "corrupt_record",
                || Error::CorruptRecord("garbage".to_owned()),
                false,
            ),
            (
                "invalid_input",
                || Error::invalid(idem_core::Field::Response, "too large"),
                false,
            ),
        ];
        let operations = [
            Operation::Reserve,
            Operation::Complete,
            Operation::Release,
            Operation::Renew,
            Operation::Purge,
            Operation::Lookup,
        ];
        recorded(|snapshotter| async move {
            let mut tallies = Vec::new();
            for (_, fail, _) in kinds {
                let tally = Arc::new(Tally::default());
                let idem = failing(
                    Failing {
                        fail,
                        lose_leases: false,
                    },
                    &tally,
                );
                let request = request(&idem, "key-1", b"{}");
                let mut lease = Lease::new(
                    &request,
                    FencingToken::generate(),
                    Timestamp::from_millis(60_000),
                    Acquire::FRESH,
                );
                // Past its local deadline: one attempt at each completion, then a task goes on
                // writing it (C8) while the test runs on.
                idem_core::testing::set_local_deadline(&mut lease, Instant::now());
                assert!(idem.begin(&request).await.is_err());
                assert!(idem
                    .complete(lease.clone(), StoredResponse::new(201, "ok"))
                    .await
                    .is_err());
                assert!(idem.release(lease.clone()).await.is_err());
                assert!(idem.renew(&mut lease).await.is_err());
                assert!(idem.purge_expired().await.is_err());
                // A completion refused as a lost lease: the engine looks the record up, and
                // the lookup fails.
                let lossy = failing(
                    Failing {
                        fail,
                        lose_leases: true,
                    },
                    &tally,
                );
                assert!(matches!(
                    lossy.complete(lease, StoredResponse::new(201, "ok")).await,
                    Err(Error::LeaseLost)
                ));
                tallies.push(tally);
            }
            let seen = Seen::now(&snapshotter);
            for ((kind, _, retryable), tally) in kinds.iter().zip(&tallies) {
                for operation in operations {
                    let labels = [
                        ("store", "failing"),
                        ("operation", operation.name()),
                        ("kind", kind),
                    ];
                    let (_, failed) = tally.calls(operation);
                    let counted = seen.counter(STORE_ERRORS_TOTAL, &labels);
                    assert_eq!(counted as usize, failed, "as the events say: {labels:?}");
                    let expected = match operation {
                        // A completion refused for good is replaced by a stored 500, which
                        // fails too; either goes on on its task (the 500 read back after a
                        // refusal), as many times as the test gives it.
                        Operation::Complete if !retryable => counted.max(2),
                        Operation::Complete => counted.max(1),
                        // Retried within the store timeout; after a refusal, by the task too.
                        Operation::Lookup => counted.max(1),
                        _ => 1,
                    };
                    assert_eq!(counted, expected, "{labels:?}");
                }
            }
            let rows = seen.assert_labels(
                STORE_ERRORS_TOTAL,
                &["store", "operation", "kind"],
                Unit::Count,
            );
            assert_eq!(rows, kinds.len() * operations.len(), "no other row");
            // Every call is timed, failed or not (the refused completions too).
            for operation in operations {
                let labels = [("store", "failing"), ("operation", operation.name())];
                let calls: usize = tallies.iter().map(|t| t.calls(operation).0).sum();
                assert_eq!(seen.histogram(STORE_DURATION_SECONDS, &labels).len(), calls);
            }
            // The outcomes are the events' too.
            for kind in OUTCOMES {
                let events: u64 = tallies.iter().map(|t| t.events(*kind)).sum();
                let labels = [
                    ("store", "failing"),
                    ("route", ROUTE),
                    ("outcome", kind.name()),
                ];
                let counted = seen
                    .row(REQUESTS_TOTAL, &labels)
                    .map_or(0, |_| seen.counter(REQUESTS_TOTAL, &labels));
                assert_eq!(counted, events, "{kind}");
            }
            assert_eq!(
                seen.counter(
                    REQUESTS_TOTAL,
                    &[
                        ("store", "failing"),
                        ("route", ROUTE),
                        ("outcome", "rejected")
                    ]
                ),
                kinds.len() as u64,
                "a failed reservation is a rejected request"
            );
        });
    }

    #[test]
    fn c16_replays_are_counted_by_where_they_came_from() {
        recorded(|snapshotter| async move {
            let metrics = std::sync::Arc::new(Metrics::new("memory"));
            let store = std::sync::Arc::new(idem_core::MemoryStore::new());
            let engine = || {
                Idempotency::builder(std::sync::Arc::clone(&store))
                    .replay_cache(idem_core::ReplayCache::new(10, 1 << 20))
                    .observer(std::sync::Arc::clone(&metrics))
                    .build()
                    .expect("an engine")
            };
            let (here, elsewhere) = (engine(), engine());
            let req = here
                .request("acct", "POST", "/charges")
                .key(Some("k"))
                .body(b"{}")
                .build()
                .expect("a request");
            let Begin::Acquired(lease) = here.begin(&req).await.expect("begin") else {
                panic!("fresh")
            };
            here.complete(lease, StoredResponse::new(201, "ok"))
                .await
                .expect("complete");
            for engine in [&here, &elsewhere, &elsewhere] {
                let begun = engine.begin(&req).await.expect("begin");
                assert!(matches!(
                    begun,
                    Begin::Answered(idem_core::Answer::Replay(_))
                ));
            }
            // Here kept by the completion; elsewhere read from the store, then kept.
            let seen = Seen::now(&snapshotter);
            let hit = [("store", "memory"), ("result", "hit")];
            let miss = [("store", "memory"), ("result", "miss")];
            assert_eq!(seen.counter(REPLAY_CACHE_TOTAL, &hit), 2);
            assert_eq!(seen.counter(REPLAY_CACHE_TOTAL, &miss), 1);
            seen.assert_labels(REPLAY_CACHE_TOTAL, &["store", "result"], Unit::Count);
        });
    }

    #[test]
    fn c16_store_call_events_are_timed_and_counted_by_operation() {
        recorded(|snapshotter| async move {
            let metrics = Metrics::new("memory");
            let down = Error::store("memory", StoreErrorKind::Unavailable, "down");
            for operation in Operation::ALL {
                let call = Event::new(EventKind::StoreCall)
                    .of(*operation)
                    .took(Duration::from_millis(250));
                metrics.observe(&call);
                metrics.observe(&call.failed(&down));
                metrics.observe(&call.failed(&Error::LeaseLost));
            }
            // Without an operation, nothing is recorded.
            metrics.observe(&Event::new(EventKind::StoreCall).failed(&down));
            let seen = Seen::now(&snapshotter);
            for operation in Operation::ALL {
                let labels = [("store", "memory"), ("operation", operation.name())];
                assert_eq!(
                    seen.histogram(STORE_DURATION_SECONDS, &labels),
                    [0.25, 0.25, 0.25]
                );
                let unavailable = [
                    ("store", "memory"),
                    ("operation", operation.name()),
                    ("kind", "unavailable"),
                ];
                assert_eq!(seen.counter(STORE_ERRORS_TOTAL, &unavailable), 1);
                let lost = [
                    ("store", "memory"),
                    ("operation", operation.name()),
                    ("kind", "other"),
                ];
                let fenced = matches!(
                    operation,
                    Operation::Complete
                        | Operation::Release
                        | Operation::Renew
                        | Operation::Transaction
                );
                if fenced {
                    assert!(
                        seen.row(STORE_ERRORS_TOTAL, &lost).is_none(),
                        "{operation:?}"
                    );
                } else {
                    assert_eq!(seen.counter(STORE_ERRORS_TOTAL, &lost), 1, "{operation:?}");
                }
            }
            assert_eq!(
                seen.rows(STORE_DURATION_SECONDS).len(),
                Operation::ALL.len()
            );
            assert!(
                seen.rows(REQUESTS_TOTAL).is_empty(),
                "a store call is no outcome"
            );
        });
    }

    #[test]
    fn c16_store_duration_seconds_times_each_operation_by_store_and_operation() {
        recorded(|snapshotter| async move {
            let (idem, _metrics) = engine(MemoryStore::new());
            let first = request(&idem, "key-1", b"{}");
            let mut lease = acquire(&idem, &first).await;
            idem.renew(&mut lease).await.expect("renew");
            complete(&idem, lease).await;
            let second = request(&idem, "key-2", b"{}");
            let lease = acquire(&idem, &second).await;
            idem.release(lease).await.expect("release");
            idem.purge_expired().await.expect("purge");
            let third = request(&idem, "key-3", b"{}");
            let ran = idem
                .run(&third, |ctx| async move {
                    let completion = ctx.completion(StoredResponse::new(201, "ok"));
                    ctx.idem()
                        .store()
                        .complete(&completion, Deadline::default())
                        .await
                        .map_err(Failure::unknown)?;
                    Ok::<_, Failure<Error>>(completion)
                })
                .await;
            assert!(matches!(ran, Ok(Outcome::Executed(_))));

            let seen = Seen::now(&snapshotter);
            let calls = [
                ("reserve", 3),
                ("renew", 1),
                ("complete", 1),
                ("release", 1),
                ("purge", 1),
                ("lookup", 1),
            ];
            for (operation, count) in calls {
                let labels = [("store", "memory"), ("operation", operation)];
                let values = seen.histogram(STORE_DURATION_SECONDS, &labels);
                assert_eq!(values.len(), count, "{operation}");
                // In seconds: a call to a memory store takes far less than one.
                assert!(
                    values.iter().all(|v| (0.0..1.0).contains(v)),
                    "{operation}: {values:?}"
                );
            }
            let rows = seen.assert_labels(
                STORE_DURATION_SECONDS,
                &["store", "operation"],
                Unit::Seconds,
            );
            assert_eq!(rows, calls.len(), "no other call");
        });
    }

    #[test]
    fn c16_purged_total_counts_deleted_records_by_store() {
        recorded(|snapshotter| async move {
            let (store, clock) = clocked();
            let (idem, _metrics) = engine(store);
            for key in ["key-1", "key-2", "key-3"] {
                let lease = acquire(&idem, &request(&idem, key, b"{}")).await;
                complete(&idem, lease).await;
            }
            let _orphan = acquire(&idem, &request(&idem, "key-4", b"{}")).await;
            assert_eq!(idem.purge_expired().await.expect("purge"), 0);
            clock.advance(idem.policy().retention + Duration::from_secs(1));
            assert_eq!(idem.purge_expired().await.expect("purge"), 4);

            let seen = Seen::now(&snapshotter);
            assert_eq!(seen.counter(PURGED_TOTAL, &[("store", "memory")]), 4);
            assert_eq!(seen.assert_labels(PURGED_TOTAL, &["store"], Unit::Count), 1);
            assert!(
                !seen
                    .rows(REQUESTS_TOTAL)
                    .iter()
                    .any(|r| r.labels.iter().any(|(_, v)| v == "purged")),
                "a purge is no request outcome"
            );
        });
    }

    #[test]
    fn c16_in_progress_gauge_follows_this_process_executions() {
        recorded(|snapshotter| async move {
            let (store, clock) = clocked();
            let (idem, metrics) = engine(store);
            let mut seen = Seen::default();
            // Held throughout: an unchanged gauge reads 0 in a snapshot, so every value checked
            // here must be one the observer set.
            let held = acquire(&idem, &request(&idem, "key-0", b"{}")).await;
            assert_eq!(seen.in_progress(&snapshotter), 1.0);

            let a = acquire(&idem, &request(&idem, "key-1", b"{}")).await;
            assert_eq!(seen.in_progress(&snapshotter), 2.0);
            let b = acquire(&idem, &request(&idem, "key-2", b"{}")).await;
            assert_eq!(seen.in_progress(&snapshotter), 3.0);
            complete(&idem, a).await;
            assert_eq!(seen.in_progress(&snapshotter), 2.0);
            idem.release(b).await.expect("release");
            assert_eq!(seen.in_progress(&snapshotter), 1.0);

            // A takeover in this process: the record counts once, before and after the old
            // holder is refused.
            let third = request(&idem, "key-3", b"{}");
            let old = acquire(&idem, &third).await;
            assert_eq!(seen.in_progress(&snapshotter), 2.0);
            clock.advance(idem.policy().lease + Duration::from_secs(1));
            let new = acquire(&idem, &third).await;
            assert_eq!(seen.in_progress(&snapshotter), 2.0);
            assert!(matches!(
                idem.complete(old, StoredResponse::new(201, "late")).await,
                Err(Error::LeaseLost)
            ));
            assert_eq!(seen.in_progress(&snapshotter), 2.0);
            complete(&idem, new).await;
            assert_eq!(seen.in_progress(&snapshotter), 1.0);

            // The first one ends however the store answers (its lease passed too).
            let _ = idem.release(held).await;
            assert_eq!(seen.in_progress(&snapshotter), 0.0);
            assert_gauge_back_to_zero(&metrics, &seen);
            assert_eq!(
                seen.assert_labels(IN_PROGRESS, &["store", "route"], Unit::Count),
                1
            );
        });
    }

    #[test]
    fn c16_an_execution_that_reports_its_end_twice_counts_once_in_the_gauge() {
        recorded(|snapshotter| async move {
            let metrics = Metrics::new("memory");
            let idem = Idempotency::new(MemoryStore::new());
            let first = request(&idem, "key-1", b"{}");
            let second = request(&idem, "key-2", b"{}");
            metrics.observe(&Event::new(EventKind::Acquired).about(first.id()));
            metrics.observe(&Event::new(EventKind::Acquired).about(second.id()));
            // A renewal finds the lease lost, then the completion finds it again.
            metrics.observe(&Event::new(EventKind::LeaseLost).about(first.id()));
            metrics.observe(&Event::new(EventKind::LeaseLost).about(first.id()));
            assert_eq!(metrics.in_progress(), 1);
            let end = Event::new(EventKind::OutcomeUnknown)
                .about(second.id())
                .failed(&Error::LeaseLost);
            metrics.observe(&end);
            assert_eq!(metrics.in_progress(), 0);
            let seen = Seen::now(&snapshotter);
            // The counter counts the events as they are (C16): one per event.
            seen.assert_outcomes(&[("acquired", 2), ("lease_lost", 2), ("outcome_unknown", 1)]);
            assert_gauge_back_to_zero(&metrics, &seen);
        });
    }

    #[test]
    fn c16_metric_outcomes_are_event_names() {
        // OUTCOMES is part of the one list, in its order, without the events that are no
        // request's outcome.
        let positions: Vec<usize> = OUTCOMES
            .iter()
            .map(|kind| {
                EventKind::ALL
                    .iter()
                    .position(|k| k == kind)
                    .expect("an event kind")
            })
            .collect();
        assert!(
            positions.windows(2).all(|w| w[0] < w[1]),
            "in the order of ALL"
        );
        assert!(!OUTCOMES.contains(&EventKind::StoreCall));
        assert!(!OUTCOMES.contains(&EventKind::Purged));
        for kind in OUTCOMES {
            assert!(
                kind.is_acquisition() || kind.ends_execution() || kind.is_answer(),
                "{kind}"
            );
        }
        for kind in EventKind::ALL {
            assert!(
                !(kind.is_acquisition() || kind.ends_execution()) || OUTCOMES.contains(kind),
                "{kind} moves the gauge, so it is an outcome"
            );
        }

        recorded(|snapshotter| async move {
            let (idem, _metrics) = engine(MemoryStore::new());
            // The engine's own events...
            let first = request(&idem, "key-1", b"{}");
            let lease = acquire(&idem, &first).await;
            complete(&idem, lease).await;
            assert!(answer(&idem, &first).await.is_replay());
            // ... and one of every kind.
            let metrics = Metrics::new("memory");
            let other = request(&idem, "key-2", b"{}");
            for kind in EventKind::ALL {
                let event = Event::new(*kind).about(other.id()).with_count(1);
                metrics.observe(&event.of(Operation::Reserve));
            }
            let seen = Seen::now(&snapshotter);
            let mut values: Vec<&str> = Vec::new();
            for row in seen.rows(REQUESTS_TOTAL) {
                for (key, value) in &row.labels {
                    if key == "outcome" {
                        let kind = EventKind::from_name(value);
                        assert!(kind.is_some(), "{value} is no event name");
                        assert!(kind.is_some_and(|k| OUTCOMES.contains(&k)), "{value}");
                        values.push(value);
                    }
                }
            }
            values.sort_unstable();
            values.dedup();
            let mut names: Vec<&str> = OUTCOMES.iter().map(|k| k.name()).collect();
            names.sort_unstable();
            assert_eq!(values, names, "every outcome, and no other value");
            // The help text lists the same names.
            let rows = seen.rows(REQUESTS_TOTAL);
            let description = rows
                .first()
                .and_then(|r| r.description.clone())
                .expect("described");
            for name in names {
                assert!(description.contains(name), "{name} in {description}");
            }
        });
    }
}
