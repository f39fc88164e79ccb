//! The measuring machinery every bench shares: the sides compared, the paths, the concurrency
//! table (alternating rounds, medians), quick mode.

use crate::report::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// The future of one operation.
pub type OpFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One operation of a path, ready to run again and again (a fresh key numbers its calls
/// itself).
pub type Op = Arc<dyn Fn() -> OpFuture + Send + Sync>;

/// The paths every store is measured on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// A new key: reserve, the effect (a business insert in the same transaction on SQL
    /// stores), complete.
    Fresh,
    /// A completed key asked again.
    Replay,
    /// A key reserved and not completed, asked again.
    InFlight,
    /// A completed key asked with another body.
    Mismatch,
}

impl Path {
    /// Every path, in table order.
    pub const ALL: [Path; 4] = [Path::Fresh, Path::Replay, Path::InFlight, Path::Mismatch];

    /// The path's name in tables and results.
    pub fn name(self) -> &'static str {
        match self {
            Path::Fresh => "fresh_key",
            Path::Replay => "replay",
            Path::InFlight => "in_flight",
            Path::Mismatch => "mismatch",
        }
    }
}

/// One side of a comparison: the library over a store, or the same work written by hand with
/// the same driver, pool settings and server.
#[async_trait::async_trait]
pub trait Side: Send + Sync + 'static {
    /// `library`, `raw` (same hops as the store), `raw_inline` (SQLite: no hop at all).
    fn name(&self) -> &'static str;

    /// The operation for `path`, whose stored response body has `size` bytes, after setting up
    /// what it needs (a completed key for a replay, a reserved one for in flight).
    async fn op(&self, path: Path, size: usize) -> Op;

    /// Writes `n` records whose deadline has passed (not measured), for the purge.
    async fn seed_expired(&self, n: usize);

    /// Deletes one batch of at most `n` expired records; returns how many.
    async fn purge(&self, n: usize) -> usize;
}

/// How long and how often the table measures.
#[derive(Debug, Clone)]
pub struct Mode {
    /// One short round per cell and every bench once: a smoke test (what CI runs).
    pub quick: bool,
    /// Rounds per cell (the sides alternate within a round).
    pub rounds: usize,
    /// Measured time per round and side.
    pub round: Duration,
    /// Unmeasured warm-up before each round.
    pub warm: Duration,
    /// The numbers of concurrent callers.
    pub callers: Vec<usize>,
}

impl Mode {
    /// Full mode under `cargo bench` (criterion passes `--bench`), quick mode otherwise
    /// (`cargo test --benches`) or with `IDEM_BENCH_QUICK=1`. `IDEM_BENCH_ROUNDS` and
    /// `IDEM_BENCH_ROUND_MS` tune the full mode.
    pub fn from_env() -> Self {
        let bench = std::env::args().any(|a| a == "--bench");
        let quick = !bench || std::env::var("IDEM_BENCH_QUICK").is_ok_and(|v| v == "1");
        if quick {
            return Self {
                quick,
                rounds: 1,
                round: Duration::from_millis(20),
                warm: Duration::from_millis(5),
                callers: vec![1, 8, 32],
            };
        }
        Self {
            quick,
            rounds: env_u64("IDEM_BENCH_ROUNDS", 5).max(1) as usize,
            round: Duration::from_millis(env_u64("IDEM_BENCH_ROUND_MS", 250)),
            warm: Duration::from_millis(50),
            callers: vec![1, 8, 32],
        }
    }
}

/// A number from the environment, or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One round of one side: `callers` tasks run `op` back to back for `warm + measure`.
/// Returns the ops/s completed in the measured window and the sorted latencies (ns) of the ops
/// started in it.
pub fn round(
    rt: &Runtime,
    op: &Op,
    callers: usize,
    warm: Duration,
    measure: Duration,
) -> (f64, Vec<u64>) {
    rt.block_on(async {
        let start = Instant::now();
        let (from, to) = (start + warm, start + warm + measure);
        let tasks: Vec<_> = (0..callers)
            .map(|_| {
                let op = Arc::clone(op);
                tokio::spawn(async move {
                    let (mut done, mut latencies) = (0u64, Vec::with_capacity(4096));
                    loop {
                        let began = Instant::now();
                        if began >= to {
                            break;
                        }
                        op().await;
                        let ended = Instant::now();
                        if ended >= from && ended <= to {
                            done += 1;
                        }
                        if began >= from {
                            latencies.push(
                                u64::try_from((ended - began).as_nanos()).unwrap_or(u64::MAX),
                            );
                        }
                    }
                    (done, latencies)
                })
            })
            .collect();
        let (mut done, mut latencies) = (0, Vec::new());
        for task in tasks {
            let (d, l) = task.await.expect("a measuring task panicked");
            done += d;
            latencies.extend(l);
        }
        latencies.sort_unstable();
        (done as f64 / measure.as_secs_f64(), latencies)
    })
}

