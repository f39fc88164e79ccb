//! The hand-written baselines. Two kinds per store:
//! - `raw`: the same work as the store's, the same statements and hops, written by hand the way
//!   a careful person would, with the same driver, pool settings and server: it measures the
//!   library's overhead;
//! - `floor`: the same outcome written for the fewest hops and round trips the machine allows,
//!   not running the store's own statements: it measures how far the library is from the machine
//!   (SQLite's is in `sqlite`, the same statements with one blocking hop per phase).

pub mod postgres;
pub mod postgres_floor;
pub mod redis;
pub mod redis_floor;
pub mod sqlite;
