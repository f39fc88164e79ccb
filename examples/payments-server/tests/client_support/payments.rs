//! The project's payments server (examples/payments-server) as a real child process, on a
//! SQLite file in a temporary directory, with its test hooks on (`X-Test-Delay-Ms` makes a
//! charge slow inside its transaction; `GET /test/charges/count` counts committed charges).

use e2e_support::{Reply, ServerProcess};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::process::Command;

/// The API key the tests authenticate with.
pub(crate) const API_KEY: &str = "sk_test_idem_client";

/// The `payments-server` binary cargo built for these tests.
pub(crate) fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_payments-server"))
}

/// A temporary directory with the server's SQLite file and logs.
pub(crate) struct World {
    dir: tempfile::TempDir,
    servers: u32,
}

impl World {
    /// A fresh directory.
    pub(crate) fn new() -> World {
        World {
            dir: tempfile::tempdir().expect("a temp dir"),
            servers: 0,
        }
    }

    /// The SQLite file.
    pub(crate) fn database(&self) -> PathBuf {
        self.dir.path().join("payments.db")
    }

    /// Starts the server on the world's file, on `port` (0: any free port), with the lease
    /// `lease_ms`.
    pub(crate) async fn start(&mut self, port: u16, lease_ms: u64) -> ServerProcess {
        let binary = tokio::task::spawn_blocking(binary)
            .await
            .expect("building the payments server");
        self.servers += 1;
        let log = self.dir.path().join(format!("server-{}.log", self.servers));
        let mut cmd = Command::new(binary);
        cmd.arg("--addr")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--database")
            .arg(self.database())
            .arg("--lease-ms")
            .arg(lease_ms.to_string())
            .env("IDEM_TEST_HOOKS", "1")
            .env_remove("IDEM_ADDR")
            .env_remove("DATABASE_URL")
            .env_remove("IDEM_LEASE_MS")
            .current_dir(self.dir.path());
        ServerProcess::start("payments-server", cmd, log, "SQLite").await
    }
}

/// The port `server` listens on.
pub(crate) fn port(server: &ServerProcess) -> u16 {
    server
        .addr()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port in the address")
}

/// Committed charges, from the server's own `GET /test/charges/count`.
pub(crate) async fn charge_count(server: &ServerProcess) -> u64 {
    let reply = Reply::fetch(
        reqwest::Client::new()
            .get(server.url("/test/charges/count"))
            .bearer_auth(API_KEY)
            .timeout(Duration::from_secs(10)),
    )
    .await
    .expect("GET /test/charges/count");
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.describe());
    reply.json()["count"]
        .as_u64()
        .unwrap_or_else(|| panic!("no count: {}", reply.describe()))
}

/// The charges listed by the server's API (`GET /v1/charges?limit=100`).
pub(crate) async fn listed_charges(server: &ServerProcess) -> Vec<serde_json::Value> {
    let reply = Reply::fetch(
        reqwest::Client::new()
            .get(server.url("/v1/charges?limit=100"))
            .bearer_auth(API_KEY)
            .timeout(Duration::from_secs(10)),
    )
    .await
    .expect("GET /v1/charges");
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.describe());
    reply.json()["data"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("no data: {}", reply.describe()))
}