/// The `p`th percentile of sorted nanoseconds, in microseconds.
pub fn percentile(sorted: &[u64], p: usize) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)] as f64 / 1_000.0
}

/// The median (the mean of the two middle values for an even count).
pub fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// The name of the baseline written for the fewest hops and round trips (`benches/src/raw`):
/// the library's ratio to it is kept beside the ratio to the first baseline.
pub const FLOOR: &str = "floor";

/// The floor of one commit per fresh key (C15): the same statements in one transaction. The
/// library's ratio to it is printed beside the others where a row has it.
pub const FLOOR_ONE_COMMIT: &str = "floor_one_commit";

/// What one row of the table compares: a store, a path and a size, and the sides' operations
/// (the first is the library, the second the baseline its ratio is taken against).
pub struct Row<'a> {
    /// `memory`, `sqlite`, `postgres`, `redis`.
    pub store: &'a str,
    /// The path measured.
    pub path: &'a str,
    /// The stored body size in bytes (0 where it does not apply).
    pub size: usize,
    /// `(side name, operation)`, library first.
    pub sides: Vec<(&'static str, Op)>,
}

/// Measures `row` at every number of callers of `mode`, the sides in alternating rounds (the
/// order rotates each round) so the machine's noise hits every side; prints one markdown line
/// per number of callers and returns the cells (medians of the rounds; the library's cell holds
/// its cost ratio: the median over rounds of the baseline's ops/s divided by its own in the same
/// round, i.e. its time per operation relative to the baseline's; 1.10 = 10% slower).
pub fn measure(rt: &Runtime, mode: &Mode, row: &Row<'_>) -> Vec<Cell> {
    let mut cells = Vec::new();
    for &callers in &mode.callers {
        let n = row.sides.len();
        let mut figures: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); n];
        for r in 0..mode.rounds {
            let mut order: Vec<usize> = (0..n).collect();
            order.rotate_left(r % n.max(1));
            for i in order {
                let (ops, lat) = round(rt, &row.sides[i].1, callers, mode.warm, mode.round);
                figures[i].push((ops, percentile(&lat, 50), percentile(&lat, 99)));
            }
        }
        // The library's cost per operation relative to a baseline's: baseline ops/s ÷ library
        // ops/s in the same round (1.10 = 10% slower).
        let ratios_to = |baseline: usize| -> Vec<f64> {
            figures[0]
                .iter()
                .zip(&figures[baseline])
                .map(|(library, baseline)| baseline.0 / library.0)
                .collect()
        };
        let ratios = if n > 1 { ratios_to(1) } else { Vec::new() };
        let ratio = (n > 1).then(|| median(ratios.clone()));
        let ratio_to_side = |name: &str| {
            row.sides
                .iter()
                .position(|(side, _)| *side == name)
                .filter(|&i| i > 0)
                .map(|i| median(ratios_to(i)))
        };
        let floor = ratio_to_side(FLOOR);
        let one_commit_floor = ratio_to_side(FLOOR_ONE_COMMIT);
        let mut line = format!(
            "| {} | {} | {} | {callers} |",
            row.store,
            row.path,
            size_name(row.size)
        );
        for (i, (side, _)) in row.sides.iter().enumerate() {
            let med = |f: fn(&(f64, f64, f64)) -> f64| median(figures[i].iter().map(f).collect());
            let cell = Cell {
                store: row.store.to_owned(),
                path: row.path.to_owned(),
                size: row.size,
                callers,
                side: (*side).to_owned(),
                ops_per_sec: med(|f| f.0),
                p50_us: med(|f| f.1),
                p99_us: med(|f| f.2),
                ratio_to_baseline: if i == 0 { ratio } else { None },
                ratio_to_floor: if i == 0 { floor } else { None },
            };
            line.push_str(&format!(
                " {side} {:.0} ops/s, {:.0} / {:.0} µs |",
                cell.ops_per_sec, cell.p50_us, cell.p99_us
            ));
            cells.push(cell);
        }
        if let Some(ratio) = ratio {
            let (lo, hi) = ratios
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            line.push_str(&format!(" {ratio:.2} [{lo:.2}..{hi:.2}] |"));
        }
        if let Some(floor) = floor {
            line.push_str(&format!(" floor {floor:.2} |"));
        }
        if let Some(floor) = one_commit_floor {
            line.push_str(&format!(" one-commit floor {floor:.2} |"));
        }
        println!("{line}");
    }
    cells
}

/// `100B`, `64KiB`, `1MiB`, or `-` for 0.
pub fn size_name(size: usize) -> String {
    match size {
        0 => "-".to_owned(),
        s if s >= 1024 * 1024 && s % (1024 * 1024) == 0 => format!("{}MiB", s / (1024 * 1024)),
        s if s >= 1024 && s % 1024 == 0 => format!("{}KiB", s / 1024),
        s => format!("{s}B"),
    }
}
