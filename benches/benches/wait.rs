//! The opt-in bounded wait of an in-flight duplicate (C5, `Policy::wait_in_flight`; docs/http.md,
//! "Waiting for the original"): how long after the original's completion a waiting duplicate
//! gets its replay, per store, in the same process and from another process (an engine over a
//! store of its own, sharing nothing with the original's but the server: woken by the store's
//! change feed where it has one, PostgreSQL `LISTEN/NOTIFY` and Redis pub/sub, else by reading
//! again); and what 10,000 waiters on one key cost in memory and in time to answer them all.
//!
//! `cargo bench -p idem-benches --bench wait` (servers from `bash scripts/bench wait`).
//! Each iteration: the original reserves, one duplicate starts waiting (its first read answered
//! "in flight"), the original completes; what is measured is only the time from the return of
//! the completion to the duplicate's answer.

use criterion::{criterion_group, criterion_main, Criterion};
use idem::postgres::PgStore;
use idem::redis::RedisStore;
use idem::sqlite::SqliteStore;
use idem::store::Store;
use idem::{Answer, Begin, Idempotency, MemoryStore, Policy, Request, StoredResponse};
use idem_benches::stores::server_url;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// The engines' policy: duplicates wait up to 5 s, up to 20,000 of them.
fn policy() -> Policy {
    Policy::default()
        .wait_in_flight(Duration::from_secs(5))
        .max_waiters(20_000)
}

fn engine<S: Store>(store: S) -> Idempotency<S> {
    Idempotency::builder(store)
        .policy(policy())
        .without_tracing()
        .build()
        .expect("a valid policy")
}

