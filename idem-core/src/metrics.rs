//! Metrics through the [`metrics`] facade (feature `metrics`, off by default): [`Metered`], a
//! store decorator that counts what the store answers and times every call.
//!
//! Wrap the store and give the wrapper to the engine; everything else stays the same:
//!
//! ```
//! use idem_core::metrics::Metered;
//! use idem_core::{Begin, Idempotency, StoredResponse};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), idem_core::Error> {
//! # let store = idem_core::MemoryStore::new();
//! // `store` is the backend: an idem_sqlite::SqliteStore here, or a PgStore, a RedisStore...
//! let idem = Idempotency::new(Metered::new(store, "sqlite"));
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
//! `metrics-exporter-opentelemetry`. [`Metered::new`] describes the metrics (units and help
//! texts) to the recorder installed at that time; call [`describe`] again if the recorder is
//! installed later.
//!
//! # Metrics
//!
//! | name | type | unit | labels | counts |
//! |---|---|---|---|---|
//! | `idem_requests_total` | counter | requests | `store`, `route`, `outcome` | the store's answers, by outcome (below) |
//! | `idem_store_errors_total` | counter | errors | `store`, `operation`, `kind` | calls that failed, by operation and kind (below) |
//! | `idem_store_duration_seconds` | histogram | seconds | `store`, `operation` | the time of every store call, failed or not |
//! | `idem_purged_total` | counter | records | `store` | expired records deleted by `purge_expired` |
//! | `idem_in_progress` | gauge | reservations | `store`, `route` | reservations this process holds (below) |
//!
//! Labels:
//!
//! - `store`: the name given to [`Metered::new`] (`"postgres"`, `"sqlite"`...).
//! - `route`: the record's route, `"METHOD route"` as the request was built
//!   (`"POST /v1/charges"`; with the HTTP layer on axum, the matched template, such as
//!   `"POST /customers/{id}/refunds"`). Routes are templates, so the label is bounded; if yours
//!   are concrete paths carrying ids, turn it off with [`Metered::with_route_label`]`(false)`,
//!   and the metrics that have it are recorded without it.
//! - `outcome` of `idem_requests_total`, one count per store answer:
//!
//!   | outcome | when |
//!   |---|---|
//!   | `acquired` | `reserve` wrote a reservation for a fresh key |
//!   | `taken_over` | `reserve` replaced an expired record: an orphan whose lease passed (a takeover) or a completed record past its retention (a start over) |
//!   | `replayed` | `reserve` answered a replay of a completed request |
//!   | `in_flight` | `reserve` answered that the request is still running |
//!   | `mismatch` | `reserve` answered that the key was used for another request |
//!   | `executed` | a completion was stored (the handler's response, or a stored 500 when its outcome is unknown) |
//!   | `released` | a reservation was given back so that a retry can run |
//!   | `lease_lost` | the store refused a fenced `complete`, `release` or `renew`: the lease no longer holds ([`Error::LeaseLost`]) |
//!
//! - `operation`: `reserve`, `complete`, `release`, `renew`, `purge`, `lookup`, `list` or
//!   `stats`, the [`Store`] method called.
//! - `kind` of `idem_store_errors_total`: `unavailable`, `transaction_conflict`,
//!   `misconfigured`, `other` (the [`StoreErrorKind`] of an [`Error::Store`]), `corrupt_record`
//!   ([`Error::CorruptRecord`]), or `invalid_input` (a store refusing input, rare). A lost lease
//!   is an outcome, not an error.
//!
//! No metric carries the idempotency key or the consumer: their number has no bound.
//!
//! # The gauge of reservations in progress
//!
//! The stores cannot count their in-progress records cheaply, so `idem_in_progress` is kept by
//! the decorator, for **this process's own executions**: it goes up when this process acquires
//! or takes over a reservation, and down when that reservation ends here: completed, released,
//! refused as lost, or passed its deadline without being renewed (noticed at the next call
//! through the decorator, within a second). It does not count records left in progress by
//! processes that crashed (orphans, until a retry takes them over or a purge deletes them),
//! nor other processes' executions: sum it over the processes for a fleet. The value is set,
//! not incremented, so give each `Metered` in a process its own store name.
//!
//! # Completions written in the effect's transaction
//!
//! A SQL store's `complete_in` writes the completion inside the caller's transaction, around
//! this decorator (reach the store with [`Metered::inner`]). With [`Idempotency::run`](
//! crate::Idempotency::run) such a completion is counted as `executed` when the engine checks
//! it (its `lookup`); in guard style, call [`Metered::record_completed`] after the commit.
//! Either way it is counted once.

