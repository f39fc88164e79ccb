//! The middleware example (examples/middleware.rs) run end to end, as a child process: the
//! real payments server (examples/payments-server) on a SQLite file, and a fault proxy between
//! them that loses the answers to some charges after the server made them. Each lost answer is
//! retried under its operation's key and gets the charge's replay: one charge per order.
//!
//! The server binary is the one cargo builds for the workspace (`cargo test --workspace`
//! builds it; `cargo build -p payments-server` before `cargo test -p idem-client`); the
//! example is built by `cargo test` itself.

use e2e_support::{Reply, ServerProcess};
use fault_proxy::{FaultProxy, LoseAnswer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::process::Command;

/// The API key the example authenticates with.
const API_KEY: &str = "sk_test_123";

/// The orders whose answers the proxy loses, one after the other.
const LOST: [&str; 2] = ["order-1", "order-3"];

/// How many orders the example charges.
const ORDERS: usize = 4;

/// A binary cargo built beside this test, at `relative` under `target/<profile>`.
fn built(relative: &str, how: &str) -> PathBuf {
    // This test runs as target/<profile>/deps/<name>-<hash>.
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let path = profile.join(format!("{relative}{}", std::env::consts::EXE_SUFFIX));
    assert!(path.exists(), "{} is not built: {how}", path.display());
    path
}

/// Loses the answer to the charge of `order` once the server made it: the proxy forwards the
/// request, swallows the answer's head and closes the connection.
fn lose_answer_to(order: &str) -> LoseAnswer {
    LoseAnswer::to(format!("description={order}&")).reply_end(b"\r\n\r\n".to_vec())
}

/// `GET path` on the server itself (not through the proxy), as the example's account.
async fn fetch(server: &ServerProcess, path: &str) -> Reply {
    let reply = Reply::fetch(
        reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("a reqwest client")
            .get(server.url(path))
            .basic_auth(API_KEY, None::<&str>)
            .timeout(Duration::from_secs(10)),
    )
    .await
    .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.describe());
    reply
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_charges_each_order_once_though_answers_are_lost() {
    let server_binary = built(
        "payments-server",
        "run `cargo build -p payments-server` first (cargo test --workspace builds it)",
    );
    let example = built(
        "examples/middleware",
        "run `cargo test -p idem-client` (it builds the examples), or `cargo build -p idem-client --example middleware`",
    );
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut command = Command::new(server_binary);
    command
        .arg("--addr")
        .arg("127.0.0.1:0")
        .arg("--database")
        .arg(dir.path().join("payments.db"))
        .env("IDEM_TEST_HOOKS", "1")
        .env_remove("IDEM_ADDR")
        .env_remove("DATABASE_URL")
        .env_remove("IDEM_LEASE_MS")
        .current_dir(dir.path());
    let server = ServerProcess::start(
        "payments-server",
        command,
        dir.path().join("server.log"),
        "SQLite",
    )
    .await;
    let proxy = Arc::new(
        FaultProxy::start(server.addr())
            .await
            .expect("a proxy in front of the server"),
    );
    // The proxy loses one answer at a time: the next is armed once the one before fired.
    proxy.set(lose_answer_to(LOST[0]));
    let rearm = tokio::spawn({
        let proxy = Arc::clone(&proxy);
        async move {
            for (fired, next) in LOST.iter().skip(1).enumerate() {
                while proxy.answers_lost() <= fired {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                proxy.set(lose_answer_to(next));
            }
        }
    });

    let run = Command::new(example)
        .arg(format!("http://{}", proxy.addr()))
        .arg(ORDERS.to_string())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the example ends within two minutes")
        .expect("the example runs");
    rearm.abort();
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("the example, through a proxy that loses the answers to {LOST:?}:");
    for line in stdout.lines() {
        println!("  {line}");
    }
    println!("answers lost by the proxy: {}", proxy.answers_lost());
    assert!(
        output.status.success(),
        "the example failed ({}): {stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(proxy.answers_lost(), LOST.len(), "{stdout}");

    for n in 1..=ORDERS {
        let order = format!("order-{n}");
        let line = stdout
            .lines()
            .find(|line| line.starts_with(&format!("{order}:")))
            .unwrap_or_else(|| panic!("no line for {order}: {stdout}"));
        let attempts: u32 = line
            .split_once(": ")
            .and_then(|(_, rest)| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no attempts in {line:?}"));
        assert!(line.contains("200 OK"), "{line}");
        if LOST.contains(&order.as_str()) {
            // The first attempt's answer was lost; a retry under the same key got the replay.
            assert!(attempts >= 2, "{line}");
            assert!(line.ends_with("replayed: true"), "{line}");
        } else {
            assert_eq!(attempts, 1, "{line}");
            assert!(line.ends_with("replayed: false"), "{line}");
        }
    }
    assert!(
        stdout
            .lines()
            .any(|line| line == format!("charges: {ORDERS}")),
        "{stdout}"
    );

    // Counted by the server itself: one charge per order, none twice.
    let count = fetch(&server, "/test/charges/count").await.json()["count"].as_u64();
    assert_eq!(count, Some(ORDERS as u64));
    let listed = fetch(&server, "/v1/charges?limit=100").await.json();
    let mut descriptions: Vec<String> = listed["data"]
        .as_array()
        .expect("a list of charges")
        .iter()
        .map(|charge| charge["description"].as_str().unwrap_or("").to_owned())
        .collect();
    descriptions.sort();
    let expected: Vec<String> = (1..=ORDERS).map(|n| format!("order-{n}")).collect();
    assert_eq!(descriptions, expected);
}
