//! One fault under load, as every fault test runs it: 64 retrying clients on a long-lived
//! store, the fault injected from a thread of its own, the clients going on for a while after
//! it ended, then the checks: no hang, every 503 within the deadline, every key answered, no
//! key run twice, the store answering again within twice the deadline.

use super::load::{Clients, Load, Seen};
use idem_core::{FencingToken, Idempotency, Policy, Store};
use idem_redis::RedisStoreBuilder;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The store's response and connection timeouts: short, so faults show within a test.
pub(crate) const STORE_TIMEOUTS: Duration = Duration::from_millis(300);
/// The engine's bound on every store call (`Policy::store_timeout`): the deadline.
pub(crate) const DEADLINE: Duration = Duration::from_secs(1);

/// What a loaded two-core machine may add to a bound: scheduling, a test thread's polling.
pub(crate) const MARGIN: Duration = Duration::from_millis(500);
pub(crate) const LEASE: Duration = Duration::from_secs(3);
pub(crate) const CLIENTS: Clients = Clients {
    tasks: 64,
    retry: Duration::from_millis(200),
    // An execution whose completion cannot be written keeps its caller for the lease (C8).
    hang: Duration::from_secs(6),
    give_up: Duration::from_secs(10),
};
/// How long the clients go on once the fault has ended.
const AFTER: Duration = Duration::from_secs(4);

/// One fault at a time in a test binary: each runs 64 clients and servers on a small machine,
/// and the figures it checks are times.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Holds the binary's other fault tests off while it lives; shows the store's own warnings
/// (a connection rebuilt) in the test's output.
pub(crate) fn one_at_a_time() -> MutexGuard<'static, ()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("idem_redis=warn")
        .with_test_writer()
        .try_init();
    ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A runtime for a fault test: two workers, as the machines the tests run on.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The store's settings: a prefix of its own, the short timeouts.
pub(crate) fn store_settings() -> RedisStoreBuilder {
    idem_redis::RedisStore::builder()
        .prefix(&format!("t{}", FencingToken::generate()))
        .response_timeout(STORE_TIMEOUTS)
        .connection_timeout(STORE_TIMEOUTS)
}

/// The settings of one of several engines' stores over the same records: `prefix`, the short
/// timeouts, and a WAIT for a replica of `WAIT_MS` milliseconds when that variable is set.
pub(crate) fn shared_store_settings(prefix: &str) -> RedisStoreBuilder {
    let wait = std::env::var("WAIT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis);
    idem_redis::RedisStore::builder()
        .prefix(prefix)
        .wait_for_replica(wait)
        .response_timeout(STORE_TIMEOUTS)
        .connection_timeout(STORE_TIMEOUTS)
}

/// The engines' policy: the [`LEASE`], store calls bounded by [`DEADLINE`].
pub(crate) fn policy() -> Policy {
    Policy::default().lease(LEASE).store_timeout(DEADLINE)
}

/// The engine over `store`, its store calls bounded by [`DEADLINE`].
pub(crate) fn engine<S: Store + 'static>(store: S) -> Idempotency<S> {
    Idempotency::with_policy(store, policy()).expect("a valid policy")
}

/// Runs the clients on `idem`, injects `fault` on a blocking thread once they are going (it
/// returns when the fault ended), lets them go on for a while, prints what they saw and checks
/// it (see the [module](self)). Returns what they saw and when the fault ended.
pub(crate) async fn through<S: Store + 'static, T: Send + 'static>(
    name: &str,
    idem: &Idempotency<S>,
    fault: impl FnOnce() -> (T, Instant) + Send + 'static,
) -> (Seen, Instant, T) {
    let load = Load::start(idem, name, CLIENTS);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (kept, ended) = tokio::task::spawn_blocking(fault).await.expect("the fault");
    tokio::time::sleep(AFTER).await;
    let seen = load.stop(idem).await;
    println!("{name}: {}", seen.summary(ended));
    check(name, &seen, ended);
    (seen, ended, kept)
}

fn check(name: &str, seen: &Seen, ended: Instant) {
    assert_eq!(seen.hangs, 0, "{name}: calls hung: {}", seen.summary(ended));
    assert!(
        seen.slowest_refusal <= DEADLINE + CLIENTS.retry,
        "{name}: a 503 took {:?}, past the deadline {DEADLINE:?}",
        seen.slowest_refusal
    );
    assert!(
        seen.unanswered.is_empty(),
        "{name}: keys never answered: {:?}",
        seen.unanswered
    );
    assert!(
        seen.duplicates().is_empty(),
        "{name}: effects ran twice, which no lost record explains (C14): {:?}",
        seen.duplicates()
    );
    let recovery = seen.recovery_after(ended);
    assert!(
        recovery <= 2 * DEADLINE,
        "{name}: the store went on failing {recovery:?} after the fault ended: {}",
        seen.summary(ended)
    );
    assert!(
        seen.answered_after(ended + recovery) > 0,
        "{name}: nothing was answered after the fault"
    );
}
