//! A Redis Cluster of a test's own with a replica per master: three masters, three replicas,
//! on free loopback ports, their files in a temporary directory, killed when dropped. For the
//! failover tests (`CLUSTER FAILOVER`, a master killed and its replica promoted).

use super::redis_cli::{
    cli, free_port, kill, redis_cli, redis_server, reshard_slots, try_cli, wait_for,
};
use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

/// How long a node may go unreached before the cluster counts it as failed.
const NODE_TIMEOUT_MS: u64 = 1000;

struct Node {
    port: u16,
    bus_port: u16,
    dir: PathBuf,
    process: Option<Child>,
}

/// A running cluster of three masters with a replica each.
pub(crate) struct ReplicatedCluster {
    nodes: Vec<Node>,
    root: PathBuf,
}

impl Node {
    fn start(&mut self, aof_always: bool) {
        let port = self.port.to_string();
        let bus = self.bus_port.to_string();
        let timeout = NODE_TIMEOUT_MS.to_string();
        let dir = self.dir.to_string_lossy().into_owned();
        let mut args = vec![
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--cluster-enabled",
            "yes",
            "--cluster-port",
            &bus,
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &timeout,
            "--save",
            "",
            "--enable-debug-command",
            "yes",
            "--cluster-allow-replica-migration",
            "no",
            "--dir",
            &dir,
        ];
        if aof_always {
            args.extend(["--appendonly", "yes", "--appendfsync", "always"]);
        }
        self.process = Some(redis_server(self.port, &args));
    }
}

impl ReplicatedCluster {
    /// Starts six nodes and joins them (`--cluster-replicas 1`), then waits for
    /// `cluster_state:ok` and every replica's link.
    pub(crate) fn start(aof_always: bool) -> Self {
        let root = std::env::temp_dir().join(format!(
            "idem-redis-rcluster-{}",
            idem_core::FencingToken::generate()
        ));
        let mut nodes: Vec<Node> = (0..6)
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
            node.start(aof_always);
        }
        let cluster = Self { nodes, root };
        let addresses: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addresses.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "1", "--cluster-yes"]);
        let out = redis_cli(&args);
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_ok(Duration::from_secs(30));
        wait_for(Duration::from_secs(30), "every replica's link", || {
            cluster.replicas().iter().all(|&p| {
                try_cli(p, &["info", "replication"])
                    .is_ok_and(|i| i.contains("master_link_status:up"))
            })
        });
        cluster
    }

    pub(crate) fn urls(&self) -> Vec<String> {
        // Seeds: the three first nodes (masters at creation).
        self.nodes
            .iter()
            .take(3)
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect()
    }

    pub(crate) fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    fn running(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| n.process.is_some())
    }

    pub(crate) fn role(&self, port: u16) -> String {
        try_cli(port, &["role"])
            .ok()
            .and_then(|r| r.lines().next().map(str::to_owned))
            .unwrap_or_default()
    }

    /// The ports of the nodes that say they are replicas.
    pub(crate) fn replicas(&self) -> Vec<u16> {
        self.running()
            .map(|n| n.port)
            .filter(|&p| self.role(p) == "slave")
            .collect()
    }

    /// The port of the master node `replica` replicates.
    pub(crate) fn master_of(&self, replica: u16) -> u16 {
        let info = cli(replica, &["info", "replication"]);
        info.lines()
            .find_map(|l| l.strip_prefix("master_port:"))
            .and_then(|p| p.trim().parse().ok())
            .expect("a master port")
    }

    pub(crate) fn is_ok(&self) -> bool {
        self.running().all(|n| {
            try_cli(n.port, &["cluster", "info"]).is_ok_and(|info| {
                info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
            })
        })
    }

    pub(crate) fn wait_ok(&self, limit: Duration) {
        wait_for(limit, "cluster_state:ok on every node", || self.is_ok());
    }

    /// `CLUSTER FAILOVER [mode]` on `replica`; waits until it says it is a master.
    pub(crate) fn failover(&self, replica: u16, mode: Option<&str>) {
        let mut args = vec!["cluster", "failover"];
        args.extend(mode);
        assert_eq!(cli(replica, &args), "OK", "CLUSTER FAILOVER {mode:?}");
        wait_for(Duration::from_secs(20), "the replica's promotion", || {
            self.role(replica) == "master"
        });
    }

    /// The ports of the nodes that say they are masters.
    pub(crate) fn masters(&self) -> Vec<u16> {
        self.running()
            .map(|n| n.port)
            .filter(|&p| self.role(p) == "master")
            .collect()
    }

    /// Moves `count` slots from the master on `from` to the master on `to`
    /// (`redis-cli --cluster reshard`, keys migrated with them), then waits for the cluster.
    pub(crate) fn reshard(&self, from: u16, to: u16, count: usize) {
        let (from_id, to_id) = (
            cli(from, &["cluster", "myid"]),
            cli(to, &["cluster", "myid"]),
        );
        reshard_slots(from, &from_id, &to_id, count, 10);
        self.wait_ok(Duration::from_secs(30));
    }

    /// `kill -9` of the node on `port`.
    pub(crate) fn kill_port(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.port == port) {
            if let Some(mut child) = node.process.take() {
                kill(&mut child);
            }
        }
    }

    /// Starts the node on `port` again (same files).
    pub(crate) fn restart_port(&mut self, port: u16, aof_always: bool) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.port == port) {
            node.start(aof_always);
        }
    }
}

impl Drop for ReplicatedCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.process.take() {
                kill(&mut child);
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
