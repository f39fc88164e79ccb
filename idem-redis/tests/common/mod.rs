//! What the Redis tests share: the servers scripts/test started (a missing server is a failure,
//! never a skip), and the conformance harness.
#![allow(dead_code)]

use idem_core::testing::Harness;
use idem_core::{FencingToken, RecordId};
use idem_redis::redis;
use idem_redis::{RedisStore, RedisStoreBuilder};
use std::time::Duration;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run `bash scripts/test`, which starts Redis and a Redis Cluster")
    })
}

/// The single Redis.
pub(crate) fn redis_url() -> String {
    env("IDEM_REDIS_URL")
}

/// The cluster's nodes.
pub(crate) fn cluster_nodes() -> Vec<String> {
    env("IDEM_REDIS_CLUSTER_NODES")
        .split(',')
        .map(str::to_owned)
        .collect()
}

/// A free loopback port.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A redis-server of the test's own on a free port (installed by scripts/test; missing, the
/// test fails), with its files in `dir` and `args` added, and its port. A free port can be taken
/// by a test running beside this one before the server binds it: then another port is tried.
pub(crate) fn start_on_free_port(
    dir: &std::path::Path,
    args: &[&str],
) -> (std::process::Child, u16) {
    for _ in 0..5 {
        let port = free_port();
        if let Some(child) = try_start(port, dir, args) {
            return (child, port);
        }
    }
    panic!("redis-server did not start on five free ports in a row");
}

/// A redis-server of the test's own on `port` again (a restart), as [`start_on_free_port`].
pub(crate) fn start_server(port: u16, dir: &std::path::Path, args: &[&str]) -> std::process::Child {
    try_start(port, dir, args).unwrap_or_else(|| panic!("redis-server did not start on {port}"))
}

/// Starts redis-server and waits until it answers as itself: the server answering on `port`
/// must report the child's process id, since another process may hold that port (then the
/// child exits and `None` is returned).
fn try_start(port: u16, dir: &std::path::Path, args: &[&str]) -> Option<std::process::Child> {
    let mut child = std::process::Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(args)
        .arg("--dir")
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server is not installed: run `bash scripts/test`");
    for _ in 0..100 {
        if !matches!(child.try_wait(), Ok(None)) {
            break;
        }
        if process_id_on(port) == Some(child.id()) {
            return Some(child);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// The process id the Redis on `port` reports (`INFO server`), if one answers.
fn process_id_on(port: u16) -> Option<u32> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    conn.write_all(b"INFO server\r\n").ok()?;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = conn.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        seen.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&seen);
        if let Some(rest) = text.split("process_id:").nth(1) {
            if let Some((id, _)) = rest.split_once("\r\n") {
                return id.trim().parse().ok();
            }
        }
    }
}

/// A redis-server of the test's own ([`start_server`]) and its directory: stopped and the
/// directory removed when dropped, even by a failing assertion.
pub(crate) struct Server(pub std::process::Child, pub std::path::PathBuf);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

/// A new directory under the temporary directory.
pub(crate) fn temp_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("idem-redis-{}", FencingToken::generate()));
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

/// Every store gets a key prefix of its own, and a grace short enough that expired records
/// leave within the suite's waits (10 s) yet long enough that an orphan is still there, past its
/// lease, for the scenarios that list it (C9).
pub(crate) struct Redis {
    pub cluster: bool,
}

impl Redis {
    pub(crate) async fn store(&self) -> RedisStore {
        self.connect(RedisStore::builder().prefix(&format!("t{}", FencingToken::generate())))
            .await
    }

    /// A store with `builder`'s settings and the suite's grace, on this server.
    pub(crate) async fn connect(&self, builder: RedisStoreBuilder) -> RedisStore {
        let builder = builder.grace(Duration::from_secs(2));
        if self.cluster {
            let nodes = cluster_nodes();
            let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
            builder
                .connect_cluster(&nodes)
                .await
                .expect("connect to the cluster")
        } else {
            builder.connect(&redis_url()).await.expect("connect")
        }
    }

    /// Runs a command of the test's own on this server (routed by its key on the cluster):
    /// to write what the store would not.
    pub(crate) async fn raw<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        if self.cluster {
            let client =
                redis::cluster::ClusterClient::new(cluster_nodes()).expect("cluster client");
            let mut conn = client.get_async_connection().await.expect("connect");
            cmd.query_async(&mut conn).await.expect("raw command")
        } else {
            let client = redis::Client::open(redis_url()).expect("client");
            let mut conn = client
                .get_multiplexed_async_connection()
                .await
                .expect("connect");
            cmd.query_async(&mut conn).await.expect("raw command")
        }
    }
}

#[idem_core::store::async_trait]
impl Harness for Redis {
    type Store = RedisStore;

    async fn store(&self) -> RedisStore {
        Redis::store(self).await
    }

    async fn corrupt_response(&self, store: &RedisStore, id: &RecordId) {
        let changed: i64 = self
            .raw(
                redis::cmd("HSET")
                    .arg(store.key_of(id))
                    .arg("resp")
                    .arg(b"\x00\xff\x00".as_slice()),
            )
            .await;
        assert_eq!(changed, 0, "the field existed and was overwritten");
    }

    async fn corrupt_in_progress(&self, store: &RedisStore, id: &RecordId) -> bool {
        let added: i64 = self
            .raw(
                redis::cmd("HSET")
                    .arg(store.key_of(id))
                    .arg("resp")
                    .arg(b"\x00\xff\x00".as_slice()),
            )
            .await;
        assert_eq!(added, 1, "an in-progress record has no response field");
        true
    }
}
