//! A replay-heavy load over several engines: each client sends a key until it is answered, then
//! again and again (so that answers dominate and the engines read first), each attempt on the
//! next engine. Every execution answers a body naming its key and its run, so a replay of
//! another key's or another run's answer is seen.

use super::load::{gave_up, last_error_after, lock, Counters};
use idem_core::{Answer, Failure, Idempotency, Outcome, RunError, Store, StoredResponse};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
pub(crate) struct Replays {
    pub tasks: usize,
    /// Answers each key gets before the client moves on.
    pub answers: usize,
    pub retry: Duration,
    pub hang: Duration,
    pub give_up: Duration,
}

#[derive(Debug, Default)]
pub(crate) struct Seen {
    pub effects: HashMap<String, usize>,
    pub first_run: HashMap<String, Instant>,
    /// Answers whose body names another key.
    pub foreign: Vec<String>,
    /// Keys answered with two different bodies though they ran once.
    pub inconsistent: Vec<String>,
    pub calls: usize,
    pub slowest: Duration,
    pub slowest_refusal: Duration,
    pub hangs: usize,
    pub errors: Vec<(Instant, String)>,
    pub answers: Vec<Instant>,
    pub unanswered: Vec<String>,
    /// Bodies each key was answered with, in order, and when.
    pub bodies: HashMap<String, Vec<(Instant, String)>>,
    /// Answers of a body after another body of the same key had been answered (a flip back
    /// to an older answer): key, when, the bodies in order.
    pub flips: Vec<(String, Instant, Vec<String>)>,
}

impl Seen {
    pub(crate) fn duplicates(&self) -> Vec<(String, usize)> {
        let mut d: Vec<_> = self
            .effects
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(k, n)| (k.clone(), *n))
            .collect();
        d.sort();
        d
    }

    pub(crate) fn recovery_after(&self, at: Instant) -> Duration {
        last_error_after(&self.errors, at)
    }

    pub(crate) fn summary(&self, at: Instant) -> String {
        let mut kinds: HashMap<String, usize> = HashMap::new();
        for (_, e) in &self.errors {
            let short: String = e.chars().take(90).collect();
            *kinds.entry(short).or_default() += 1;
        }
        let mut kinds: Vec<_> = kinds.into_iter().collect();
        kinds.sort_by_key(|kind| std::cmp::Reverse(kind.1));
        kinds.truncate(6);
        format!(
            "{} keys, {} calls, slowest {:?} (a 503 {:?}), {} hangs, {} errors (last {:?} after), \
             {} keys ran twice, {} foreign, {} inconsistent, {} flips, {} unanswered; errors: {kinds:?}",
            self.effects.len(),
            self.calls,
            self.slowest,
            self.slowest_refusal,
            self.hangs,
            self.errors.len(),
            self.recovery_after(at),
            self.duplicates().len(),
            self.foreign.len(),
            self.inconsistent.len(),
            self.flips.len(),
            self.unanswered.len(),
        )
    }
}

