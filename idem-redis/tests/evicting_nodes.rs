//! A Redis that may evict records is refused on every connection the store opens, not only
//! its first (C7, C14: an evicted completed record makes its key new, and a retry runs the
//! effect again instead of replaying): a master the sentinels promote later, and every node
//! of a Cluster. A refused connection is never used; calls fail misconfigured within their
//! deadline until one is accepted (C13). Each on a setup of the test's own.

mod support;

use idem_core::{Error, Failure, Idempotency, Outcome, RunError, StoreErrorKind, StoredResponse};
use idem_redis::RedisStore;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::private_cluster::PrivateCluster;
use support::private_sentinel::{PrivateSentinel, MASTER_NAME};
use support::redis_cli::cli;

/// The store's response and connection timeouts: a call ends within both.
const TIMEOUTS: Duration = Duration::from_millis(500);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

fn is_refusal(error: &RunError<Infallible>) -> bool {
    matches!(error, RunError::Idem(Error::Store(e))
        if e.kind() == StoreErrorKind::Misconfigured && error.to_string().contains("allkeys-lru"))
}

/// One charge on `key`, counted in `effects`; with the time it took.
async fn charge(
    idem: &Idempotency<RedisStore>,
    effects: &Arc<AtomicUsize>,
    key: &str,
) -> (Result<Outcome, RunError<Infallible>>, Duration) {
    let request = charge_request(idem, key);
    let effects = Arc::clone(effects);
    let asked = Instant::now();
    let outcome = idem
        .run(&request, move |_ctx| async move {
            effects.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failure<Infallible>>(StoredResponse::new(201, "charged"))
        })
        .await;
    (outcome, asked.elapsed())
}

/// Where the record of `key` would be.
fn record_key(idem: &Idempotency<RedisStore>, key: &str) -> String {
    idem.store().key_of(charge_request(idem, key).id())
}

/// The request of one charge on `key`.
fn charge_request(idem: &Idempotency<RedisStore>, key: &str) -> idem_core::Request {
    idem.request("acct", "POST", "/charges")
        .key(Some(key))
        .body(b"{\"amount\":100}")
        .build()
        .expect("request")
}

/// The attack: the replica is provisioned `allkeys-lru` (a cache's template); the sentinels
/// promote it. The store follows the promotion, and its connection to the new master is
/// refused: no call is ever served there, each fails misconfigured within its deadline and
/// runs no effect. Once the operator sets `noeviction`, a later connection is accepted.
#[test]
fn c07_a_failover_onto_an_evicting_replica_is_refused() {
    let setup = PrivateSentinel::start();
    let replica = setup.replica_port();
    let set = |policy: &str| cli(replica, &["config", "set", "maxmemory-policy", policy]);
    assert_eq!(set("allkeys-lru"), "OK");
    let deadline = TIMEOUTS * 2 + Duration::from_millis(500);
    let rt = runtime();
    let effects = Arc::new(AtomicUsize::new(0));
    let idem = rt.block_on(async {
        let urls = setup.urls();
        let sentinels: Vec<&str> = urls.iter().map(String::as_str).collect();
        let store = RedisStore::builder()
            .response_timeout(TIMEOUTS)
            .connection_timeout(TIMEOUTS)
            .connect_sentinel(&sentinels, MASTER_NAME)
            .await
            .expect("the master is noeviction");
        let idem = Idempotency::new(store);
        let (first, _) = charge(&idem, &effects, "before").await;
        assert!(first.is_ok(), "{:?}", first.err());
        idem
    });
    // The store's tasks go on on the runtime's workers meanwhile.
    setup.fail_over();
    let promoted = setup.wait_promoted(Duration::from_secs(20));
    rt.block_on(async {
        let mut refused = 0;
        let mut i = 0;
        while refused < 5 {
            assert!(
                promoted.elapsed() < Duration::from_secs(10),
                "no refusal within 10 s of the promotion"
            );
            i += 1;
            let key = format!("after-{i}");
            let ran = effects.load(Ordering::SeqCst);
            let (outcome, took) = charge(&idem, &effects, &key).await;
            assert!(took < deadline, "a call took {took:?}");
            assert_ne!(
                cli(replica, &["exists", &record_key(&idem, &key)]),
                "1",
                "a call was served by the evicting master: {:?}",
                outcome.as_ref().map(Outcome::kind)
            );
            match outcome {
                Err(error) if is_refusal(&error) => {
                    assert_eq!(effects.load(Ordering::SeqCst), ran, "no effect runs");
                    refused += 1;
                }
                // The old master, until it is demoted (READONLY once it is).
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        // Once the new master is set to noeviction, a later connection is accepted.
        assert_eq!(set("noeviction"), "OK");
        let fixed = Instant::now();
        loop {
            i += 1;
            let key = format!("fixed-{i}");
            let (outcome, took) = charge(&idem, &effects, &key).await;
            assert!(took < deadline, "a call took {took:?}");
            if outcome.is_ok() {
                assert_eq!(cli(replica, &["exists", &record_key(&idem, &key)]), "1");
                break;
            }
            assert!(
                fixed.elapsed() < Duration::from_secs(8),
                "still refused once fixed: {:?}",
                outcome.err()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

/// The attack: one master of three is `allkeys-lru`. Every connection asks every node, so the
/// Cluster is refused whichever node that is and however often the store connects (`CONFIG
/// GET` routed to one random node accepted it two times out of three).
#[test]
fn c07_a_cluster_with_one_evicting_master_is_refused() {
    let cluster = PrivateCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    runtime().block_on(async {
        for port in cluster.ports() {
            let set = |policy: &str| cli(port, &["config", "set", "maxmemory-policy", policy]);
            assert_eq!(set("allkeys-lru"), "OK");
            for _ in 0..4 {
                let refused = RedisStore::builder()
                    .connect_cluster(&nodes)
                    .await
                    .map(drop)
                    .expect_err("a Cluster with an evicting master");
                assert!(
                    matches!(&refused, Error::Store(e) if e.kind() == StoreErrorKind::Misconfigured),
                    "{refused}"
                );
                assert!(refused.to_string().contains("allkeys-lru"), "{refused}");
            }
            assert_eq!(set("noeviction"), "OK");
        }
        RedisStore::builder()
            .connect_cluster(&nodes)
            .await
            .expect("every node noeviction");
        RedisStore::builder()
            .allow_eviction(true)
            .connect_cluster(&nodes)
            .await
            .expect("allowed when the operator says so");
    });
}
