//! Every store side by side on the same paths, each against the same work written by hand with
//! the same driver, pool settings and server, in one run (docs/benchmarks.md).
//!
//! `bash scripts/bench` (starts the servers, runs this and the chart);
//! by hand, with the servers of `scripts/services.sh` up:
//! `cargo bench -p idem-benches --bench stores`.
//!
//! Two parts:
//! 1. criterion groups at one caller, `<store>/<path>/<size>` with one function per side
//!    (`library`, `raw`, and for SQLite `raw_inline`), and `<store>/purge_1000` (one batch of
//!    1000 expired records deleted; the seeding is not measured);
//! 2. the concurrency table at 1, 8 and 32 callers (stored body 100 B): throughput and latency
//!    p50 / p99 per side, the sides in alternating rounds, medians of the rounds, and the
//!    ratio library / raw; on the SQL stores also the money path, `run_in_transaction`, on
//!    fresh keys and replays (`tx_fresh_key`, `tx_replay`) against the same baselines, and with
//!    one commit per fresh key (`tx1_fresh_key`, one-commit `run_in_transaction`, C15); written
//!    to `target/idem-bench/stores.jsonl` for the chart.
//!
//! `IDEM_BENCH_STORES=sqlite,postgres` limits the stores; `IDEM_BENCH_TABLE=off|only`;
//! quick mode (one short round, criterion runs each function once) under `cargo test
//! --benches` or with `IDEM_BENCH_QUICK=1`.

use criterion::{criterion_group, criterion_main, Criterion};
use idem_benches::harness::{measure, size_name, Mode, Path, Row};
use idem_benches::harness::{Op, Side};
use idem_benches::report;
use idem_benches::stores::{self, Subject};
use idem_benches::transaction;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// The stored body sizes of the answers at one caller.
const SIZES: [usize; 3] = [100, 64 * 1024, 1024 * 1024];
/// The expired records one purge deletes.
const PURGE_BATCH: usize = 1000;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

fn wanted(store: &str) -> bool {
    match std::env::var("IDEM_BENCH_STORES") {
        Ok(list) if !list.is_empty() => list.split(',').any(|s| s.trim() == store),
        _ => true,
    }
}

async fn subjects() -> Vec<Subject> {
    let mut subjects = Vec::new();
    if wanted("memory") {
        subjects.push(stores::memory().await);
    }
    if wanted("sqlite") {
        subjects.push(stores::sqlite().await);
    }
    if wanted("postgres") {
        subjects.push(stores::postgres().await);
    }
    if wanted("redis") {
        subjects.push(stores::redis().await);
    }
    subjects
}

fn sizes(path: Path) -> &'static [usize] {
    match path {
        Path::Replay | Path::Mismatch => &SIZES,
        Path::Fresh | Path::InFlight => &SIZES[..1],
    }
}

/// Part 1: latency at one caller.
fn latency(c: &mut Criterion, rt: &Runtime, subjects: &[Subject]) {
    for subject in subjects {
        for path in Path::ALL {
            for &size in sizes(path) {
                let ops: Vec<_> = subject
                    .sides
                    .iter()
                    .map(|side| (side.name(), rt.block_on(side.op(path, size))))
                    .collect();
                let mut group = c.benchmark_group(format!(
                    "{}/{}/{}",
                    subject.store,
                    path.name(),
                    size_name(size)
                ));
                for (name, op) in &ops {
                    group.bench_function(*name, |b| b.to_async(rt).iter(|| op()));
                }
                group.finish();
            }
        }
        if subject.store == "redis" {
            continue; // records leave by TTL: nothing to purge
        }
        let mut group = c.benchmark_group(format!("{}/purge_{PURGE_BATCH}", subject.store));
        group.sample_size(10);
        for side in &subject.sides {
            group.bench_function(side.name(), |b| {
                b.to_async(rt).iter_custom(|iters| {
                    let side = std::sync::Arc::clone(side);
                    async move {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            side.seed_expired(PURGE_BATCH).await;
                            let started = Instant::now();
                            let purged = side.purge(PURGE_BATCH).await;
                            total += started.elapsed();
                            assert!(purged > 0, "the purge found the seeded records");
                        }
                        total
                    }
                })
            });
        }
        group.finish();
    }
}

/// Part 2: the concurrency table.
fn table(rt: &Runtime, mode: &Mode, subjects: &[Subject]) {
    let started = Instant::now();
    println!();
    println!(
        "concurrency table: {} round(s) x {} ms per side, medians of rounds; library / raw = the library's time per operation relative to raw's (median over rounds of raw ops/s / library ops/s, min..max); 1.10 = 10% slower",
        mode.rounds,
        mode.round.as_millis()
    );
    println!();
    println!("| store | path | size | callers | sides: ops/s, p50 / p99 | library / raw |");
    println!("|---|---|---|---|---|---|");
    let ops = |sides: &[Arc<dyn Side>], path: Path| -> Vec<(&'static str, Op)> {
        sides
            .iter()
            .map(|side| (side.name(), rt.block_on(side.op(path, 100))))
            .collect()
    };
    let mut cells = Vec::new();
    for subject in subjects {
        for path in Path::ALL {
            let row = Row {
                store: subject.store,
                path: path.name(),
                size: 100,
                sides: ops(&subject.sides, path),
            };
            cells.extend(measure(rt, mode, &row));
        }
        let money_paths = [
            (&subject.in_transaction, &transaction::PATHS[..], false),
            (
                &subject.one_commit,
                &transaction::ONE_COMMIT_PATHS[..],
                true,
            ),
        ];
        for (transacting, paths, one_commit) in money_paths {
            let Some(transacting) = transacting else {
                continue;
            };
            for &path in paths {
                // The library through `run_in_transaction` (with one commit:
                // one-commit `run_in_transaction`), against the baselines of the same path.
                let mut sides = vec![("library", rt.block_on(transacting.op(path, 100)))];
                sides.extend(ops(&subject.sides[1..], path));
                if let (true, Some(floor)) = (one_commit, &subject.one_commit_floor) {
                    sides.extend(ops(std::slice::from_ref(floor), path));
                }
                let name = transaction::path_name(path, one_commit);
                let row = Row {
                    store: subject.store,
                    path: &name,
                    size: 100,
                    sides,
                };
                cells.extend(measure(rt, mode, &row));
            }
        }
    }
    match report::write("stores", &cells) {
        Ok(path) => println!("\nresults: {}", path.display()),
        Err(error) => eprintln!("results not written: {error}"),
    }
    println!(
        "concurrency table took {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

fn benches(c: &mut Criterion) {
    let mode = Mode::from_env();
    let rt = runtime();
    let subjects = rt.block_on(subjects());
    let part = std::env::var("IDEM_BENCH_TABLE").unwrap_or_default();
    if part != "only" {
        latency(c, &rt, &subjects);
    }
    if part != "off" {
        table(&rt, &mode, &subjects);
    }
}

criterion_group! {
    name = stores;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = benches
}
criterion_main!(stores);