pub(crate) struct Load {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    counters: Arc<Counters>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    pub(crate) fn start<S: Store + 'static>(
        engines: &[Idempotency<S>],
        consumer: &str,
        clients: Replays,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let counters = Arc::new(Counters::default());
        let tasks = (0..clients.tasks)
            .map(|task| {
                let engines = engines.to_vec();
                let (stop, seen, counters) =
                    (Arc::clone(&stop), Arc::clone(&seen), Arc::clone(&counters));
                let consumer = consumer.to_owned();
                tokio::spawn(async move {
                    let mut n = 0;
                    while !stop.load(Ordering::SeqCst) {
                        let key = format!("c{task}-{n}");
                        n += 1;
                        client(
                            &engines, task, &consumer, &key, clients, &stop, &seen, &counters,
                        )
                        .await;
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

    pub(crate) async fn stop<S: Store + 'static>(self, engines: &[Idempotency<S>]) -> Seen {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await.expect("a client task");
        }
        for idem in engines {
            let _ = tokio::time::timeout(Duration::from_secs(10), idem.drain()).await;
        }
        let mut seen = std::mem::take(&mut *lock(&self.seen));
        (seen.effects, seen.first_run) = self.counters.effects_and_first_runs();
        let bodies = std::mem::take(&mut seen.bodies);
        for (key, list) in &bodies {
            let ran = seen.effects.get(key).copied().unwrap_or(0);
            let distinct: std::collections::BTreeSet<_> = list.iter().map(|(_, b)| b).collect();
            if ran <= 1 && distinct.len() > 1 {
                seen.inconsistent.push(format!("{key}: {list:?}"));
            }
            // A body answered again after another one was: a flip back.
            let mut order: Vec<&String> = Vec::new();
            for (at, b) in list {
                if let Some(pos) = order.iter().position(|o| *o == b) {
                    if pos + 1 != order.len() {
                        let all = list.iter().map(|(_, b)| b.clone()).collect();
                        seen.flips.push((key.clone(), *at, all));
                        break;
                    }
                } else {
                    order.push(b);
                }
            }
        }
        seen.bodies = bodies;
        seen
    }
}

#[allow(clippy::too_many_arguments)]
async fn client<S: Store + 'static>(
    engines: &[Idempotency<S>],
    task: usize,
    consumer: &str,
    key: &str,
    clients: Replays,
    stop: &AtomicBool,
    seen: &Mutex<Seen>,
    counters: &Counters,
) {
    let runs = counters.key(key);
    let mut stopped_at = None;
    let mut answers = 0;
    let mut attempt = task;
    while answers < clients.answers {
        if gave_up(stop, &mut stopped_at, clients.give_up) {
            lock(seen).unanswered.push(key.to_owned());
            return;
        }
        let idem = &engines[attempt % engines.len()];
        attempt += 1;
        let request = idem
            .request(consumer, "POST", "/v1/notifications")
            .key(Some(key))
            .body(b"{}")
            .build()
            .expect("a valid request");
        let runs = Arc::clone(&runs);
        let owned = key.to_owned();
        let asked = Instant::now();
        let result = tokio::time::timeout(
            clients.hang,
            idem.run(&request, move |_| async move {
                // EFFECT_MS=n: each execution takes that long (renewals run meanwhile).
                if let Some(ms) = std::env::var("EFFECT_MS").ok().and_then(|v| v.parse().ok()) {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                let n = runs.count_one();
                Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, format!("{owned}/{n}")))
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
    fn record(
        &mut self,
        key: &str,
        asked: Instant,
        result: Result<Result<Outcome, RunError<std::io::Error>>, tokio::time::error::Elapsed>,
        clients: Replays,
    ) -> bool {
        let now = Instant::now();
        let took = now - asked;
        self.calls += 1;
        self.slowest = self.slowest.max(took);
        let body = |r: &StoredResponse| String::from_utf8_lossy(&r.body).into_owned();
        match result {
            Err(_) => {
                self.hangs += 1;
                self.errors
                    .push((now, format!("a call hung past {:?}", clients.hang)));
                false
            }
            Ok(Ok(Outcome::Executed(r) | Outcome::Answered(Answer::Replay(r)))) => {
                let b = body(&r);
                if !b.starts_with(&format!("{key}/")) {
                    self.foreign.push(format!("{key} answered {b}"));
                }
                self.bodies
                    .entry(key.to_owned())
                    .or_default()
                    .push((now, b));
                self.answers.push(now);
                true
            }
            Ok(Ok(Outcome::Answered(Answer::InFlight { .. }))) => false,
            Ok(Ok(other)) => {
                self.errors.push((now, format!("unexpected {other:?}")));
                false
            }
            Ok(Err(RunError::Idem(error))) => {
                self.slowest_refusal = self.slowest_refusal.max(took);
                self.errors.push((now, format!("idem: {error}")));
                false
            }
            Ok(Err(error)) => {
                self.errors.push((now, format!("run: {error}")));
                false
            }
        }
    }
}
