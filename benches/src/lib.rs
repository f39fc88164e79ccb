//! # idem-benches
//!
//! Criterion benchmarks of idem (docs/benchmarks.md): every store side by side on the same
//! paths, each against the same work written by hand with the same driver and server, the
//! core's own costs, and how the cost grows with the number of stored records.
//!
//! - [`harness`]: the sides, the paths, the concurrency table (alternating rounds, medians),
//!   quick mode;
//! - [`library`]: the library's side, written once over any [`idem::store::Store`];
//! - [`transaction`]: the money path, `run_in_transaction` on the SQL stores;
//! - [`raw`]: the hand-written baselines, one module per store;
//! - [`stores`]: the stores and their baselines, on the servers `scripts/services.sh` starts;
//! - [`report`]: the results, for the chart (`cargo run -p idem-benches --bin chart`).
// A bench harness, never published: its sides hold drivers' connections and closures that
// have no Debug of their own, and nothing prints them.
#![allow(missing_debug_implementations)]
#![forbid(unsafe_code)]

pub mod exercise;
pub mod harness;
pub mod library;
pub mod raw;
pub mod report;
pub mod stores;
pub mod transaction;
