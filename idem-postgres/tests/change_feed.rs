//! The change feed (C5, C13): a duplicate that waits for its original in another process (two
//! stores, two pools, two engines: nothing shared in memory) is woken by the original's
//! announcement (`pg_notify`) through the waiter's listener, within a few milliseconds of the
//! completion, far below the one-second polling fallback of a waiter whose store has a feed;
//! behind PgBouncer in transaction mode too (the announcement through the pooler, the listener
//! connected directly); and again after the listener's connection was terminated by the
//! server or vanished silently (its server side gone, the client hearing nothing), once the
//! feed noticed and connected again.
//!
//! Each round completes the original 1.35 s after the duplicate started waiting, away from
//! every poll of the engine's waiters: one whose store has a feed polls every second (its next
//! read would come 650 ms after the completion), one whose store has none polls at 20 ms
//! doubling up to 500 ms (its next read, at about 1.62 s, would come 270 ms after it). Both are
//! past the bound of every round, 150 ms: only a wake-up by the feed is that quick.

mod common;
mod support;

use common::{bouncer_url, pg_url, SCHEMA};
use idem_core::{
    Answer, Failure, FencingToken, Idempotency, InFlightAnswer, Outcome, Policy, Request,
    StoredResponse,
};
use idem_postgres::sqlx::{self, AssertSqlSafe};
use idem_postgres::{PgStore, PgStoreBuilder, StatementMode};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::fault_proxy::Fault;
use tokio::sync::oneshot;

/// How long after the original's completion the waiter must have its replay.
const PROMPT: Duration = Duration::from_millis(150);

/// How long the waiter waits before the original completes: away from the polls of either kind
/// of waiter (see the top of this file).
const BEFORE_COMPLETING: Duration = Duration::from_millis(1350);

fn policy() -> Policy {
    Policy::default().in_flight(InFlightAnswer::Wait(Duration::from_secs(5)))
}

fn engine(store: PgStore) -> Idempotency<PgStore> {
    Idempotency::with_policy(store, policy()).expect("a valid policy")
}

/// A new table's name in [`SCHEMA`].
fn new_table() -> String {
    format!("t_{}", FencingToken::generate())
}

/// A store on `table` (migrated) with `builder`'s settings, on `url`.
async fn store(builder: PgStoreBuilder, table: &str, url: &str) -> PgStore {
    let store = builder
        .schema(SCHEMA)
        .table(table)
        .max_connections(4)
        .connect(url)
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    store
}

/// `url` with `application_name` set to `name`.
fn named(url: &str, name: &str) -> String {
    let glue = if url.contains('?') { '&' } else { '?' };
    format!("{url}{glue}application_name={name}")
}

/// A name for a listener's session that no other test uses.
fn listener_name() -> String {
    format!("feed_{}", &FencingToken::generate().to_string()[..12])
}

fn charge(body: &str) -> StoredResponse {
    StoredResponse::new(201, body.to_owned())
}

fn request(idem: &Idempotency<PgStore>, key: &str) -> Request {
    idem.request("acct_feed", "POST", "/charges")
        .key(Some(key))
        .body(b"{\"cents\":100}")
        .build()
        .expect("a request")
}

/// One round: `original` runs a request whose handler waits; `waiter` sends a duplicate, which
/// waits; the original completes. Returns how long after the completion the duplicate had its
/// replay (its handler never run).
async fn round(waiter: &Idempotency<PgStore>, original: &Idempotency<PgStore>) -> Duration {
    let key = format!("k_{}", FencingToken::generate());
    let req = request(original, &key);
    let runs = Arc::new(AtomicUsize::new(0));
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let first = {
        let (idem, req, runs) = (original.clone(), req.clone(), Arc::clone(&runs));
        tokio::spawn(async move {
            let outcome = idem
                .run(&req, move |_ctx| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let _ = started_tx.send(());
                    let _ = finish_rx.await;
                    Ok::<_, Failure<std::io::Error>>(charge("ch_1"))
                })
                .await;
            (outcome, Instant::now())
        })
    };
    started_rx.await.expect("the original started");
    let second = {
        let (idem, req, runs) = (waiter.clone(), req.clone(), Arc::clone(&runs));
        tokio::spawn(async move {
            let outcome = idem
                .run(&req, move |_ctx| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Failure<std::io::Error>>(charge("the duplicate ran"))
                })
                .await;
            (outcome, Instant::now())
        })
    };
    tokio::time::sleep(BEFORE_COMPLETING).await;
    assert!(!second.is_finished(), "the duplicate did not wait");
    finish_tx.send(()).expect("the original waits to finish");
    let (outcome, ended) = first.await.expect("the original ran");
    assert!(
        matches!(outcome, Ok(Outcome::Executed(_))),
        "the original: {outcome:?}"
    );
    let (outcome, answered) = second.await.expect("the duplicate ran");
    assert_eq!(
        outcome.expect("the duplicate is answered"),
        Outcome::Answered(Answer::Replay(charge("ch_1")))
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one execution");
    answered.saturating_duration_since(ended)
}

