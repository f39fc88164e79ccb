//! Retrying clients under a fault: many tasks, each sending one key after another and retrying
//! each until it is answered, every handler run counted per key; and what the run saw: effects
//! per key, the slowest call, every store error with its time.
//! The handler-run counters and the give-up rule are the replay load's too (`replays.rs`).

use idem_core::{Answer, Error, Failure, Idempotency, Outcome, RunError, Store, StoredResponse};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How the clients behave.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clients {
    /// How many run at once.
    pub tasks: usize,
    /// How long a client waits before it retries an error or an in-flight answer.
    pub retry: Duration,
    /// How long one call may take before the run counts it as a hang.
    pub hang: Duration,
    /// How long a client keeps retrying its last key once the run is stopped.
    pub give_up: Duration,
}

/// What a run saw.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// Handler runs per key.
    pub effects: HashMap<String, usize>,
    /// When each key's handler first ran.
    pub first_run: HashMap<String, Instant>,
    /// Keys answered (executed or replayed), and the keys never answered.
    pub answered: usize,
    pub unanswered: Vec<String>,
    /// Calls made, and the slowest one.
    pub calls: usize,
    pub slowest: Duration,
    /// The slowest call refused by the store before its handler ran (a 503).
    pub slowest_refusal: Duration,
    /// Calls that took longer than [`Clients::hang`] (cut off by the client).
    pub hangs: usize,
    /// When each failed call ended, and its error.
    pub errors: Vec<(Instant, String)>,
    /// When each call that was answered ended.
    pub answers: Vec<Instant>,
}

impl Seen {
    /// Keys whose handler ran more than once.
    pub(crate) fn duplicates(&self) -> Vec<(&String, &usize)> {
        let mut twice: Vec<_> = self.effects.iter().filter(|(_, n)| **n > 1).collect();
        twice.sort();
        twice
    }

    /// How long after `ended` the last error came (zero if none did).
    pub(crate) fn recovery_after(&self, ended: Instant) -> Duration {
        last_error_after(&self.errors, ended)
    }

    /// Calls answered after `at`.
    pub(crate) fn answered_after(&self, at: Instant) -> usize {
        self.answers.iter().filter(|a| **a > at).count()
    }

    /// One line for the test's output.
    pub(crate) fn summary(&self, fault_ended: Instant) -> String {
        let last_error = self
            .errors
            .last()
            .map(|(_, e)| e.as_str())
            .unwrap_or("none");
        format!(
            "{} keys, {} answered, {} unanswered, {} with more than one effect; {} calls, slowest {:?} (a 503: {:?}), {} hangs; {} errors, the last {:?} after the fault ended ({}); {} answers after the fault ended",
            self.effects.len(),
            self.answered,
            self.unanswered.len(),
            self.duplicates().len(),
            self.calls,
            self.slowest,
            self.slowest_refusal,
            self.hangs,
            self.errors.len(),
            self.recovery_after(fault_ended),
            last_error,
            self.answered_after(fault_ended),
        )
    }
}

/// How long after `at` the last of `errors` came (zero if none did).
pub(crate) fn last_error_after(errors: &[(Instant, String)], at: Instant) -> Duration {
    errors
        .iter()
        .map(|(error_at, _)| error_at.saturating_duration_since(at))
        .max()
        .unwrap_or_default()
}

/// One key's handler runs: how many, and when the first began.
#[derive(Default)]
pub(crate) struct Runs {
    count: AtomicUsize,
    first: std::sync::OnceLock<Instant>,
}

impl Runs {
    /// Counts one run of the handler, beginning now; how many ran before it.
    pub(crate) fn count_one(&self) -> usize {
        self.first.get_or_init(Instant::now);
        self.count.fetch_add(1, Ordering::SeqCst)
    }
}

/// Each key's handler runs.
#[derive(Default)]
pub(crate) struct Counters(Mutex<HashMap<String, Arc<Runs>>>);

impl Counters {
    /// The runs of `key`'s handler, counted from now on.
    pub(crate) fn key(&self, key: &str) -> Arc<Runs> {
        let runs = Arc::new(Runs::default());
        lock(&self.0).insert(key.to_owned(), Arc::clone(&runs));
        runs
    }

    /// Handler runs per key, and when each key's first run began.
    pub(crate) fn effects_and_first_runs(
        &self,
    ) -> (HashMap<String, usize>, HashMap<String, Instant>) {
        let counters = lock(&self.0);
        let effects = counters
            .iter()
            .map(|(key, runs)| (key.clone(), runs.count.load(Ordering::SeqCst)))
            .collect();
        let first_run = counters
            .iter()
            .filter_map(|(key, runs)| Some((key.clone(), *runs.first.get()?)))
            .collect();
        (effects, first_run)
    }
}

