//! Every connection speaks RESP2, whatever the URL asks (C10, C13): over RESP3 redis-rs
//! reconnects to a restarted server without failing a call, and the store could not empty the
//! replay cache of records the server lost. Counted on the servers, by `CLIENT LIST`.

mod common;

use idem_core::{Begin, FencingToken, Idempotency, Request};
use idem_redis::{redis, RedisStore};

/// How many clients of the server at `url` speak RESP3.
async fn resp3_clients(url: &str) -> usize {
    let client = redis::Client::open(url).expect("a client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connects");
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .expect("CLIENT LIST");
    list.lines().filter(|line| line.contains(" resp=3")).count()
}

/// Reserves a few keys through `idem`, so that its connections are open.
async fn reserve_some(idem: &Idempotency<RedisStore>) {
    for key in ["a", "b", "c", "d", "e", "f"] {
        let request = Request::builder("acct", "POST", "/charges")
            .key(Some(key))
            .body(b"{}")
            .build()
            .expect("a request");
        let begun = idem.begin(&request).await.expect("the store answers");
        assert!(matches!(begun, Begin::Acquired(_)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c10_a_url_asking_for_resp3_gets_resp2_on_one_server_and_a_cluster() {
    let single = common::redis_url();
    let store = RedisStore::builder()
        .prefix(&format!("resp{}", FencingToken::generate()))
        .connect(&format!("{single}/?protocol=resp3"))
        .await
        .expect("a store over a resp3 URL");
    reserve_some(&Idempotency::new(store)).await;
    assert_eq!(resp3_clients(&single).await, 0, "one server");

    let nodes = common::cluster_nodes();
    let seeds: Vec<String> = nodes
        .iter()
        .map(|n| format!("{n}/?protocol=resp3"))
        .collect();
    let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
    let store = RedisStore::builder()
        .prefix(&format!("resp{}", FencingToken::generate()))
        .connect_cluster(&seeds)
        .await
        .expect("a cluster store over resp3 URLs");
    reserve_some(&Idempotency::new(store)).await;
    for node in &nodes {
        assert_eq!(resp3_clients(node).await, 0, "cluster node {node}");
    }
}
