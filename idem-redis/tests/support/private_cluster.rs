//! A Redis Cluster of a test's own: three masters on free loopback ports, their files in a
//! temporary directory, killed when it is dropped. The fault tests kill, restart and reshard
//! its nodes, which they may not do to the cluster other tests share. A missing `redis-server`
//! or `redis-cli` is a failure with the way out, never a skip.

use super::redis_cli::{
    cli, free_port, freeze_port, kill, redis_cli, redis_server, reshard_slots, wait_for,
};
use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

/// How long a node may go unreached before the cluster counts it as failed: short, so a test
/// sees the cluster fail and heal within seconds.
const NODE_TIMEOUT_MS: u64 = 1000;

/// One master: its ports, its directory, its process while it runs.
struct Node {
    port: u16,
    bus_port: u16,
    dir: PathBuf,
    process: Option<Child>,
}

/// A running three-master cluster; see the [module](self).
pub(crate) struct PrivateCluster {
    nodes: Vec<Node>,
    root: PathBuf,
}

impl Node {
    fn start(&mut self) {
        let mut args: Vec<std::ffi::OsString> = [
            "--port",
            &self.port.to_string(),
            "--bind",
            "127.0.0.1",
            "--cluster-enabled",
            "yes",
            "--cluster-port",
            &self.bus_port.to_string(),
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &NODE_TIMEOUT_MS.to_string(),
            "--save",
            "",
            // Nothing acknowledged is lost by a kill -9: the tests can demand one effect
            // per key (C14's re-run needs a Redis that loses a record).
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--enable-debug-command",
            "yes",
            // A master whose every slot moved away stays a master (it would become a
            // replica of the node that took them, and could not take them back).
            "--cluster-allow-replica-migration",
            "no",
        ]
        .iter()
        .map(|arg| std::ffi::OsString::from(*arg))
        .collect();
        args.extend(["--dir".into(), self.dir.clone().into_os_string()]);
        self.process = Some(redis_server(self.port, &args));
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.process.take() {
            kill(&mut child);
        }
    }
}

impl PrivateCluster {
    /// Starts three masters and joins them (`redis-cli --cluster create`, slots spread evenly),
    /// then waits for `cluster_state:ok` on every node.
    pub(crate) fn start() -> Self {
        let root = std::env::temp_dir().join(format!(
            "idem-redis-cluster-{}",
            idem_core::FencingToken::generate()
        ));
        let mut nodes: Vec<Node> = (0..3)
            .map(|i| {
                let dir = root.join(format!("node{i}"));
                std::fs::create_dir_all(&dir).expect("a node's directory");
                Node {
                    port: free_port(),
                    bus_port: free_port(),
                    dir,
                    process: None,
                }
            })
            .collect();
        for node in &mut nodes {
            node.start();
        }
        let cluster = Self { nodes, root };
        let addresses: Vec<String> = cluster
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addresses.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = redis_cli(&args);
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_ok(Duration::from_secs(20));
        cluster
    }

    /// The masters' ports, in the order they were started.
    pub(crate) fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The seed URLs a store connects through.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.ports()
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// Whether every running node says `cluster_state:ok` and agrees every slot is served.
    pub(crate) fn is_ok(&self) -> bool {
        self.nodes.iter().filter(|n| n.process.is_some()).all(|n| {
            let port = n.port.to_string();
            let out = redis_cli(&["-h", "127.0.0.1", "-p", &port, "cluster", "info"]);
            let info = String::from_utf8_lossy(&out.stdout);
            info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
        })
    }

    /// Waits for [`is_ok`](Self::is_ok), at most `limit`.
    pub(crate) fn wait_ok(&self, limit: Duration) {
        wait_for(limit, "cluster_state:ok on every node", || self.is_ok());
    }

    /// `kill -9` of node `i` (its files are kept).
    pub(crate) fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Starts node `i` again: the same port, the same `nodes.conf` and append-only file, so it
    /// rejoins as the master it was.
    pub(crate) fn restart(&mut self, i: usize) {
        self.nodes[i].start();
    }

    /// The id of node `i` in the cluster.
    pub(crate) fn node_id(&self, i: usize) -> String {
        cli(self.nodes[i].port, &["cluster", "myid"])
    }

    /// How many slots node `i` serves, by its own account.
    pub(crate) fn slot_count(&self, i: usize) -> usize {
        cli(self.nodes[i].port, &["cluster", "nodes"])
            .lines()
            .find(|line| line.contains("myself"))
            .map(|line| {
                line.split_whitespace()
                    .skip(8)
                    .filter(|range| !range.starts_with('['))
                    .map(|range| match range.split_once('-') {
                        Some((lo, hi)) => match (lo.parse::<usize>(), hi.parse::<usize>()) {
                            (Ok(lo), Ok(hi)) => hi + 1 - lo,
                            _ => 0,
                        },
                        None => 1,
                    })
                    .sum()
            })
            .unwrap_or(0)
    }

    /// Moves `count` slots from node `from` to node `to` with `redis-cli --cluster reshard`
    /// (keys migrated with them), then waits for the cluster to agree.
    pub(crate) fn reshard(&self, from: usize, to: usize, count: usize) {
        let (from, to) = (self.node_id(from), self.node_id(to));
        reshard_slots(self.nodes[0].port, &from, &to, count, 1000);
        self.wait_ok(Duration::from_secs(20));
        self.wait_converged(Duration::from_secs(20));
    }

    /// Waits until every node gives the same slot map (`CLUSTER SLOTS`): a reshard has ended
    /// once the topology it made is the one every node tells its clients, not when the tool
    /// that moved the slots returns (the last nodes learn it by gossip).
    pub(crate) fn wait_converged(&self, limit: Duration) {
        wait_for(limit, "one slot map on every node", || {
            let maps: Vec<String> = self
                .nodes
                .iter()
                .map(|node| cli(node.port, &["cluster", "slots"]))
                .collect();
            maps.windows(2).all(|pair| pair[0] == pair[1])
        });
    }

    /// `DEBUG SLEEP seconds` on node `i`, sent from a thread of its own: the node freezes for
    /// that long. Returns once the node has stopped answering.
    pub(crate) fn freeze(&self, i: usize, seconds: f64) -> std::thread::JoinHandle<()> {
        freeze_port(self.nodes[i].port, seconds)
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
