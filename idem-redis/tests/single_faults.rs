//! One Redis behind a fault proxy, under 64 retrying clients, on a redis-server of the test's
//! own (append-only file synced on every write, so no acknowledged record is lost and any
//! second effect is a failure, C14). The same long-lived `RedisStore` throughout: while the
//! fault lasts every call is answered or is a 503 within its deadline (C13), and once the
//! fault ends the store answers again by itself within twice the deadline: its connection is
//! replaced when calls on it keep failing.

mod common;
mod support;

use fault_proxy::{Fault, FaultProxy};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::load::Seen;
use support::redis_cli::freeze_port;
use support::under_load::{engine, one_at_a_time, runtime, store_settings, through};

/// Starts a private Redis and a proxy in front of it, and runs `fault` under load against a
/// store connected through the proxy (see `support::under_load`).
fn under_load(
    name: &str,
    fault: impl FnOnce(&FaultProxy, u16) -> Instant + Send + 'static,
) -> Seen {
    let _one = one_at_a_time();
    let (port, dir) = (common::free_port(), common::temp_dir());
    let _server = Server(
        common::start_server(
            port,
            &dir,
            &[
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--enable-debug-command",
                "yes",
            ],
        ),
        dir,
    );
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
        let (seen, _, ()) = through(name, &idem, move || ((), fault(&faulty, port))).await;
        seen
    })
}

/// The test's redis-server, killed and its files removed when the test ends, failed or not.
struct Server(std::process::Child, std::path::PathBuf);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

/// A blackhole: nothing crosses the network for two seconds, both ways, every socket open;
/// then the traffic flows again.
#[test]
fn c13_a_blackholed_redis_under_load_is_a_503_within_the_deadline_and_the_same_store_heals() {
    let seen = under_load("blackholed", |proxy, _| {
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
    let seen = under_load("dropped-silently", |proxy, _| {
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
    let seen = under_load("frozen", |_, port| {
        freeze_port(port, 3.0).join().expect("DEBUG SLEEP");
        Instant::now()
    });
    assert!(
        !seen.errors.is_empty(),
        "the freeze was never seen by a call"
    );
}
