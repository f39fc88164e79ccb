//! What the fault tests share: a Redis Cluster or Sentinel setup of a test's own, retrying
//! clients that count what they see, and the run of one fault under their load.
#![allow(dead_code)]

pub(crate) mod keepalive;
pub(crate) mod load;
pub(crate) mod private_cluster;
pub(crate) mod private_sentinel;
pub(crate) mod redis_cli;
pub(crate) mod replays;
pub(crate) mod replicated_cluster;
pub(crate) mod under_load;
