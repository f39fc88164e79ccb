//! How the cost grows (docs/benchmarks.md): replay and fresh-key latency with 10^3, 10^5 and
//! 10^6 records already in the store, and a reservation's latency while a purge of 10^5
//! expired records runs, against the same figure idle.
//!
//! `bash scripts/bench` runs it; by hand, with the servers of `scripts/services.sh` up:
//! `cargo bench -p idem-benches --bench growth`. Quick mode (`cargo test --benches`,
//! `IDEM_BENCH_QUICK=1`) grows to 10^4 records and purges 10^4.
//!
//! The records are written in bulk by hand (one statement, or pipelined commands for Redis):
//! completed records of other keys, with a 100 B response, in the store's own table or keyspace.
//! The purge is the engine's (`Store::purge_expired`, batches of 1000) on SQLite and
//! PostgreSQL; Redis expires records by TTL and has nothing to purge.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use idem::postgres::{sqlx, PgStore};
use idem::redis::redis;
use idem::redis::RedisStore;
use idem::sqlite::rusqlite::params;
use idem::sqlite::SqliteStore;
use idem_benches::harness::{median, percentile, Mode, Op, Path, Side};
use idem_benches::library::{response, CompleteOnly, Library};
use idem_benches::report::{self, Cell};
use idem_benches::stores::{server_url, POOL};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// Callers reserving while the purge runs.
const CALLERS: usize = 8;
/// One purge batch.
const PURGE_BATCH: usize = 1000;