/// Runs `rounds` rounds and asserts each was prompt.
async fn prompt_rounds(
    waiter: &Idempotency<PgStore>,
    original: &Idempotency<PgStore>,
    rounds: usize,
    case: &str,
) {
    for i in 0..rounds {
        let after = round(waiter, original).await;
        eprintln!("{case}, round {i}: answered {after:?} after the completion");
        assert!(
            after < PROMPT,
            "{case}, round {i}: the waiter was answered {after:?} after the completion"
        );
    }
}

/// How many sessions named `name` the server has.
async fn sessions(store: &PgStore, name: &str) -> i64 {
    let query = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{}'",
        name.replace('\'', "''")
    );
    let row = sqlx::raw_sql(AssertSqlSafe(query))
        .fetch_one(store.pool())
        .await
        .expect("pg_stat_activity");
    sqlx::Row::try_get(&row, 0).expect("a count")
}

/// The backend of the one session named `name`, if there is one.
async fn backend(store: &PgStore, name: &str) -> Option<i32> {
    let query = format!(
        "SELECT pid FROM pg_stat_activity WHERE application_name = '{}'",
        name.replace('\'', "''")
    );
    let rows = sqlx::raw_sql(AssertSqlSafe(query))
        .fetch_all(store.pool())
        .await
        .expect("pg_stat_activity");
    assert!(rows.len() <= 1, "{} sessions named {name}", rows.len());
    rows.first()
        .map(|row| sqlx::Row::try_get(row, 0).expect("a pid"))
}