/// Whether a client has kept its key past the load's stop longer than `give_up`;
/// `stopped_at` keeps when it first saw the stop.
pub(crate) fn gave_up(
    stop: &AtomicBool,
    stopped_at: &mut Option<Instant>,
    give_up: Duration,
) -> bool {
    if !stop.load(Ordering::SeqCst) {
        return false;
    }
    stopped_at.get_or_insert_with(Instant::now).elapsed() > give_up
}

/// A running load: stop it to get what it saw.
pub(crate) struct Load {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    counters: Arc<Counters>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Locks `m`, poisoned or not (a client that panicked has already failed the test).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Load {
    /// Starts `clients` against `idem`, their keys under `consumer`.
    pub(crate) fn start<S: Store + 'static>(
        idem: &Idempotency<S>,
        consumer: &str,
        clients: Clients,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let counters = Arc::new(Counters::default());
        let tasks = (0..clients.tasks)
            .map(|task| {
                let (idem, stop, seen) = (idem.clone(), Arc::clone(&stop), Arc::clone(&seen));
                let counters = Arc::clone(&counters);
                let consumer = consumer.to_owned();
                tokio::spawn(async move {
                    let mut n = 0;
                    while !stop.load(Ordering::SeqCst) {
                        let key = format!("c{task}-{n}");
                        n += 1;
                        client(&idem, &consumer, &key, clients, &stop, &seen, &counters).await;
                    }
                })
            })
            .collect();
        Self {
            stop,
            seen,
            counters,
            tasks,
        }
    }

    /// Stops the clients (each finishes its key, or gives up on it), waits for the executions
    /// still running on `idem` (at most ten seconds), and returns what the clients saw.
    pub(crate) async fn stop<S: Store + 'static>(self, idem: &Idempotency<S>) -> Seen {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await.expect("a client task");
        }
        let drained = tokio::time::timeout(Duration::from_secs(10), idem.drain()).await;
        assert!(
            drained.is_ok(),
            "executions still running ten seconds after the load"
        );
        let mut seen = std::mem::take(&mut *lock(&self.seen));
        (seen.effects, seen.first_run) = self.counters.effects_and_first_runs();
        seen.answered = seen.effects.len() - seen.unanswered.len();
        seen
    }
}

/// One client's key: sent until it is answered (executed or replayed), then once more, which
/// must not run it again. Its handler counts its runs in a counter of the key's own, read when
/// the load stops: an execution that outlives a call cut off by the client still counts.
async fn client<S: Store + 'static>(
    idem: &Idempotency<S>,
    consumer: &str,
    key: &str,
    clients: Clients,
    stop: &AtomicBool,
    seen: &Mutex<Seen>,
    counters: &Counters,
) {
    let request = idem
        .request(consumer, "POST", "/v1/notifications")
        .key(Some(key))
        .body(b"{}")
        .build()
        .expect("a valid request");
    let runs = counters.key(key);
    let mut stopped_at = None;
    let mut answers = 0;
    while answers < 2 {
        if gave_up(stop, &mut stopped_at, clients.give_up) {
            lock(seen).unanswered.push(key.to_owned());
            return;
        }
        let runs = Arc::clone(&runs);
        let asked = Instant::now();
        let result = tokio::time::timeout(
            clients.hang,
            idem.run(&request, move |_| async move {
                runs.count_one();
                Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "sent"))
            }),
        )
        .await;
        let answered = lock(seen).record(key, asked, result, clients);
        if answered {
            answers += 1;
        } else {
            tokio::time::sleep(clients.retry).await;
        }
    }
}

impl Seen {
    /// Counts one call that began at `asked`; whether it was answered (executed or replayed).
    fn record(
        &mut self,
        key: &str,
        asked: Instant,
        result: Result<Result<Outcome, RunError<std::io::Error>>, tokio::time::error::Elapsed>,
        clients: Clients,
    ) -> bool {
        let now = Instant::now();
        let took = now - asked;
        self.calls += 1;
        self.slowest = self.slowest.max(took);
        match result {
            Err(_) => {
                self.hangs += 1;
                self.errors
                    .push((now, format!("a call hung past {:?}", clients.hang)));
                false
            }
            Ok(Ok(Outcome::Executed(_) | Outcome::Answered(Answer::Replay(_)))) => {
                self.answers.push(now);
                true
            }
            Ok(Ok(Outcome::Answered(Answer::InFlight { .. }))) => false,
            Ok(Ok(other)) => panic!("{key}: {other:?}"),
            Ok(Err(RunError::Idem(error))) => {
                assert!(
                    error.is_retryable() && matches!(error, Error::Store(_)),
                    "{key}: a store error must be retryable: {error}"
                );
                self.slowest_refusal = self.slowest_refusal.max(took);
                self.errors.push((now, error.to_string()));
                false
            }
            Ok(Err(error)) => {
                assert!(
                    !matches!(&error, RunError::Unknown { response, .. } if response.status < 500),
                    "{key}: once the effect may have run, never a 4xx: {error}"
                );
                self.errors.push((now, error.to_string()));
                false
            }
        }
    }
}
