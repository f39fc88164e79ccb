//! TCP keepalive on the store's connections (C13: a silent peer is found by the kernel, not
//! only by a call's deadline), read from the kernel's socket table.

mod common;
mod support;

use idem_core::FencingToken;
use idem_redis::{redis, RedisStore};
use support::keepalive::{connections, every_connection_probed};

/// The port of a `redis://host:port` URL.
fn port(url: &str) -> u16 {
    match redis::Client::open(url)
        .expect("a URL")
        .get_connection_info()
        .addr()
    {
        redis::ConnectionAddr::Tcp(_, port) => *port,
        other => panic!("not a TCP address: {other}"),
    }
}

/// C13: every connection a store on one Redis or on a Cluster opens has TCP keepalive; a
/// connection opened without the store's settings has none (the check can fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_every_connection_of_a_store_has_tcp_keepalive() {
    let url = common::redis_url();
    let single = port(&url);
    let plain = redis::Client::open(url.as_str())
        .expect("a client")
        .get_multiplexed_async_connection()
        .await
        .expect("a plain connection");
    let seen = tokio::task::spawn_blocking(move || connections(&[single]))
        .await
        .expect("the socket table");
    assert!(
        seen.iter().any(|(_, probed)| !probed),
        "a plain connection shows no keepalive timer: {seen:?}"
    );
    drop(plain);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;

    let prefix = format!("t{}", FencingToken::generate());
    let store = RedisStore::builder()
        .prefix(&prefix)
        .connect(&url)
        .await
        .expect("connect");
    let found = tokio::task::spawn_blocking(move || every_connection_probed(&[single]))
        .await
        .expect("the socket table");
    assert!(found >= 1, "the store's connection is there");
    drop(store);

    let nodes = common::cluster_nodes();
    let ports: Vec<u16> = nodes.iter().map(|node| port(node)).collect();
    let seeds: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let cluster = RedisStore::builder()
        .prefix(&prefix)
        .connect_cluster(&seeds)
        .await
        .expect("connect to the cluster");
    let found = tokio::task::spawn_blocking(move || every_connection_probed(&ports))
        .await
        .expect("the socket table");
    assert!(found >= 3, "a connection to every master: {found}");
    drop(cluster);
}
