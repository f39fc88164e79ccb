//! The hand-written baselines: the same work as the store's, written by hand the way a careful
//! person would, with the same driver, pool settings and server, no library in between.

pub mod postgres;
pub mod redis;
pub mod sqlite;
