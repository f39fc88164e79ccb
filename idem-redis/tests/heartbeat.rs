//! Renewals that the application cannot starve (C9): with every worker of the application's
//! runtime blocked by handlers for longer than the lease, the engine's heartbeat still renews
//! the leases on Redis (on a connection opened by its own thread, whose socket the blocked
//! runtime does not drive), so another instance never takes over a live execution. On one
//! Redis and on the Cluster.

mod common;

use common::Redis;
use idem_core::{
    Answer, Begin, Failure, FencingToken, Idempotency, Outcome, Policy, Request, StoredResponse,
};
use idem_redis::RedisStore;
use std::time::{Duration, Instant};

mod single {
    #[test]
    fn c09_renewals_do_not_depend_on_the_applications_workers() {
        super::renewals_outlive_blocked_workers(super::Redis { cluster: false });
    }
}

mod cluster {
    #[test]
    fn c09_renewals_do_not_depend_on_the_applications_workers() {
        super::renewals_outlive_blocked_workers(super::Redis { cluster: true });
    }
}

fn renewals_outlive_blocked_workers(redis: Redis) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let policy = Policy::default().lease(Duration::from_millis(600));
    let prefix = format!("t{}", FencingToken::generate());
    // The store's connection is opened on the application's runtime, whose workers the
    // handlers below block: its socket is driven by a task of that runtime.
    let store = runtime.block_on(redis.connect(RedisStore::builder().prefix(&prefix)));
    let idem = Idempotency::with_policy(store, policy.clone()).expect("policy");
    let requests: Vec<Request> = (0..2)
        .map(|i| {
            idem.request("acct", "POST", "/charges")
                .key(Some(&format!("blocked-{i}")))
                .body(b"{}")
                .build()
                .expect("valid")
        })
        .collect();
    let asked = requests[0].clone();
    let started = Instant::now();
    // Another instance, with a runtime and a connection of its own (a clone of the store would
    // share the connection the blocked runtime drives, and wait for the handlers to end), asks
    // once the lease would have passed without renewals.
    let probe = std::thread::spawn(move || {
        let probe = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        probe.block_on(async {
            let store = redis.connect(RedisStore::builder().prefix(&prefix)).await;
            let other = Idempotency::with_policy(store, policy).expect("policy");
            tokio::time::sleep_until((started + Duration::from_millis(1600)).into()).await;
            other.begin(&asked).await.expect("begin")
        })
    });
    runtime.block_on(async {
        let (began, handler_began) = std::sync::mpsc::channel();
        let mut runs = Vec::new();
        for request in requests {
            let (idem, began) = (idem.clone(), began.clone());
            runs.push(tokio::spawn(async move {
                idem.run(&request, move |_| async move {
                    let _ = began.send(());
                    // A handler that blocks its worker thread (a synchronous call).
                    std::thread::sleep(Duration::from_millis(2500));
                    Ok::<_, Failure<&'static str>>(StoredResponse::new(201, "charged"))
                })
                .await
            }));
            // One after the other, so that each handler blocks a worker of its own: executions
            // woken together may wait behind the same blocked worker, their leases unrenewed
            // before their heartbeat even starts.
            handler_began
                .recv_timeout(Duration::from_secs(5))
                .expect("the handler started");
        }
        for run in runs {
            let outcome = run.await.expect("joined").expect("ran");
            assert!(matches!(outcome, Outcome::Executed(_)), "{outcome:?}");
        }
    });
    let seen = probe.join().expect("probe");
    assert!(
        matches!(seen, Begin::Answered(Answer::InFlight { .. })),
        "another instance took over a live execution: {seen:?}"
    );
}
