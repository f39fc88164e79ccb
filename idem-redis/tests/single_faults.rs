//! One Redis behind a fault proxy, under 64 retrying clients, on a redis-server of the test's
//! own (append-only file synced on every write, so no acknowledged record is lost and any
//! second effect is a failure, C14). The same long-lived `RedisStore` throughout: while the
//! fault lasts every call is answered or is a 503 within its deadline (C13), and once the
//! fault ends the store answers again by itself within twice the deadline: its connection is
//! replaced when calls on it keep failing.

mod common;
mod support;

use fault_proxy::{Fault, FaultProxy};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use support::load::Seen;
use support::redis_cli::freeze_port;
use support::under_load::{engine, one_at_a_time, runtime, store_settings, through};

/// The private Redis's settings: every write synced to its append-only file, so a restart
/// loses no acknowledged record.
const SERVER_ARGS: [&str; 6] = [
    "--appendonly",
    "yes",
    "--appendfsync",
    "always",
    "--enable-debug-command",
    "yes",
];

/// Starts a private Redis and a proxy in front of it, and runs `fault` under load against a
/// store connected through the proxy (see `support::under_load`). `fault` gets the proxy, the
/// server's port and the server itself (to kill and restart it).
fn under_load(
    name: &str,
    fault: impl FnOnce(&FaultProxy, u16, &mut Server) -> Instant + Send + 'static,
) -> Seen {
    let _one = one_at_a_time();
    let dir = common::temp_dir();
    let (child, port) = common::start_on_free_port(&dir, &SERVER_ARGS);
    // Kept here, so that it outlives the fault and the load after it.
    let server = Arc::new(Mutex::new(Server {
        child: Some(child),
        port,
        dir,
    }));
    let faulted = Arc::clone(&server);
    runtime().block_on(async move {
        let proxy = Arc::new(
            FaultProxy::start(&format!("127.0.0.1:{port}"))
                .await
                .expect("a fault proxy"),
        );
        let store = store_settings()
            .connect(&format!("redis://{}", proxy.addr()))
            .await
            .expect("connect through the proxy");
        let idem = engine(store);
        let faulty = Arc::clone(&proxy);
        let (seen, _, ()) = through(name, &idem, move || {
            let mut server = faulted.lock().unwrap_or_else(PoisonError::into_inner);
            let ended = fault(&faulty, port, &mut server);
            ((), ended)
        })
        .await;
        seen
    })
}

/// The test's redis-server, killed and its files removed when the test ends, failed or not.
struct Server {
    child: Option<std::process::Child>,
    port: u16,
    dir: std::path::PathBuf,
}

impl Server {
    /// `kill -9`: no shutdown, no last write.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The same server again: the same port, the same append-only file.
    fn restart(&mut self) {
        self.kill();
        self.child = Some(common::start_server(self.port, &self.dir, &SERVER_ARGS));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A blackhole: nothing crosses the network for two seconds, both ways, every socket open;
/// then the traffic flows again.
#[test]
fn c13_a_blackholed_redis_under_load_is_a_503_within_the_deadline_and_the_same_store_heals() {
    let seen = under_load("blackholed", |proxy, _, _| {
        proxy.set(Fault::Freeze);
        std::thread::sleep(Duration::from_secs(2));
        proxy.set(Fault::PassThrough);
        Instant::now()
    });
    assert!(
        !seen.errors.is_empty(),
        "the blackhole was never seen by a call"
    );
}

/// The server's side of every connection ends without the client hearing of it (its FIN lost
/// in a partition, a NAT that forgot the flow): the store's socket stays open, and what it
/// sends goes nowhere. New connections work again a second later. Only a new connection heals
/// this: the old one never answers again.
#[test]
fn c13_a_connection_the_network_dropped_silently_is_replaced_and_the_same_store_heals() {
    let seen = under_load("dropped-silently", |proxy, _, _| {
        proxy.set(Fault::ServerGone);
        std::thread::sleep(Duration::from_secs(1));
        proxy.set(Fault::PassThrough);
        Instant::now()
    });
    assert!(
        !seen.errors.is_empty(),
        "the dropped connection was never seen by a call"
    );
}

/// `DEBUG SLEEP` three times the deadline: every call is a 503 within the deadline, and the
/// store answers again once Redis wakes.
#[test]
fn c13_a_redis_frozen_past_the_deadline_under_load_and_the_same_store_heals() {
    let seen = under_load("frozen", |_, port, _| {
        freeze_port(port, 3.0).join().expect("DEBUG SLEEP");
        Instant::now()
    });
    assert!(
        !seen.errors.is_empty(),
        "the freeze was never seen by a call"
    );
}

/// `kill -9` of the Redis, restarted on the same port and files three seconds later: calls are
/// 503s within the deadline meanwhile, no acknowledged record is lost (the append-only file is
/// synced on every write), so no effect runs twice, and the same store answers again once the
/// server is back.
#[test]
fn c13_a_redis_killed_and_restarted_under_load_and_the_same_store_heals() {
    let seen = under_load("killed", |_, _, server| {
        server.kill();
        std::thread::sleep(Duration::from_secs(3));
        server.restart();
        Instant::now()
    });
    assert!(
        !seen.errors.is_empty(),
        "the killed server was never seen by a call"
    );
}