type Seed = Box<dyn Fn(u64, u64, bool) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A store grown by hand: its library side and how to write records `from..to` (expired or
/// live) in bulk.
struct Grown {
    store: &'static str,
    side: Arc<dyn Side>,
    seed: Seed,
    purges: bool,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

async fn sqlite(dir: &tempfile::TempDir) -> Grown {
    let store = SqliteStore::open(dir.path().join("grown.db"))
        .await
        .expect("open");
    store
        .try_call(|db| {
            db.execute_batch("CREATE TABLE bench_charges (id INTEGER PRIMARY KEY, cents INTEGER)")
        })
        .await
        .expect("business table");
    let library = Library::new(store.clone(), idem_benches::stores::sqlite_effect());
    let consumer = format!("{}_grown", library.consumer());
    let encoded = response(100).encode().expect("encode");
    let seed: Seed = Box::new(move |from, to, expired| {
        let (store, consumer, encoded) = (store.clone(), consumer.clone(), encoded.clone());
        Box::pin(async move {
            let table = store.table().to_owned();
            let sql = format!(
                "WITH RECURSIVE n(i) AS (SELECT ?1 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?2) \
                 INSERT INTO {table} (consumer, route, key, fingerprint, token, state, deadline, response) \
                 SELECT ?3, 'POST /v1/charges', 'grown-' || i, randomblob(32), randomblob(16), ?4, ?5, ?6 FROM n"
            );
            let (state, deadline) = if expired {
                (0, now_ms() - 1000)
            } else {
                (1, now_ms() + 86_400_000)
            };
            store
                .try_call(move |db| {
                    db.execute(
                        &sql,
                        params![
                            from as i64,
                            to as i64,
                            consumer,
                            state,
                            deadline,
                            if expired { None } else { Some(encoded) }
                        ],
                    )
                })
                .await
                .expect("seed");
        })
    });
    Grown {
        store: "sqlite",
        side: Arc::new(library),
        seed,
        purges: true,
    }
}

async fn postgres() -> Grown {
    let url = server_url("IDEM_PG_URL");
    let store = PgStore::builder()
        .table(&format!("grown_{}", idem::store::FencingToken::generate()))
        .max_connections(POOL)
        .connect(&url)
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    sqlx::raw_sql("CREATE TABLE IF NOT EXISTS bench_charges (id bigserial PRIMARY KEY, cents bigint NOT NULL)")
        .execute(store.pool())
        .await
        .expect("business table");
    let library = Library::new(store.clone(), idem_benches::stores::pg_effect());
    let consumer = format!("{}_grown", library.consumer());
    let encoded = response(100).encode().expect("encode");
    let seed: Seed = Box::new(move |from, to, expired| {
        let (store, consumer, encoded) = (store.clone(), consumer.clone(), encoded.clone());
        Box::pin(async move {
            let sql = format!(
                "INSERT INTO {} (consumer, route, key, fingerprint, token, state, deadline, response) \
                 SELECT $1, 'POST /v1/charges', 'grown-' || i, \
                        decode(md5(i::text) || md5((i + 1)::text), 'hex'), decode(md5(random()::text), 'hex'), \
                        $2, clock_timestamp() + $3 * interval '1 millisecond', $4 \
                 FROM generate_series($5::bigint, $6::bigint - 1) AS i",
                store.table()
            );
            let (state, offset): (i16, i64) = if expired { (0, -1000) } else { (1, 86_400_000) };
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(consumer)
                .bind(state)
                .bind(offset)
                .bind(if expired { None } else { Some(encoded) })
                .bind(i64::try_from(from).unwrap_or(i64::MAX))
                .bind(i64::try_from(to).unwrap_or(i64::MAX))
                .execute(store.pool())
                .await
                .expect("seed");
            sqlx::query(sqlx::AssertSqlSafe(format!("ANALYZE {}", store.table())))
                .execute(store.pool())
                .await
                .expect("analyze");
        })
    });
    Grown {
        store: "postgres",
        side: Arc::new(library),
        seed,
        purges: true,
    }
}

async fn redis() -> Grown {
    let url = server_url("IDEM_REDIS_URL");
    let store = RedisStore::connect(&url).await.expect("connect");
    let library = Library::new(store, CompleteOnly);
    let prefix = format!("{}_grown", library.consumer());
    let client = redis::Client::open(url.as_str()).expect("a Redis URL");
    let seed: Seed = Box::new(move |from, to, _expired| {
        let (client, prefix) = (client.clone(), prefix.clone());
        Box::pin(async move {
            let mut conn = client
                .get_multiplexed_async_connection()
                .await
                .expect("connect");
            let body = response(100).encode().expect("encode");
            let mut i = from;
            while i < to {
                let end = (i + 10_000).min(to);
                let mut pipe = redis::pipe();
                for k in i..end {
                    pipe.cmd("HSET")
                        .arg(format!("{prefix}:{k}"))
                        .arg("v")
                        .arg("1")
                        .arg("st")
                        .arg("1")
                        .arg("resp")
                        .arg(&body)
                        .ignore();
                    pipe.cmd("PEXPIRE")
                        .arg(format!("{prefix}:{k}"))
                        .arg(3_600_000)
                        .ignore();
                }
                let () = pipe.query_async(&mut conn).await.expect("seed");
                i = end;
            }
        })
    });
    Grown {
        store: "redis",
        side: Arc::new(library),
        seed,
        purges: false,
    }
}

/// Latency of `op` from `CALLERS` callers until `stop` is set (at least `min`): p50 and p99 µs.
fn latency_until(rt: &Runtime, op: &Op, stop: Arc<AtomicBool>, min: Duration) -> (f64, f64, usize) {
    rt.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = (0..CALLERS)
            .map(|_| {
                let (op, stop) = (Arc::clone(op), Arc::clone(&stop));
                tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    while !(stop.load(Ordering::SeqCst) && start.elapsed() >= min) {
                        let began = Instant::now();
                        op().await;
                        latencies
                            .push(u64::try_from(began.elapsed().as_nanos()).unwrap_or(u64::MAX));
                    }
                    latencies
                })
            })
            .collect();
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await.expect("a caller panicked"));
        }
        all.sort_unstable();
        (percentile(&all, 50), percentile(&all, 99), all.len())
    })
}

