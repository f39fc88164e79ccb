//! A Redis that may evict records is refused (C14: an evicted record makes its key new again
//! while the first holder still runs), and a Redis that stops answering is an error within the
//! response timeout, never a wait without end (C13). Each on a redis-server of its own.

mod common;

use common::{start_on_free_port, temp_dir};
use idem_core::{Error, Idempotency, StoreErrorKind};
use idem_redis::redis;
use idem_redis::RedisStore;
use std::time::{Duration, Instant};

#[tokio::test]
async fn c14_a_redis_that_may_evict_records_is_refused_unless_allowed() {
    let dir = temp_dir();
    let (mut server, port) = start_on_free_port(&dir, &["--maxmemory-policy", "allkeys-lru"]);
    let url = format!("redis://127.0.0.1:{port}");
    let refused = RedisStore::connect(&url)
        .await
        .map(|_| ())
        .expect_err("an evicting Redis");
    assert!(
        matches!(&refused, Error::Store(e) if e.kind() == StoreErrorKind::Misconfigured),
        "{refused}"
    );
    assert!(refused.to_string().contains("allkeys-lru"), "{refused}");
    RedisStore::builder()
        .allow_eviction(true)
        .connect(&url)
        .await
        .expect("allowed when the operator says so");
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query_async(&mut conn)
        .await
        .expect("config set");
    RedisStore::connect(&url)
        .await
        .expect("noeviction is accepted");
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn c13_a_redis_that_stops_answering_is_an_error_within_the_response_timeout() {
    let dir = temp_dir();
    let (mut server, port) = start_on_free_port(&dir, &[]);
    let url = format!("redis://127.0.0.1:{port}");
    let store = RedisStore::builder()
        .response_timeout(Duration::from_millis(300))
        .connect(&url)
        .await
        .expect("connect");
    let idem = Idempotency::new(store);
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut admin = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(5000)
        .arg("ALL")
        .query_async(&mut admin)
        .await
        .expect("pause");
    let request = idem
        .request("acct", "POST", "/v1/charges")
        .key(Some("k"))
        .body(b"{}")
        .build()
        .expect("request");
    let asked = Instant::now();
    let error = idem
        .begin(&request)
        .await
        .map(|_| ())
        .expect_err("no answer");
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "took {:?}",
        asked.elapsed()
    );
    assert!(matches!(error, Error::Store(_)), "{error}");
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(dir);
}
