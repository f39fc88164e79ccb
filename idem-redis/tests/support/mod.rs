//! What the fault tests share: a Redis Cluster of a test's own, retrying clients that count
//! what they see, and the run of one fault under their load.
#![allow(dead_code)]

pub mod load;
pub mod private_cluster;
pub mod redis_cli;
pub mod under_load;
