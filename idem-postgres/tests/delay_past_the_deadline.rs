//! A network slower than the deadline (C13): every piece between the store and PostgreSQL
//! arrives a second late, longer than the engine's deadline for a store call. Every call is a
//! 503 within the deadline, never a hang and never an answer read off a connection still
//! waiting for an earlier one; the connections the deadline cut off are settled or discarded,
//! and once the network is fast again the store answers by itself within two deadlines.
//! Nothing is charged twice.

mod common;
mod support;

use common::{pg_url, SCHEMA};
use fault_proxy::Fault;
use idem_core::{FencingToken, Policy};
use idem_postgres::PgStore;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::bench::{answered, kind, tally, unavailable, Bench};

const STORE_TIMEOUT: Duration = Duration::from_millis(700);
/// Each piece, each way: a round trip takes twice this, far past the deadline.
const DELAY: Duration = Duration::from_secs(1);
/// How long the network stays slow.
const SLOW_FOR: Duration = Duration::from_secs(2);
const RETRY_EVERY: Duration = Duration::from_millis(100);
/// The slowest paths are three bounded steps.
const CALL_DEADLINE: Duration = Duration::from_millis(3 * 700);
const TASKS: usize = 8;

/// C13: answers later than the deadline are 503s within it, and the store recovers by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c13_answers_later_than_the_deadline_are_503s_and_the_store_recovers() {
    let builder = PgStore::builder()
        .max_connections(4)
        .acquire_timeout(STORE_TIMEOUT)
        .statement_timeout(Duration::from_millis(500))
        .lock_timeout(Duration::from_millis(400))
        .idle_in_transaction_timeout(Duration::from_millis(300))
        .transaction_timeout(Duration::from_secs(3));
    let policy = Policy::default()
        .store_timeout(STORE_TIMEOUT)
        .lease(Duration::from_secs(3));
    let bench = Arc::new(Bench::new(&pg_url(), SCHEMA, builder, policy).await);
    let run = FencingToken::generate();
    // Connections of the store and of the pool are open and warm before the network slows.
    for n in 0..TASKS {
        let warm = bench.request(&format!("warm-{run}-{n}"));
        assert!(answered(&bench.charge(&warm).await), "a warm-up charge");
    }

    bench.proxy.set(Fault::Delay(DELAY));
    let slowed = Instant::now();
    let mut clients = Vec::new();
    for task in 0..TASKS {
        let bench = Arc::clone(&bench);
        clients.push(tokio::spawn(async move {
            let mut calls = Vec::new();
            let mut n = 0;
            while slowed.elapsed() < SLOW_FOR {
                let request = bench.request(&format!("slow-{run}-{task}-{n}"));
                n += 1;
                let started = Instant::now();
                let charged = bench.charge(&request).await;
                calls.push((request, charged, started.elapsed()));
                tokio::time::sleep(RETRY_EVERY).await;
            }
            calls
        }));
    }
    let mut calls = Vec::new();
    for client in clients {
        calls.extend(client.await.expect("a client"));
    }
    bench.proxy.set(Fault::PassThrough);
    let fast_again = Instant::now();
    let slowest = calls
        .iter()
        .map(|(_, _, took)| *took)
        .max()
        .unwrap_or_default();
    eprintln!(
        "while slow: {} calls {:?}, slowest {slowest:?}",
        calls.len(),
        tally(calls.iter().map(|(_, charged, _)| charged))
    );
    for (_, charged, took) in &calls {
        assert!(
            unavailable(charged) || answered(charged),
            "a slow call is a 503 (or, if it squeezed through, answered): {charged:?}"
        );
        assert!(
            *took <= CALL_DEADLINE + RETRY_EVERY,
            "answered within the deadline, took {took:?}"
        );
    }

    // Fast again: fresh keys and the keys tried while slow are answered, each charged once.
    let mut probes = 0;
    let recovered = loop {
        probes += 1;
        let probe = bench.request(&format!("probe-{run}-{probes}"));
        let charged = bench.charge(&probe).await;
        if answered(&charged) {
            break fast_again.elapsed();
        }
        eprintln!(
            "probe {probes} after {:?}: {}",
            fast_again.elapsed(),
            kind(&charged)
        );
        assert!(
            fast_again.elapsed() < Duration::from_secs(15),
            "the store never recovered: {charged:?}"
        );
        tokio::time::sleep(RETRY_EVERY).await;
    };
    eprintln!("recovered {recovered:?} after the network was fast again ({probes} probes)");
    assert!(
        recovered <= 2 * STORE_TIMEOUT,
        "recovered within two store timeouts, took {recovered:?}"
    );
    for (request, _, _) in &calls {
        let attempts = bench
            .charge_until_answered(request, RETRY_EVERY, Duration::from_secs(8))
            .await;
        let (last, _) = attempts.last().expect("an attempt");
        assert!(answered(last), "a key tried while slow, retried: {last:?}");
    }
    let charges = bench.charges_by_intent().await;
    let twice: Vec<_> = charges.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "charged more than once: {twice:?}");
}
