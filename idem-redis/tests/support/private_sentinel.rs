//! Redis under Sentinel, a test's own: a master, one replica and three sentinels watching the
//! master as `m` (quorum 2, down after 1 s), on free loopback ports, their files in a
//! temporary directory, every process killed and the directory removed when it is dropped
//! (a failed test included). A missing `redis-server` or `redis-cli` is a failure with the
//! way out, never a skip.

use super::redis_cli::{cli, free_port, kill, redis_server, try_cli, wait_for};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// The master's name in the sentinels' configuration.
pub(crate) const MASTER_NAME: &str = "m";

/// How long the master may go unreached before a sentinel counts it down.
const DOWN_AFTER_MS: u64 = 1000;

/// How long a failover may take before the sentinels give it up and start another.
const FAILOVER_TIMEOUT_MS: u64 = 3000;

/// A running master, replica and three sentinels; see the [module](self).
pub(crate) struct PrivateSentinel {
    master: Option<Child>,
    replica: Option<Child>,
    sentinels: Vec<Child>,
    master_port: u16,
    replica_port: u16,
    sentinel_ports: Vec<u16>,
    root: PathBuf,
}

/// `redis-server args…` with its files in `dir`, once it listens on `port`.
fn server(port: u16, dir: &Path, args: &[&str]) -> Child {
    std::fs::create_dir_all(dir).expect("a server's directory");
    redis_server(port, args)
}

impl PrivateSentinel {
    /// Starts the master and its replica, waits for the replica's link, then starts the
    /// sentinels and waits until each sees the replica and a quorum able to fail over
    /// (`SENTINEL CKQUORUM`).
    pub(crate) fn start() -> Self {
        let root = std::env::temp_dir().join(format!(
            "idem-redis-sentinel-{}",
            idem_core::FencingToken::generate()
        ));
        let mut setup = Self {
            master: None,
            replica: None,
            sentinels: Vec::new(),
            master_port: free_port(),
            replica_port: free_port(),
            sentinel_ports: (0..3).map(|_| free_port()).collect(),
            root,
        };
        setup.master = Some(setup.redis(setup.master_port, "master", &[]));
        let master = setup.master_port.to_string();
        setup.replica = Some(setup.redis(
            setup.replica_port,
            "replica",
            &["--replicaof", "127.0.0.1", &master],
        ));
        wait_for(Duration::from_secs(10), "the replica's link", || {
            try_cli(setup.replica_port, &["info", "replication"])
                .is_ok_and(|info| info.contains("master_link_status:up"))
        });
        for i in 0..setup.sentinel_ports.len() {
            let sentinel = setup.sentinel(i);
            setup.sentinels.push(sentinel);
        }
        for &port in &setup.sentinel_ports {
            // Sentinels find each other by hello messages every 2 s: slow on a loaded machine.
            wait_for(
                Duration::from_secs(60),
                "every sentinel to see the replica and a quorum",
                || {
                    let replicas = try_cli(port, &["sentinel", "replicas", MASTER_NAME]);
                    let quorum = try_cli(port, &["sentinel", "ckquorum", MASTER_NAME]);
                    replicas.is_ok_and(|r| r.contains(&setup.replica_port.to_string()))
                        && quorum.is_ok_and(|q| q.starts_with("OK"))
                },
            );
        }
        setup
    }

    fn redis(&self, port: u16, name: &str, extra: &[&str]) -> Child {
        let dir = self.root.join(name);
        let port_text = port.to_string();
        let dir_text = dir.to_string_lossy().into_owned();
        let mut args = vec![
            "--port",
            &port_text,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            &dir_text,
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
            "--enable-debug-command",
            "yes",
        ];
        args.extend_from_slice(extra);
        server(port, &dir, &args)
    }

    /// Sentinel `i`: a configuration file of its own (a sentinel rewrites it).
    fn sentinel(&self, i: usize) -> Child {
        let port = self.sentinel_ports[i];
        let dir = self.root.join(format!("sentinel{i}"));
        std::fs::create_dir_all(&dir).expect("a sentinel's directory");
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
                 sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                dir = dir.display(),
                master = self.master_port,
            ),
        )
        .expect("a sentinel's configuration");
        let conf = conf.to_string_lossy().into_owned();
        server(port, &dir, &[&conf, "--sentinel"])
    }

    /// The sentinels' URLs, as a store is given them.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.sentinel_ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// The replica's port.
    pub(crate) fn replica_port(&self) -> u16 {
        self.replica_port
    }

    /// The master's port (the replica's, once it was promoted).
    pub(crate) fn master_port(&self) -> u16 {
        self.master_port
    }

    /// The sentinels' ports.
    pub(crate) fn sentinel_ports(&self) -> &[u16] {
        &self.sentinel_ports
    }

    /// Stops the replica (`SIGSTOP`): it takes nothing from its master and acknowledges
    /// nothing until, `seconds` later, it is continued from the thread returned.
    pub(crate) fn stop_replica_for(&self, seconds: f64) -> std::thread::JoinHandle<()> {
        let pid = self.replica.as_ref().map(Child::id).expect("a replica");
        let signal = move |name: &str| {
            Command::new("kill")
                .args([&format!("-{name}"), &pid.to_string()])
                .status()
                .is_ok_and(|status| status.success())
        };
        assert!(signal("STOP"), "kill -STOP {pid}");
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs_f64(seconds));
            assert!(signal("CONT"), "kill -CONT {pid}");
        })
    }

    /// `DEBUG SLEEP seconds` on the master, from a thread of its own; returns once it stopped
    /// answering.
    pub(crate) fn freeze_master(&self, seconds: f64) -> std::thread::JoinHandle<()> {
        super::redis_cli::freeze_port(self.master_port, seconds)
    }

    /// `kill -9` of the master; returns when it was killed.
    pub(crate) fn kill_master(&mut self) -> Instant {
        if let Some(master) = self.master.as_mut() {
            kill(master);
        }
        self.master = None;
        Instant::now()
    }

    /// `SENTINEL FAILOVER`: the sentinels promote the replica and demote the master (still
    /// running) to a replica of it; returns when it was asked.
    pub(crate) fn fail_over(&self) -> Instant {
        let asked = Instant::now();
        let reply = cli(
            self.sentinel_ports[0],
            &["sentinel", "failover", MASTER_NAME],
        );
        assert_eq!(reply, "OK", "SENTINEL FAILOVER");
        asked
    }

    /// Waits until the old master says it is a replica (`ROLE`), at most `limit`; returns
    /// when it first did.
    pub(crate) fn wait_demoted(&self, limit: Duration) -> Instant {
        wait_for(limit, "the old master's demotion", || {
            try_cli(self.master_port, &["role"]).is_ok_and(|role| role.starts_with("slave"))
        });
        Instant::now()
    }

    /// Waits until a sentinel names the replica as the master (`SENTINEL
    /// get-master-addr-by-name`), at most `limit`; returns when it first did.
    pub(crate) fn wait_promoted(&self, limit: Duration) -> Instant {
        let replica = self.replica_port.to_string();
        wait_for(limit, "the sentinels to promote the replica", || {
            self.sentinel_ports.iter().any(|&port| {
                try_cli(port, &["sentinel", "get-master-addr-by-name", MASTER_NAME])
                    .is_ok_and(|addr| addr.lines().any(|line| line.trim() == replica))
            })
        });
        Instant::now()
    }
}

impl Drop for PrivateSentinel {
    fn drop(&mut self) {
        for child in self
            .master
            .iter_mut()
            .chain(self.replica.iter_mut())
            .chain(self.sentinels.iter_mut())
        {
            kill(child);
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
