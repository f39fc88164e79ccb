//! The results of a run, one JSON object a line in `target/idem-bench/<bench>.jsonl`, for the
//! chart (`cargo run -p idem-benches --bin chart`) and for docs/benchmarks.md.

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::PathBuf;

/// One measured cell of a table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// `memory`, `sqlite`, `postgres`, `redis`.
    pub store: String,
    /// `fresh_key`, `replay`, `in_flight`, `mismatch`, ...
    pub path: String,
    /// Stored body size in bytes (0 where it does not apply).
    pub size: usize,
    /// Concurrent callers.
    pub callers: usize,
    /// `library`, `raw`, `floor`, `raw_inline`.
    pub side: String,
    /// Operations completed per second (median of the rounds).
    pub ops_per_sec: f64,
    /// Latency median, µs (median of the rounds).
    pub p50_us: f64,
    /// Latency 99th percentile, µs (median of the rounds).
    pub p99_us: f64,
    /// On the library's cell: its cost relative to the baseline's, the median over rounds of
    /// baseline ops/s ÷ library ops/s (1.10 = 10% slower than the hand-written code).
    pub ratio_to_baseline: Option<f64>,
    /// On the library's cell, where the store has a `floor` baseline (the fewest hops and
    /// round trips, not the store's own statements): the same ratio against it.
    #[serde(default)]
    pub ratio_to_floor: Option<f64>,
}

/// Where results go: `<workspace>/target/idem-bench/`.
pub fn dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("idem-bench")
}

/// Writes `cells` as `<dir>/<bench>.jsonl`, replacing the previous run's.
pub fn write(bench: &str, cells: &[Cell]) -> std::io::Result<PathBuf> {
    let dir = dir();
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{bench}.jsonl"));
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path)?);
    for cell in cells {
        serde_json::to_writer(&mut file, cell)?;
        file.write_all(b"\n")?;
    }
    file.flush()?;
    Ok(path)
}

/// Reads `<dir>/<bench>.jsonl`.
pub fn read(bench: &str) -> std::io::Result<Vec<Cell>> {
    let text = std::fs::read_to_string(dir().join(format!("{bench}.jsonl")))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(std::io::Error::other))
        .collect()
}