/// Reservation latency idle, then while a purge of `expired` records runs in batches.
fn purge_under_load(rt: &Runtime, mode: &Mode, grown: &Grown, expired: u64, cells: &mut Vec<Cell>) {
    let op = rt.block_on(grown.side.op(Path::Fresh, 100));
    let window = if mode.quick {
        Duration::from_millis(100)
    } else {
        Duration::from_secs(2)
    };
    let mut idle = Vec::new();
    let mut busy = Vec::new();
    let mut purge_secs = Vec::new();
    for _ in 0..mode.rounds.min(3) {
        let stop = Arc::new(AtomicBool::new(true));
        idle.push(latency_until(rt, &op, stop, window));
        rt.block_on((grown.seed)(10_000_000, 10_000_000 + expired, true));
        let stop = Arc::new(AtomicBool::new(false));
        let (side, flag) = (Arc::clone(&grown.side), Arc::clone(&stop));
        let started = Instant::now();
        let purger = rt.spawn(async move {
            let mut total = 0;
            loop {
                let n = side.purge(PURGE_BATCH).await;
                total += n;
                if n == 0 {
                    break;
                }
            }
            flag.store(true, Ordering::SeqCst);
            total
        });
        busy.push(latency_until(rt, &op, stop, Duration::ZERO));
        let purged = rt.block_on(purger).expect("the purger panicked");
        purge_secs.push(started.elapsed().as_secs_f64());
        assert!(
            purged as u64 >= expired,
            "the purge deleted the seeded records"
        );
    }
    let med = |v: &[(f64, f64, usize)], f: fn(&(f64, f64, usize)) -> f64| {
        median(v.iter().map(f).collect())
    };
    let (idle50, idle99, busy50, busy99) = (
        med(&idle, |x| x.0),
        med(&idle, |x| x.1),
        med(&busy, |x| x.0),
        med(&busy, |x| x.1),
    );
    println!(
        "| {} | {expired} | {:.1} | {idle50:.0} / {idle99:.0} | {busy50:.0} / {busy99:.0} | {:.2} |",
        grown.store,
        median(purge_secs),
        busy99 / idle99
    );
    for (path, p50, p99) in [
        ("reserve_idle", idle50, idle99),
        ("reserve_during_purge", busy50, busy99),
    ] {
        cells.push(Cell {
            store: grown.store.to_owned(),
            path: path.to_owned(),
            size: 100,
            callers: CALLERS,
            side: "library".to_owned(),
            ops_per_sec: f64::NAN,
            p50_us: p50,
            p99_us: p99,
            ratio_to_baseline: None,
            ratio_to_floor: None,
        });
    }
}

fn benches(c: &mut Criterion) {
    let mode = Mode::from_env();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let wanted = |store: &str| match std::env::var("IDEM_BENCH_STORES") {
        Ok(list) if !list.is_empty() => list.split(',').any(|s| s.trim() == store),
        _ => true,
    };
    let mut stores = Vec::new();
    if wanted("sqlite") {
        stores.push(rt.block_on(sqlite(&dir)));
    }
    if wanted("postgres") {
        stores.push(rt.block_on(postgres()));
    }
    if wanted("redis") {
        stores.push(rt.block_on(redis()));
    }
    let levels: &[u64] = if mode.quick {
        &[1_000, 10_000]
    } else {
        &[1_000, 100_000, 1_000_000]
    };
    for grown in &stores {
        let mut group = c.benchmark_group(format!("growth/{}", grown.store));
        let mut have = 0;
        for &level in levels {
            rt.block_on((grown.seed)(have, level, false));
            have = level;
            for path in [Path::Replay, Path::Fresh] {
                let op = rt.block_on(grown.side.op(path, 100));
                group.bench_with_input(BenchmarkId::new(path.name(), level), &level, |b, _| {
                    b.to_async(&rt).iter(|| op())
                });
            }
        }
        group.finish();
    }
    let expired = if mode.quick { 10_000 } else { 100_000 };
    println!();
    println!("reservation latency ({CALLERS} callers, fresh keys) idle and while a purge of expired records runs (batches of {PURGE_BATCH}); medians of rounds");
    println!();
    println!("| store | expired records | purge took (s) | idle p50 / p99 (µs) | during purge p50 / p99 (µs) | p99 during / idle |");
    println!("|---|---|---|---|---|---|");
    let mut cells = Vec::new();
    for grown in stores.iter().filter(|g| g.purges) {
        purge_under_load(&rt, &mode, grown, expired, &mut cells);
    }
    if let Err(error) = report::write("growth", &cells) {
        eprintln!("results not written: {error}");
    }
}

criterion_group! {
    name = growth;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = benches
}
criterion_main!(growth);
