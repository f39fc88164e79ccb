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
    config_set(&url, "maxmemory-policy", "noeviction").await;
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

/// An evicting `maxmemory-policy` set while the store is connected (`CONFIG SET`, an operator,
/// a managed Redis's settings) is seen within seconds, not only by the next connection opened:
/// an evicted in-progress record makes its key new again while its holder still runs, and
/// another process would run the effect a second time within the lease (C4, C14). Once seen,
/// the store refuses, as at `connect`: its calls fail misconfigured, naming the policy, until
/// the policy is `noeviction` again, and then answers by itself.
#[tokio::test]
async fn c14_an_evicting_policy_set_while_connected_is_refused_within_seconds() {
    use common::Server;
    use idem_core::{Begin, Policy};
    let dir = temp_dir();
    let (child, port) = start_on_free_port(&dir, &[]);
    let _server = Server(child, dir);
    let url = format!("redis://127.0.0.1:{port}");
    let engine = |store| {
        Idempotency::with_policy(store, Policy::default().lease(Duration::from_secs(60)))
            .expect("policy")
    };
    // Two processes, both connected while the policy is noeviction.
    let first = engine(RedisStore::connect(&url).await.expect("connect"));
    let second = engine(RedisStore::connect(&url).await.expect("connect"));
    let request = first
        .request("acct", "POST", "/v1/charges")
        .key(Some("evicted"))
        .body(b"{}")
        .build()
        .expect("request");
    let Begin::Acquired(_held) = first.begin(&request).await.expect("begin") else {
        panic!("a fresh key is acquired");
    };
    let record = RedisStore::connect(&url)
        .await
        .expect("connect")
        .key_of(request.id());

    // The operator changes the policy; memory runs short and the record is evicted.
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut admin = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let config = |name: &str, value: &str| {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("SET").arg(name).arg(value);
        cmd
    };
    let () = config("maxmemory-policy", "allkeys-lru")
        .query_async(&mut admin)
        .await
        .expect("config set");
    let () = config("maxmemory", "3mb")
        .query_async(&mut admin)
        .await
        .expect("config set");
    let filler = vec![b'x'; 10_000];
    let mut evicted = false;
    for batch in 0..200 {
        let mut pipe = redis::pipe();
        for i in 0..100 {
            pipe.cmd("SET")
                .arg(format!("filler:{batch}:{i}"))
                .arg(&filler)
                .ignore();
        }
        let () = pipe.query_async(&mut admin).await.expect("fill");
        let exists: i64 = redis::cmd("EXISTS")
            .arg(&record)
            .query_async(&mut admin)
            .await
            .expect("exists");
        if exists == 0 {
            evicted = true;
            break;
        }
    }
    assert!(evicted, "the record was evicted");

    // Seconds later, a retry reaches the other process, within the first one's lease.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let retry = second.begin(&request).await;
    eprintln!("the retry, within the lease of a record evicted: {retry:?}");
    assert!(
        !matches!(retry, Ok(Begin::Acquired(_))),
        "a Redis that evicts is refused, never a second execution within the lease: {retry:?}"
    );
    assert!(
        matches!(&retry, Err(Error::Store(e)) if e.kind() == StoreErrorKind::Misconfigured
            && e.to_string().contains("allkeys-lru")),
        "{retry:?}"
    );

    // The policy set back: the same store answers again by itself.
    let () = config("maxmemory-policy", "noeviction")
        .query_async(&mut admin)
        .await
        .expect("config set");
    let () = config("maxmemory", "0")
        .query_async(&mut admin)
        .await
        .expect("config set");
    let healed = Instant::now();
    loop {
        let again = second.begin(&request).await;
        if again.is_ok() {
            break;
        }
        assert!(
            healed.elapsed() < Duration::from_secs(10),
            "still refused after noeviction: {again:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The policy is asked again however the store's runtime changes: a store connected on one
/// runtime (a setup runtime, a test harness's) and used on another once the first has stopped
/// still sees an evicting `maxmemory-policy` set while connected within seconds, and refuses it
/// (C4, C14), never an acquisition over a Redis that may evict the record meanwhile.
#[test]
fn c14_an_evicting_policy_is_refused_after_the_connecting_runtime_stopped() {
    let setup = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    refused_after_the_runtime_changed(setup, false);
}

/// The same with a store connected on a runtime that is kept but no longer driven (a
/// current-thread runtime whose `block_on` returned, kept alive in the application's state).
#[test]
fn c14_an_evicting_policy_is_refused_while_the_connecting_runtime_idles() {
    let setup = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    refused_after_the_runtime_changed(setup, true);
}

/// A store connected on `setup`, which is then dropped or (`keep`) kept and never driven again,
/// and used on another runtime, where calls go on: an evicting policy set while connected is
/// refused within seconds.
fn refused_after_the_runtime_changed(setup: tokio::runtime::Runtime, keep: bool) {
    use common::Server;
    use idem_core::{Begin, Policy};
    let dir = temp_dir();
    let (child, port) = start_on_free_port(&dir, &[]);
    let _server = Server(child, dir);
    let url = format!("redis://127.0.0.1:{port}");
    let store = setup.block_on(RedisStore::connect(&url)).expect("connect");
    let _kept = if keep {
        Some(setup)
    } else {
        drop(setup);
        None
    };

    let serving = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    serving.block_on(async {
        let idem = Idempotency::with_policy(store, Policy::default()).expect("policy");
        let request = |key: &str| {
            idem.request("acct", "POST", "/v1/charges")
                .key(Some(key))
                .body(b"{}")
                .build()
                .expect("request")
        };
        // The store heals onto this runtime while the policy is noeviction.
        let started = Instant::now();
        loop {
            if let Ok(Begin::Acquired(_)) = idem
                .begin(&request(&format!("warm-{}", started.elapsed().as_nanos())))
                .await
            {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "never healed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        config_set(&url, "maxmemory-policy", "allkeys-lru").await;
        // Calls go on meanwhile, as in any application.
        let until = Instant::now() + Duration::from_secs(12);
        while Instant::now() < until {
            let _ = idem.begin(&request("meanwhile")).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let after = idem.begin(&request("after-policy")).await;
        assert!(
            matches!(&after, Err(Error::Store(e)) if e.kind() == StoreErrorKind::Misconfigured
                && e.to_string().contains("allkeys-lru")),
            "an evicting policy set while connected went unseen: {after:?}"
        );
    });
}

/// `CONFIG SET name value` on the Redis at `url`, as an operator would.
async fn config_set(url: &str, name: &str, value: &str) {
    let client = redis::Client::open(url).expect("url");
    let mut admin = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(&mut admin)
        .await
        .expect("config set");
}