/// Waits until the server has `count` sessions named `name`, at most `limit`.
async fn until_sessions(store: &PgStore, name: &str, count: i64, limit: Duration) {
    let started = Instant::now();
    loop {
        let now = sessions(store, name).await;
        if now == count {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "{now} sessions named {name} after {limit:?}, not {count}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c05_a_duplicate_waiting_in_another_process_is_woken_by_the_announcement() {
    let table = new_table();
    let url = pg_url();
    let there = engine(store(PgStore::builder(), &table, &url).await);
    let here = engine(store(PgStore::builder(), &table, &url).await);
    prompt_rounds(&here, &there, 3, "direct").await;
    // And the other way round: each process's feed serves its own waiters.
    prompt_rounds(&there, &here, 1, "direct, the other way").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c05_behind_pgbouncer_the_announcement_passes_and_the_listener_connects_directly() {
    let table = new_table();
    let (bouncer, direct) = (bouncer_url(), pg_url());
    let through_bouncer = || {
        PgStore::builder()
            .statements(StatementMode::Simple)
            .listener_url(&direct)
    };
    let there = engine(store(through_bouncer(), &table, &bouncer).await);
    let here = engine(store(through_bouncer(), &table, &bouncer).await);
    prompt_rounds(&here, &there, 3, "behind PgBouncer").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_listener_terminated_by_the_server_is_replaced_and_wakes_waiters_again() {
    let table = new_table();
    let url = pg_url();
    let name = listener_name();
    let there = engine(store(PgStore::builder(), &table, &url).await);
    let here = engine(
        store(
            PgStore::builder().listener_url(&named(&url, &name)),
            &table,
            &url,
        )
        .await,
    );
    prompt_rounds(&here, &there, 1, "before the fault").await;
    until_sessions(here.store(), &name, 1, Duration::from_secs(5)).await;
    let old = backend(here.store(), &name)
        .await
        .expect("the listener's session");
    let query = format!("SELECT pg_terminate_backend({old})");
    sqlx::raw_sql(AssertSqlSafe(query))
        .execute(there.store().pool())
        .await
        .expect("pg_terminate_backend");
    // The feed connects again by itself (a new session under the same name)...
    let started = Instant::now();
    loop {
        match backend(here.store(), &name).await {
            Some(new) if new != old => break,
            _ => {
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "no new listener 5 s after the termination"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    // ...and its waiters are woken by announcements again.
    prompt_rounds(&here, &there, 2, "after the termination").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_listener_whose_server_side_vanished_is_replaced_within_its_ping_deadline() {
    let table = new_table();
    let url = pg_url();
    let name = listener_name();
    let (proxy, through) = support::proxied(&url).await;
    let there = engine(store(PgStore::builder(), &table, &url).await);
    // Only the listener goes through the proxy; the store's statements go straight.
    let feed = PgStore::builder()
        .listener_url(&named(&through, &name))
        .feed_ping(Duration::from_millis(200), Duration::from_millis(300))
        .acquire_timeout(Duration::from_secs(1));
    let here = engine(store(feed, &table, &url).await);
    prompt_rounds(&here, &there, 1, "before the fault").await;
    let connections = proxy.connections();
    // The server's side of the listener's connection closes; the client hears nothing.
    proxy.set(Fault::ServerGone);
    until_sessions(here.store(), &name, 0, Duration::from_secs(5)).await;
    proxy.set(Fault::PassThrough);
    let noticed = Instant::now();
    // Nothing tells the listener: only its ping (every 200 ms, due within 300 ms) does.
    until_sessions(here.store(), &name, 1, Duration::from_secs(5)).await;
    let replaced = noticed.elapsed();
    assert!(
        proxy.connections() > connections,
        "the listener was replaced through the proxy"
    );
    assert!(
        replaced < Duration::from_secs(2),
        "the silent listener was replaced after {replaced:?}"
    );
    eprintln!("the silent listener was replaced after {replaced:?}");
    prompt_rounds(&here, &there, 2, "after the silent loss").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_an_announcement_lost_while_the_listener_was_gone_still_wakes_its_waiter() {
    let table = new_table();
    let url = pg_url();
    let name = listener_name();
    let (proxy, through) = support::proxied(&url).await;
    let there = engine(store(PgStore::builder(), &table, &url).await);
    let feed = PgStore::builder()
        .listener_url(&named(&through, &name))
        .feed_ping(Duration::from_millis(100), Duration::from_millis(150))
        .acquire_timeout(Duration::from_secs(1));
    let here = engine(store(feed, &table, &url).await);
    // The feed runs (it starts with the first wait).
    prompt_rounds(&here, &there, 1, "before the fault").await;

    let req = request(&there, &format!("k_{}", FencingToken::generate()));
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let first = {
        let (idem, req) = (there.clone(), req.clone());
        tokio::spawn(async move {
            idem.run(&req, move |_ctx| async move {
                let _ = started_tx.send(());
                let _ = finish_rx.await;
                Ok::<_, Failure<std::io::Error>>(charge("ch_1"))
            })
            .await
        })
    };
    started_rx.await.expect("the original started");
    let waiting_since = Instant::now();
    let second = {
        let (idem, req) = (here.clone(), req.clone());
        tokio::spawn(async move {
            let outcome = idem
                .run(&req, |_ctx| async {
                    Ok::<_, Failure<std::io::Error>>(charge("the duplicate ran"))
                })
                .await;
            (outcome, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The listener's session ends without the client hearing of it...
    proxy.set(Fault::ServerGone);
    until_sessions(here.store(), &name, 0, Duration::from_secs(2)).await;
    // ...so the announcement of this completion reaches nobody.
    finish_tx.send(()).expect("the original waits to finish");
    let outcome = first.await.expect("the original ran");
    assert!(matches!(outcome, Ok(Outcome::Executed(_))), "{outcome:?}");
    proxy.set(Fault::PassThrough);
    let (outcome, answered) = second.await.expect("the duplicate ran");
    assert_eq!(
        outcome.expect("the duplicate is answered"),
        Outcome::Answered(Answer::Replay(charge("ch_1")))
    );
    // The feed noticed the silence (a ping every 100 ms, due within 150 ms), connected again
    // and woke every waiter: the duplicate read its record long before its first poll (1 s).
    let after = answered.saturating_duration_since(waiting_since);
    eprintln!("answered {after:?} after it began to wait");
    assert!(
        after < Duration::from_millis(850),
        "answered {after:?} after it began to wait: by polling, not by the feed"
    );
}