fn request<S: Store>(idem: &Idempotency<S>, consumer: &str, key: &str) -> Request {
    idem.request(consumer, "POST", "/v1/charges")
        .key(Some(key))
        .body(br#"{"amount":2500}"#)
        .build()
        .expect("a valid request")
}

/// The engine the original runs on and the one its duplicate waits on.
struct Pair<A: Store, B: Store> {
    name: &'static str,
    original: Idempotency<A>,
    duplicate: Idempotency<B>,
}

/// Waits until `n` duplicates of this process are waiting (their first read answered).
async fn parked(n: usize) {
    while idem::events::waiting_now() < n {
        tokio::task::yield_now().await;
    }
}

/// One round: the time from the completion's return to the duplicate's replay.
async fn round<A: Store + 'static, B: Store + 'static>(
    pair: &Pair<A, B>,
    consumer: &str,
    i: u64,
) -> Duration {
    let key = format!("k{i}-{}", idem::store::FencingToken::generate());
    let original = request(&pair.original, consumer, &key);
    let Begin::Acquired(lease) = pair.original.begin(&original).await.expect("begin") else {
        panic!("a fresh key is acquired");
    };
    let waiter = {
        let (idem, req) = (
            pair.duplicate.clone(),
            request(&pair.duplicate, consumer, &key),
        );
        tokio::spawn(async move {
            let answer = idem.begin(&req).await.expect("answered");
            (answer, Instant::now())
        })
    };
    parked(1).await;
    pair.original
        .complete(lease, StoredResponse::new(201, "ch_1"))
        .await
        .expect("complete");
    let landed = Instant::now();
    let (answer, at) = waiter.await.expect("the duplicate");
    assert!(
        matches!(answer, Begin::Answered(Answer::Replay(_))),
        "{}: {answer:?}",
        pair.name
    );
    at.saturating_duration_since(landed)
}

fn bench_pair<A: Store + 'static, B: Store + 'static>(
    c: &mut Criterion,
    rt: &Runtime,
    pair: Pair<A, B>,
) {
    let consumer = format!("acct_{}", idem::store::FencingToken::generate());
    c.bench_function(
        &format!("wait/answer_after_completion/{}", pair.name),
        |b| {
            b.to_async(rt).iter_custom(|iters| {
                let (pair, consumer) = (&pair, &consumer);
                async move {
                    let mut total = Duration::ZERO;
                    for i in 0..iters {
                        total += round(pair, consumer, i).await;
                    }
                    total
                }
            })
        },
    );
}

/// Resident memory of this process, in KiB (Linux).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// 10,000 duplicates of one key wait (memory per waiter), then the original completes: the
/// time until every one of them has its replay.
fn ten_thousand(c: &mut Criterion, rt: &Runtime) {
    const WAITERS: usize = 10_000;
    let idem = engine(MemoryStore::new());
    let consumer = "acct_storm";
    let reported = std::sync::atomic::AtomicBool::new(false);
    c.bench_function("wait/10000_waiters_answered/memory", |b| {
        b.to_async(rt).iter_custom(|iters| {
            let (idem, reported) = (&idem, &reported);
            async move {
                let mut total = Duration::ZERO;
                for i in 0..iters {
                    let key = format!("storm{i}-{}", idem::store::FencingToken::generate());
                    let req = request(idem, consumer, &key);
                    let Begin::Acquired(lease) = idem.begin(&req).await.expect("begin") else {
                        panic!("acquired");
                    };
                    let before = rss_kib();
                    let waiters: Vec<_> = (0..WAITERS)
                        .map(|_| {
                            let (idem, req) = (idem.clone(), req.clone());
                            tokio::spawn(async move { idem.begin(&req).await })
                        })
                        .collect();
                    parked(WAITERS).await;
                    let during = rss_kib();
                    idem.complete(lease, StoredResponse::new(201, "ch_1"))
                        .await
                        .expect("complete");
                    let started = Instant::now();
                    for waiter in waiters {
                        let answer = waiter.await.expect("a waiter").expect("answered");
                        assert!(matches!(answer, Begin::Answered(Answer::Replay(_))));
                    }
                    total += started.elapsed();
                    if !reported.swap(true, std::sync::atomic::Ordering::Relaxed) {
                        eprintln!(
                            "wait: {WAITERS} waiters on one key: RSS {before} KiB before, {during} KiB while they wait ({:.2} KiB per waiter, its task included), {} KiB after",
                            (during.saturating_sub(before)) as f64 / WAITERS as f64,
                            rss_kib()
                        );
                    }
                }
                total
            }
        })
    });
}

fn benches(c: &mut Criterion) {
    let rt = Runtime::new().expect("a runtime");
    let memory = Arc::new(MemoryStore::new());
    bench_pair(
        c,
        &rt,
        Pair {
            name: "memory_same_process",
            original: engine(Arc::clone(&memory)),
            duplicate: engine(Arc::clone(&memory)),
        },
    );
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("wait.db");
    let (sqlite, sqlite_elsewhere) = rt.block_on(async {
        let one = SqliteStore::open(&path).await.expect("open");
        let other = SqliteStore::open(&path).await.expect("open again");
        (one, other)
    });
    bench_pair(
        c,
        &rt,
        Pair {
            name: "sqlite_same_process",
            original: engine(sqlite.clone()),
            duplicate: engine(sqlite.clone()),
        },
    );
    bench_pair(
        c,
        &rt,
        Pair {
            name: "sqlite_another_process_polling",
            original: engine(sqlite),
            duplicate: engine(sqlite_elsewhere),
        },
    );
    let (pg, pg_elsewhere) = rt.block_on(async {
        let url = server_url("IDEM_PG_URL");
        let table = format!("wait_{}", idem::store::FencingToken::generate());
        let one = PgStore::builder()
            .table(&table)
            .connect(&url)
            .await
            .expect("connect");
        one.migrate().await.expect("migrate");
        let other = PgStore::builder()
            .table(&table)
            .connect(&url)
            .await
            .expect("connect");
        (one, other)
    });
    bench_pair(
        c,
        &rt,
        Pair {
            name: "postgres_another_process_notify",
            original: engine(pg),
            duplicate: engine(pg_elsewhere),
        },
    );
    let (redis, redis_elsewhere) = rt.block_on(async {
        let url = server_url("IDEM_REDIS_URL");
        let one = RedisStore::connect(&url).await.expect("connect");
        let other = RedisStore::connect(&url).await.expect("connect");
        (one, other)
    });
    bench_pair(
        c,
        &rt,
        Pair {
            name: "redis_another_process_pubsub",
            original: engine(redis),
            duplicate: engine(redis_elsewhere),
        },
    );
    ten_thousand(c, &rt);
    drop(dir);
}

criterion_group! {
    name = wait;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = benches
}
criterion_main!(wait);