use crate::answer::Answer;
use crate::begin::Begin;
use crate::clock::Timestamp;
use crate::completion::Completion;
use crate::decision::Acquire;
use crate::error::{Error, StoreErrorKind};
use crate::lease::{deadline_after, Lease};
use crate::record::{Record, RecordState};
use crate::request::Request;
use crate::scope::RecordId;
use crate::store::{Capabilities, ListQuery, Page, Stats, Store};
use crate::token::FencingToken;
use async_trait::async_trait;
use metrics::{Label, Unit};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Counter of the store's answers: labels `store`, `route`, `outcome`.
pub const REQUESTS_TOTAL: &str = "idem_requests_total";
/// Counter of failed store calls: labels `store`, `operation`, `kind`.
pub const STORE_ERRORS_TOTAL: &str = "idem_store_errors_total";
/// Histogram of store call durations in seconds: labels `store`, `operation`.
pub const STORE_DURATION_SECONDS: &str = "idem_store_duration_seconds";
/// Counter of expired records deleted by `purge_expired`: label `store`.
pub const PURGED_TOTAL: &str = "idem_purged_total";
/// Gauge of the reservations this process holds: labels `store`, `route`.
pub const IN_PROGRESS: &str = "idem_in_progress";

/// How often reservations whose lease passed unrenewed leave the gauge, at most.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Describes the metrics (unit, help text) to the current recorder. [`Metered::new`] calls it;
/// call it again if the recorder is installed after the store was wrapped.
pub fn describe() {
    metrics::describe_counter!(
        REQUESTS_TOTAL,
        Unit::Count,
        "Answers of the idempotency store, by outcome: acquired, taken_over, replayed, in_flight, mismatch, executed, released, lease_lost."
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
    metrics::describe_gauge!(
        IN_PROGRESS,
        Unit::Count,
        "Idempotency reservations held by this process's executions."
    );
}

/// A [`Store`] that records metrics around each call of the store it wraps, then answers as
/// that store answered: the names, units and labels are in the [module docs](self).
///
/// ```
/// use idem_core::metrics::Metered;
/// use idem_core::{Idempotency, MemoryStore};
/// let store = Metered::new(MemoryStore::new(), "memory").with_route_label(false);
/// assert!(store.inner().is_empty());
/// let idem = Idempotency::new(store);
/// # let _ = idem;
/// ```
pub struct Metered<S> {
    inner: S,
    store: &'static str,
    route_label: bool,
    sweep_every: Duration,
    held: Mutex<Held>,
}

/// The reservations this process holds, for the gauge.
#[derive(Default)]
struct Held {
    leases: HashMap<FencingToken, Holding>,
    /// How many are held per route label (`None` when the route label is off).
    per_route: HashMap<Option<String>, u64>,
    next_sweep: Option<Instant>,
}

struct Holding {
    route: Option<String>,
    /// When the lease passes unless renewed, by this process's monotonic clock.
    deadline: Instant,
}

impl<S> Metered<S> {
    /// Wraps `inner`, labelling its metrics `store="{store}"`, with the route label on; describes
    /// the metrics to the current recorder.
    pub fn new(inner: S, store: &'static str) -> Self {
        describe();
        Self {
            inner,
            store,
            route_label: true,
            sweep_every: SWEEP_EVERY,
            held: Mutex::new(Held::default()),
        }
    }

    /// Whether the metrics that have a `route` label carry it (on by default). Turn it off when
    /// the routes given to requests are concrete paths rather than templates.
    pub fn with_route_label(mut self, on: bool) -> Self {
        self.route_label = on;
        self
    }

    /// The wrapped store (for its own methods, such as a SQL store's `complete_in`).
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The wrapped store, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// Counts a completion that the caller wrote itself, inside its own transaction (a SQL
    /// store's `complete_in`), once that transaction has committed: `executed`, and the
    /// reservation leaves the gauge. A completion already counted (or a reservation this
    /// decorator did not hand out) is not counted again.
    pub fn record_completed(&self, completion: &Completion) {
        if self.let_go(&completion.token()) {
            self.count(completion.id(), "executed");
        }
    }

    fn route(&self, id: &RecordId) -> Option<String> {
        self.route_label.then(|| id.route().to_owned())
    }

    fn count(&self, id: &RecordId, outcome: &'static str) {
        let mut labels = Vec::with_capacity(3);
        labels.push(Label::new("store", self.store));
        if let Some(route) = self.route(id) {
            labels.push(Label::new("route", route));
        }
        labels.push(Label::new("outcome", outcome));
        metrics::counter!(REQUESTS_TOTAL, labels).increment(1);
    }

    fn failed(&self, operation: &'static str, error: &Error) {
        metrics::counter!(
            STORE_ERRORS_TOTAL,
            "store" => self.store,
            "operation" => operation,
            "kind" => error_kind(error)
        )
        .increment(1);
    }

    /// Starts timing a call of `operation`; lets go of the reservations whose lease passed.
    fn timer(&self, operation: &'static str) -> Timer {
        let started = Instant::now();
        self.sweep(&mut self.held(), started);
        Timer {
            store: self.store,
            operation,
            started,
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

    /// A reservation handed out by the store through this decorator, held until `deadline`.
    fn hold(&self, lease: &Lease, deadline: Instant) {
        let route = self.route(lease.id());
        let mut held = self.held();
        let holding = Holding {
            route: route.clone(),
            deadline,
        };
        if let Some(previous) = held.leases.insert(lease.token(), holding) {
            // A token is never handed out twice; were it, it is still counted once.
            held.forget(previous.route);
        }
        *held.per_route.entry(route.clone()).or_insert(0) += 1;
        self.set_gauge(&held, route);
    }

    /// A renewal of the reservation `token` until `deadline`.
    fn renewed(&self, token: &FencingToken, deadline: Instant) {
        if let Some(holding) = self.held().leases.get_mut(token) {
            holding.deadline = deadline;
        }
    }

    /// The reservation `token` ended here; whether it was held (and counted) until now.
    fn let_go(&self, token: &FencingToken) -> bool {
        let mut held = self.held();
        let Some(holding) = held.leases.remove(token) else {
            return false;
        };
        held.forget(holding.route.clone());
        self.set_gauge(&held, holding.route);
        true
    }

    /// Lets go of the reservations whose lease passed unrenewed, at most every `sweep_every`.
    fn sweep(&self, held: &mut Held, now: Instant) {
        if held.next_sweep.is_some_and(|next| now < next) {
            return;
        }
        held.next_sweep = now.checked_add(self.sweep_every);
        let passed: Vec<FencingToken> = held
            .leases
            .iter()
            .filter(|(_, holding)| holding.deadline <= now)
            .map(|(token, _)| *token)
            .collect();
        for token in passed {
            if let Some(holding) = held.leases.remove(&token) {
                held.forget(holding.route.clone());
                self.set_gauge(held, holding.route);
            }
        }
    }
}

impl Held {
    /// One reservation fewer under `route`.
    fn forget(&mut self, route: Option<String>) {
        if let Some(count) = self.per_route.get_mut(&route) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.per_route.remove(&route);
            }
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Metered<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metered")
            .field("inner", &self.inner)
            .field("store", &self.store)
            .field("route_label", &self.route_label)
            .field("in_progress", &self.held().leases.len())
            .finish()
    }
}

/// Records the duration of one store call when dropped, so that a call whose caller gave up
/// (a timeout dropping the future) is timed too.
struct Timer {
    store: &'static str,
    operation: &'static str,
    started: Instant,
}

impl Drop for Timer {
    fn drop(&mut self) {
        metrics::histogram!(
            STORE_DURATION_SECONDS,
            "store" => self.store,
            "operation" => self.operation
        )
        .record(self.started.elapsed().as_secs_f64());
    }
}

/// The `kind` label of a failed call.
fn error_kind(error: &Error) -> &'static str {
    match error {
        Error::Store(e) => match e.kind() {
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::TransactionConflict => "transaction_conflict",
            StoreErrorKind::Misconfigured => "misconfigured",
            StoreErrorKind::Other => "other",
        },
        Error::CorruptRecord(_) => "corrupt_record",
        Error::InvalidInput { .. } | Error::BodyTooLarge { .. } => "invalid_input",
        // Only the fenced operations may lose a lease; from any other it is the store's fault.
        Error::LeaseLost => "other",
    }
}

#[async_trait]
impl<S: Store> Store for Metered<S> {
    async fn reserve(&self, request: &Request, lease_for: Duration) -> Result<Begin, Error> {
        let timer = self.timer("reserve");
        let result = self.inner.reserve(request, lease_for).await;
        let id = request.id();
        match &result {
            Ok(Begin::Acquired(lease)) => {
                self.count(
                    id,
                    match lease.acquired() {
                        Acquire::Fresh => "acquired",
                        Acquire::TakeOver { .. } | Acquire::StartOver { .. } => "taken_over",
                    },
                );
                self.hold(lease, deadline_after(timer.started, lease_for));
            }
            Ok(Begin::Answered(answer)) => self.count(
                id,
                match answer {
                    Answer::Replay(_) => "replayed",
                    Answer::InFlight { .. } => "in_flight",
                    Answer::Mismatch => "mismatch",
                },
            ),
            Err(error) => self.failed("reserve", error),
        }
        result
    }

    async fn complete(&self, completion: &Completion) -> Result<(), Error> {
        let _timer = self.timer("complete");
        let result = self.inner.complete(completion).await;
        match &result {
            Ok(()) => {
                self.count(completion.id(), "executed");
                self.let_go(&completion.token());
            }
            Err(Error::LeaseLost) => {
                // A completion sent again because its first answer was lost (a timeout) finds
                // its own record completed, and the store refuses it: it landed all the same.
                // One read, on this rare path, tells it from a lease that was really lost.
                let landed = matches!(
                    self.inner.lookup(completion.id()).await,
                    Ok(Some(record)) if record.is_completed_by(&completion.token())
                );
                self.count(
                    completion.id(),
                    if landed { "executed" } else { "lease_lost" },
                );
                self.let_go(&completion.token());
            }
            Err(error) => self.failed("complete", error),
        }
        result
    }

    async fn release(&self, lease: &Lease) -> Result<(), Error> {
        let _timer = self.timer("release");
        let result = self.inner.release(lease).await;
        match &result {
            Ok(()) => {
                self.count(lease.id(), "released");
                self.let_go(&lease.token());
            }
            Err(Error::LeaseLost) => {
                self.count(lease.id(), "lease_lost");
                self.let_go(&lease.token());
            }
            Err(error) => self.failed("release", error),
        }
        result
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<Timestamp, Error> {
        let timer = self.timer("renew");
        let result = self.inner.renew(lease, lease_for).await;
        match &result {
            Ok(_) => self.renewed(&lease.token(), deadline_after(timer.started, lease_for)),
            Err(Error::LeaseLost) => {
                self.count(lease.id(), "lease_lost");
                self.let_go(&lease.token());
            }
            Err(error) => self.failed("renew", error),
        }
        result
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, Error> {
        let _timer = self.timer("purge");
        let result = self.inner.purge_expired(limit).await;
        match &result {
            Ok(purged) => metrics::counter!(PURGED_TOTAL, "store" => self.store)
                .increment(u64::try_from(*purged).unwrap_or(u64::MAX)),
            Err(error) => self.failed("purge", error),
        }
        result
    }

    async fn lookup(&self, id: &RecordId) -> Result<Option<Record>, Error> {
        let _timer = self.timer("lookup");
        let result = self.inner.lookup(id).await;
        match &result {
            // A reservation of ours found completed: completed around the decorator, in the
            // caller's transaction (the engine checks such a completion with this lookup).
            Ok(Some(record)) if matches!(record.state, RecordState::Completed { .. }) => {
                if self.let_go(&record.token) {
                    self.count(id, "executed");
                }
            }
            Ok(_) => {}
            Err(error) => self.failed("lookup", error),
        }
        result
    }

    async fn list(&self, query: &ListQuery) -> Result<Page, Error> {
        let _timer = self.timer("list");
        let result = self.inner.list(query).await;
        if let Err(error) = &result {
            self.failed("list", error);
        }
        result
    }

    async fn stats(&self) -> Result<Stats, Error> {
        let _timer = self.timer("stats");
        let result = self.inner.stats().await;
        if let Err(error) = &result {
            self.failed("stats", error);
        }
        result
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::engine::Idempotency;
    use crate::memory::MemoryStore;
    use crate::response::StoredResponse;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
    use std::future::Future;

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
        described: bool,
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
                        described: description.is_some(),
                        value,
                    }),
                }
            }
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

        /// `idem_in_progress{store="memory", route=ROUTE}` after a fresh snapshot: the value
        /// last set since the previous snapshot, or 0 when none was.
        fn in_progress(&mut self, snapshotter: &Snapshotter) -> f64 {
            self.take(snapshotter);
            self.gauge(IN_PROGRESS, &[("store", "memory"), ("route", ROUTE)])
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
                assert!(row.described, "{name}: described");
                for (_, value) in &row.labels {
                    assert!(!value.contains(CONSUMER), "{name}: the consumer in {row:?}");
                    assert!(!value.contains("key-"), "{name}: a key in {row:?}");
                }
            }
            rows.len()
        }
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

    fn outcome(outcome: &'static str) -> [(&'static str, &'static str); 3] {
        [("store", "memory"), ("route", ROUTE), ("outcome", outcome)]
    }

    #[test]
    fn requests_total_counts_each_outcome_by_store_route_and_outcome() {
        recorded(|snapshotter| async move {
            let clock = ManualClock::new(Timestamp::from_millis(1_000));
            let store = Metered::new(MemoryStore::with_clock(clock.clone()), "memory");
            let idem = Idempotency::new(store);

            // acquired, in_flight, mismatch, executed, replayed
            let first = request(&idem, "key-1", b"{}");
            let lease = acquire(&idem, &first).await;
            assert!(matches!(
                answer(&idem, &first).await,
                Answer::InFlight { .. }
            ));
            let other = request(&idem, "key-1", b"{\"other\":1}");
            assert_eq!(answer(&idem, &other).await, Answer::Mismatch);
            idem.complete(lease, StoredResponse::new(201, "ok"))
                .await
                .expect("complete");
            assert!(answer(&idem, &first).await.is_replay());

            // acquired, released
            let second = request(&idem, "key-2", b"{}");
            let lease = acquire(&idem, &second).await;
            idem.release(lease).await.expect("release");

            // acquired, then taken over after the lease; the old holder's renew and complete
            // are refused (lease_lost twice), the new holder's completion lands (executed).
            let third = request(&idem, "key-3", b"{}");
            let mut old = acquire(&idem, &third).await;
            clock.advance(idem.policy().lease + Duration::from_secs(1));
            let new = acquire(&idem, &third).await;
            assert!(matches!(old.acquired(), Acquire::Fresh));
            assert!(matches!(new.acquired(), Acquire::TakeOver { .. }));
            assert!(matches!(idem.renew(&mut old).await, Err(Error::LeaseLost)));
            assert!(matches!(
                idem.complete(old, StoredResponse::new(201, "late")).await,
                Err(Error::LeaseLost)
            ));
            idem.complete(new, StoredResponse::new(201, "ok"))
                .await
                .expect("complete");

            // a start over after the retention is counted as taken_over too
            clock.advance(idem.policy().retention + Duration::from_secs(1));
            let again = acquire(&idem, &first).await;
            assert!(matches!(again.acquired(), Acquire::StartOver { .. }));
            idem.release(again).await.expect("release");

            let mut seen = Seen::default();
            seen.take(&snapshotter);
            let expected = [
                ("acquired", 3),
                ("taken_over", 2),
                ("replayed", 1),
                ("in_flight", 1),
                ("mismatch", 1),
                ("executed", 2),
                ("released", 2),
                ("lease_lost", 2),
            ];
            for (name, count) in expected {
                assert_eq!(
                    seen.counter(REQUESTS_TOTAL, &outcome(name)),
                    count,
                    "{name}"
                );
            }
            let rows =
                seen.assert_labels(REQUESTS_TOTAL, &["store", "route", "outcome"], Unit::Count);
            assert_eq!(rows, expected.len(), "no other outcome");
            assert!(
                seen.rows(STORE_ERRORS_TOTAL).is_empty(),
                "a lost lease is no store error"
            );
        });
    }

    #[test]
    fn requests_total_without_the_route_label() {
        recorded(|snapshotter| async move {
            let store = Metered::new(MemoryStore::new(), "memory").with_route_label(false);
            let idem = Idempotency::new(store);
            let first = request(&idem, "key-1", b"{}");
            let lease = acquire(&idem, &first).await;
            idem.complete(lease, StoredResponse::new(201, "ok"))
                .await
                .expect("complete");
            let _held = acquire(&idem, &request(&idem, "key-2", b"{}")).await;
            let mut seen = Seen::default();
            seen.take(&snapshotter);
            let labels = [("store", "memory"), ("outcome", "acquired")];
            assert_eq!(seen.counter(REQUESTS_TOTAL, &labels), 2);
            let labels = [("store", "memory"), ("outcome", "executed")];
            assert_eq!(seen.counter(REQUESTS_TOTAL, &labels), 1);
            seen.assert_labels(REQUESTS_TOTAL, &["store", "outcome"], Unit::Count);
            assert_eq!(seen.gauge(IN_PROGRESS, &[("store", "memory")]), 1.0);
            seen.assert_labels(IN_PROGRESS, &["store"], Unit::Count);
        });
    }

    /// Makes the error a [`Failing`] store fails with.
    type Fail = fn() -> Error;

    /// A store whose every call fails with the error its `Fail` makes.
    struct Failing(Fail);

    #[async_trait]
    impl Store for Failing {
        async fn reserve(&self, _: &Request, _: Duration) -> Result<Begin, Error> {
            Err((self.0)())
        }
        async fn complete(&self, _: &Completion) -> Result<(), Error> {
            Err((self.0)())
        }
        async fn release(&self, _: &Lease) -> Result<(), Error> {
            Err((self.0)())
        }
        async fn renew(&self, _: &Lease, _: Duration) -> Result<Timestamp, Error> {
            Err((self.0)())
        }
        async fn purge_expired(&self, _: usize) -> Result<usize, Error> {
            Err((self.0)())
        }
        async fn lookup(&self, _: &RecordId) -> Result<Option<Record>, Error> {
            Err((self.0)())
        }
        async fn list(&self, _: &ListQuery) -> Result<Page, Error> {
            Err((self.0)())
        }
        async fn stats(&self) -> Result<Stats, Error> {
            Err((self.0)())
        }
    }

    #[test]
    fn store_errors_total_counts_each_kind_by_store_operation_and_kind() {
        let kinds: [(&str, Fail); 6] = [
            ("unavailable", || {
                Error::store("failing", StoreErrorKind::Unavailable, "down")
            }),
            ("transaction_conflict", || {
                Error::store("failing", StoreErrorKind::TransactionConflict, "40001")
            }),
            ("misconfigured", || {
                Error::store("failing", StoreErrorKind::Misconfigured, "no table")
            }),
            ("other", || {
                Error::store("failing", StoreErrorKind::Other, "oops")
            }),
            ("corrupt_record", || {
                Error::CorruptRecord("garbage".to_owned())
            }),
            ("invalid_input", || {
                Error::invalid(crate::Field::Response, "too large")
            }),
        ];
        recorded(|snapshotter| async move {
            for (_, fail) in kinds {
                let idem = Idempotency::new(Metered::new(Failing(fail), "failing"));
                let request = request(&idem, "key-1", b"{}");
                let lease = Lease::new(
                    &request,
                    FencingToken::generate(),
                    Timestamp::from_millis(60_000),
                    Acquire::Fresh,
                );
                let completion = idem.completion(&lease, StoredResponse::new(201, "ok"));
                let store = idem.store();
                assert!(idem.begin(&request).await.is_err());
                assert!(store.complete(&completion).await.is_err());
                assert!(store.release(&lease).await.is_err());
                assert!(store.renew(&lease, Duration::from_secs(1)).await.is_err());
                assert!(idem.purge_expired().await.is_err());
                assert!(store.lookup(request.id()).await.is_err());
                let query = ListQuery::in_progress(Duration::ZERO);
                assert!(store.list(&query).await.is_err());
                assert!(store.stats().await.is_err());
            }
            let mut seen = Seen::default();
            seen.take(&snapshotter);
            let operations = [
                "reserve", "complete", "release", "renew", "purge", "lookup", "list", "stats",
            ];
            for (kind, _) in kinds {
                for operation in operations {
                    let labels = [
                        ("store", "failing"),
                        ("operation", operation),
                        ("kind", kind),
                    ];
                    assert_eq!(seen.counter(STORE_ERRORS_TOTAL, &labels), 1, "{labels:?}");
                }
            }
            let rows = seen.assert_labels(
                STORE_ERRORS_TOTAL,
                &["store", "operation", "kind"],
                Unit::Count,
            );
            assert_eq!(rows, kinds.len() * operations.len());
            assert!(
                seen.rows(REQUESTS_TOTAL).is_empty(),
                "an error is no outcome"
            );
            // Failed calls are timed too.
            for operation in operations {
                let labels = [("store", "failing"), ("operation", operation)];
                let row = seen.row(STORE_DURATION_SECONDS, &labels).expect("timed");
                assert!(matches!(&row.value, DebugValue::Histogram(v) if v.len() == kinds.len()));
            }
        });
    }

    #[test]
    fn store_duration_seconds_times_each_operation_by_store_and_operation() {
        recorded(|snapshotter| async move {
            let idem = Idempotency::new(Metered::new(MemoryStore::new(), "memory"));
            let first = request(&idem, "key-1", b"{}");
            let mut lease = acquire(&idem, &first).await;
            idem.renew(&mut lease).await.expect("renew");
            idem.complete(lease, StoredResponse::new(201, "ok"))
                .await
                .expect("complete");
            let second = request(&idem, "key-2", b"{}");
            let lease = acquire(&idem, &second).await;
            idem.release(lease).await.expect("release");
            idem.purge_expired().await.expect("purge");
            idem.store().lookup(first.id()).await.expect("lookup");

            let mut seen = Seen::default();
            seen.take(&snapshotter);
            let calls = [
                ("reserve", 2),
                ("renew", 1),
                ("complete", 1),
                ("release", 1),
                ("purge", 1),
                ("lookup", 1),
            ];
            for (operation, count) in calls {
                let labels = [("store", "memory"), ("operation", operation)];
                let row = seen.row(STORE_DURATION_SECONDS, &labels).expect("timed");
                let DebugValue::Histogram(values) = &row.value else {
                    panic!("{operation}: not a histogram: {row:?}");
                };
                assert_eq!(values.len(), count, "{operation}");
                // In seconds: a call to a memory store takes far less than one.
                assert!(
                    values.iter().all(|v| (0.0..1.0).contains(&v.into_inner())),
                    "{operation}: {values:?}"
                );
            }
            let rows = seen.assert_labels(
                STORE_DURATION_SECONDS,
                &["store", "operation"],
                Unit::Seconds,
            );
            assert_eq!(rows, calls.len());
        });
    }

    #[test]
    fn purged_total_counts_deleted_records_by_store() {
        recorded(|snapshotter| async move {
            let clock = ManualClock::new(Timestamp::from_millis(1_000));
            let store = Metered::new(MemoryStore::with_clock(clock.clone()), "memory");
            let idem = Idempotency::new(store);
            for key in ["key-1", "key-2", "key-3"] {
                let lease = acquire(&idem, &request(&idem, key, b"{}")).await;
                idem.complete(lease, StoredResponse::new(201, "ok"))
                    .await
                    .expect("complete");
            }
            let _orphan = acquire(&idem, &request(&idem, "key-4", b"{}")).await;
            assert_eq!(idem.purge_expired().await.expect("purge"), 0);
            clock.advance(idem.policy().retention + Duration::from_secs(1));
            assert_eq!(idem.purge_expired().await.expect("purge"), 4);

            let mut seen = Seen::default();
            seen.take(&snapshotter);
            assert_eq!(seen.counter(PURGED_TOTAL, &[("store", "memory")]), 4);
            assert_eq!(seen.assert_labels(PURGED_TOTAL, &["store"], Unit::Count), 1);
        });
    }

    #[test]
    fn in_progress_gauge_follows_this_process_executions() {
        recorded(|snapshotter| async move {
            let clock = ManualClock::new(Timestamp::from_millis(1_000));
            let store = Metered::new(MemoryStore::with_clock(clock.clone()), "memory");
            let idem = Idempotency::new(store);
            let mut seen = Seen::default();
            // Held throughout: an unchanged gauge reads 0 in a snapshot, so every value checked
            // here must be one the decorator set.
            let _held = acquire(&idem, &request(&idem, "key-0", b"{}")).await;
            assert_eq!(seen.in_progress(&snapshotter), 1.0);

            let a = acquire(&idem, &request(&idem, "key-1", b"{}")).await;
            assert_eq!(seen.in_progress(&snapshotter), 2.0);
            let b = acquire(&idem, &request(&idem, "key-2", b"{}")).await;
            assert_eq!(seen.in_progress(&snapshotter), 3.0);
            idem.complete(a, StoredResponse::new(201, "ok"))
                .await
                .expect("complete");
            assert_eq!(seen.in_progress(&snapshotter), 2.0);
            idem.release(b).await.expect("release");
            assert_eq!(seen.in_progress(&snapshotter), 1.0);

            // A takeover in this process: both holders count until the old one is refused.
            let third = request(&idem, "key-3", b"{}");
            let old = acquire(&idem, &third).await;
            assert_eq!(seen.in_progress(&snapshotter), 2.0);
            clock.advance(idem.policy().lease + Duration::from_secs(1));
            let new = acquire(&idem, &third).await;
            assert_eq!(seen.in_progress(&snapshotter), 3.0);
            assert!(matches!(
                idem.complete(old, StoredResponse::new(201, "late")).await,
                Err(Error::LeaseLost)
            ));
            assert_eq!(seen.in_progress(&snapshotter), 2.0);
            idem.complete(new, StoredResponse::new(201, "ok"))
                .await
                .expect("complete");
            assert_eq!(seen.in_progress(&snapshotter), 1.0);
            assert_eq!(
                seen.assert_labels(IN_PROGRESS, &["store", "route"], Unit::Count),
                1
            );
        });
    }

    #[test]
    fn in_progress_gauge_lets_go_of_a_completion_written_around_the_decorator_once() {
        recorded(|snapshotter| async move {
            let idem = Idempotency::new(Metered::new(MemoryStore::new(), "memory"));
            let mut seen = Seen::default();
            let _held = acquire(&idem, &request(&idem, "key-0", b"{}")).await;

            // As a SQL store's complete_in in the engine's closure form: written around the
            // decorator, then found by the engine's lookup.
            let first = request(&idem, "key-1", b"{}");
            let lease = acquire(&idem, &first).await;
            assert_eq!(seen.in_progress(&snapshotter), 2.0);
            let completion = idem.completion(&lease, StoredResponse::new(201, "ok"));
            let inner = idem.store().inner();
            inner.complete(&completion).await.expect("complete");
            idem.store().lookup(first.id()).await.expect("lookup");
            assert_eq!(seen.in_progress(&snapshotter), 1.0);
            idem.store().lookup(first.id()).await.expect("lookup");
            idem.store().record_completed(&completion);

            // Guard style: counted by record_completed, once.
            let second = request(&idem, "key-2", b"{}");
            let lease = acquire(&idem, &second).await;
            assert_eq!(seen.in_progress(&snapshotter), 2.0);
            let completion = idem.completion(&lease, StoredResponse::new(201, "ok"));
            inner.complete(&completion).await.expect("complete");
            idem.store().record_completed(&completion);
            assert_eq!(seen.in_progress(&snapshotter), 1.0);
            idem.store().record_completed(&completion);
            idem.store().lookup(second.id()).await.expect("lookup");

            seen.take(&snapshotter);
            assert_eq!(seen.counter(REQUESTS_TOTAL, &outcome("executed")), 2);
        });
    }

    /// A memory store whose first completion is written but answered with an error, as when
    /// the answer of a committed completion is lost on the network.
    struct LostAnswer {
        inner: MemoryStore,
        lose: std::sync::atomic::AtomicBool,
    }

    #[async_trait]
    impl Store for LostAnswer {
        async fn reserve(&self, r: &Request, d: Duration) -> Result<Begin, Error> {
            self.inner.reserve(r, d).await
        }
        async fn complete(&self, c: &Completion) -> Result<(), Error> {
            self.inner.complete(c).await?;
            if self.lose.swap(false, std::sync::atomic::Ordering::SeqCst) {
                return Err(Error::store(
                    "lossy",
                    StoreErrorKind::Unavailable,
                    "timeout",
                ));
            }
            Ok(())
        }
        async fn release(&self, l: &Lease) -> Result<(), Error> {
            self.inner.release(l).await
        }
        async fn renew(&self, l: &Lease, d: Duration) -> Result<Timestamp, Error> {
            self.inner.renew(l, d).await
        }
        async fn purge_expired(&self, n: usize) -> Result<usize, Error> {
            self.inner.purge_expired(n).await
        }
        async fn lookup(&self, id: &RecordId) -> Result<Option<Record>, Error> {
            self.inner.lookup(id).await
        }
        async fn list(&self, q: &ListQuery) -> Result<Page, Error> {
            self.inner.list(q).await
        }
        async fn stats(&self) -> Result<Stats, Error> {
            self.inner.stats().await
        }
    }

    #[test]
    fn a_completion_whose_answer_was_lost_counts_executed_not_lease_lost() {
        recorded(|snapshotter| async move {
            let store = LostAnswer {
                inner: MemoryStore::new(),
                lose: std::sync::atomic::AtomicBool::new(true),
            };
            let idem = Idempotency::new(Metered::new(store, "memory"));
            let first = request(&idem, "key-1", b"{}");
            let lease = acquire(&idem, &first).await;
            let completion = idem.completion(&lease, StoredResponse::new(201, "ok"));
            assert!(idem.store().complete(&completion).await.is_err());
            // Sent again, as the engine does within the lease: refused, because it landed.
            assert!(matches!(
                idem.store().complete(&completion).await,
                Err(Error::LeaseLost)
            ));
            let mut seen = Seen::default();
            seen.take(&snapshotter);
            assert_eq!(seen.counter(REQUESTS_TOTAL, &outcome("executed")), 1);
            assert!(seen.row(REQUESTS_TOTAL, &outcome("lease_lost")).is_none());
            assert_eq!(seen.in_progress(&snapshotter), 0.0);

            // A lease really lost is still lease_lost.
            let other = request(&idem, "key-2", b"{}");
            let lease = acquire(&idem, &other).await;
            idem.store().release(&lease).await.expect("release");
            let late = idem.completion(&lease, StoredResponse::new(201, "late"));
            assert!(matches!(
                idem.store().complete(&late).await,
                Err(Error::LeaseLost)
            ));
            seen.take(&snapshotter);
            assert_eq!(seen.counter(REQUESTS_TOTAL, &outcome("lease_lost")), 1);
        });
    }

    #[test]
    fn in_progress_gauge_lets_go_of_a_lease_that_passed_unrenewed() {
        recorded(|snapshotter| async move {
            let mut store = Metered::new(MemoryStore::new(), "memory");
            store.sweep_every = Duration::ZERO;
            let idem = Idempotency::new(store);
            let mut seen = Seen::default();
            let _held = acquire(&idem, &request(&idem, "key-0", b"{}")).await;

            // A guard-style caller that dropped its lease: no completion, no release.
            let request = request(&idem, "key-1", b"{}");
            let reserved = idem.store().reserve(&request, Duration::from_millis(1));
            let Begin::Acquired(_dropped) = reserved.await.expect("reserve") else {
                panic!("not acquired");
            };
            assert_eq!(seen.in_progress(&snapshotter), 2.0);
            tokio::time::sleep(Duration::from_millis(5)).await;
            idem.purge_expired().await.expect("purge");
            assert_eq!(seen.in_progress(&snapshotter), 1.0);
        });
    }
}
