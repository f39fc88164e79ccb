//! The store follows its database's failover (C13, C4, C6): a primary with a synchronous
//! standby of the test's own, the store given both hosts with `target_session_attrs=read-write`.
//! Under load (32 clients, fresh keys and retries of the same keys, each charge written in the
//! transaction of its completion) the primary is killed and the standby promoted. Every call is
//! answered within its budget, nothing is charged twice, no completion is lost, and the store
//! charges again on the new primary by itself soon after the promotion.

mod common;
mod support;

use common::{pg_url, request};
use idem_core::{Answer, FencingToken, Idempotency, Outcome, Policy};
use idem_postgres::sqlx::{self, AssertSqlSafe, Connection, PgConnection, Row};
use idem_postgres::PgStore;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::bench::{answered, charge_reporting_port, tally, Charged};
use support::pg_pair::{PgPair, PrimaryFault};

/// The engine's deadline for one store call.
const STORE_TIMEOUT: Duration = Duration::from_secs(2);
/// The store's own deadlines, below it.
const STATEMENT_TIMEOUT: Duration = Duration::from_millis(1500);
const LOCK_TIMEOUT: Duration = Duration::from_millis(1000);
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(4);
/// Short enough for a key cut off mid-execution to be retried within the test.
const LEASE: Duration = Duration::from_secs(5);
/// One call's budget: the effect is bounded by the transaction timeout, the steps around it by
/// the store timeout (the slowest paths take three of them besides the effect).
const CALL_BUDGET: Duration = Duration::from_secs(4 + 3 * 2);
/// What a loaded machine may add to a call's budget.
const MARGIN: Duration = Duration::from_secs(2);
const TASKS: usize = 32;
const CONNECTIONS: u32 = 8;
const RETRY_EVERY: Duration = Duration::from_millis(50);

/// A store on `url` and an engine over it (with a replay cache if `cache`), on a table of its
/// own; the charges table beside it.
async fn engine(url: &str, cache: bool) -> (Idempotency<PgStore>, String) {
    let store = PgStore::builder()
        .table(&format!("f_{}", FencingToken::generate()))
        .max_connections(CONNECTIONS)
        .acquire_timeout(STORE_TIMEOUT)
        .statement_timeout(STATEMENT_TIMEOUT)
        .lock_timeout(LOCK_TIMEOUT)
        .transaction_timeout(TRANSACTION_TIMEOUT)
        .idle_in_transaction_timeout(TRANSACTION_TIMEOUT)
        .connect(url)
        .await
        .expect("connect to the pair");
    store.migrate().await.expect("migrate");
    let charges = format!("charges_{}", FencingToken::generate());
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {charges} (id bigserial PRIMARY KEY, intent text NOT NULL)"
    )))
    .execute(store.pool())
    .await
    .expect("the charges table");
    let policy = Policy::default().store_timeout(STORE_TIMEOUT).lease(LEASE);
    let mut engine = Idempotency::builder(store).policy(policy);
    if cache {
        engine = engine.replay_cache(idem_core::ReplayCache::new(100_000, 64 << 20));
    }
    (engine.build().expect("policy"), charges)
}

/// The key of an answer that says the charge happened.
fn charged_key(charged: &Charged) -> bool {
    matches!(
        charged,
        Ok(Outcome::Executed(_)) | Ok(Outcome::Answered(Answer::Replay(_)))
    )
}

/// C13: the primary dies under load, the standby is promoted; the store follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c13_the_store_follows_a_promotion_under_load_without_losing_or_doubling_a_charge() {
    let pair = PgPair::start().await;
    promote_under_load(&pair, PrimaryFault::Killed, false)
        .await
        .assert_nothing_lost_or_doubled();
}

/// C13, C4, C6: as above, but the primary goes silent (SIGSTOP on every process of it: its
/// sockets stay open, nothing answers) instead of dying, and the standby is promoted while it
/// is frozen. Every call is answered within its budget, nothing is charged twice, no
/// completion is lost, and the store charges again on the new primary by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c13_the_store_leaves_a_frozen_primary_for_the_promoted_standby_under_load() {
    let pair = PgPair::start().await;
    promote_under_load(&pair, PrimaryFault::Frozen, false)
        .await
        .assert_nothing_lost_or_doubled();
}

/// C7: with asynchronous replication and a replay cache, the promotion may lose the last
/// commits (docs/stores.md), but every answer given after the promotion is what the new
/// primary holds, and nothing is charged twice on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c07_answers_after_an_asynchronous_promotion_are_the_new_primary_s() {
    let pair = PgPair::start_async().await;
    let seen = promote_under_load(&pair, PrimaryFault::Killed, true).await;
    let twice = seen.twice();
    assert!(
        twice.is_empty(),
        "charged more than once on the new primary: {twice:?}"
    );
    let mut stale = Vec::new();
    for (key, answer, _, started) in &seen.calls {
        if *started < seen.promoted {
            continue;
        }
        let body = match answer {
            Ok(Outcome::Executed(r)) | Ok(Outcome::Answered(Answer::Replay(r))) => {
                String::from_utf8_lossy(&r.body).into_owned()
            }
            _ => continue,
        };
        let held = seen.ids.get(key).cloned().unwrap_or_default();
        if !held.iter().any(|id| body.starts_with(&format!("{id} ")))
            || !body.ends_with(&pair.standby_port.to_string())
        {
            stale.push((
                key.clone(),
                body,
                held,
                started.duration_since(seen.promoted),
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "answers after the promotion that the new primary does not hold: {:?}",
        &stale[..stale.len().min(10)]
    );
}

/// One client call: its key, its answer, how long it took, when it started.
type Call = (String, Charged, Duration, Instant);

/// What clients saw through a promotion, and what the new primary holds.
struct Promoted {
    calls: Vec<Call>,
    /// Charges per intent (key), and their ids, on the new primary.
    per_intent: HashMap<String, i64>,
    ids: HashMap<String, Vec<i64>>,
    /// Keys completed and not in doubt on the new primary.
    completed: HashSet<String>,
    promoted: Instant,
    /// From the promotion to the first charge of a probe.
    recovered: Duration,
}

impl Promoted {
    fn twice(&self) -> Vec<(&String, &i64)> {
        self.per_intent.iter().filter(|(_, n)| **n > 1).collect()
    }

    /// No charge twice, none lost or without its record, every call within its budget, and
    /// charging again within two budgets of the promotion.
    fn assert_nothing_lost_or_doubled(&self) {
        let twice = self.twice();
        let charged: HashSet<String> = self.per_intent.keys().cloned().collect();
        let without_record: Vec<_> = charged.difference(&self.completed).collect();
        let without_charge: Vec<_> = self.completed.difference(&charged).collect();
        let told_but_lost: Vec<_> = self
            .calls
            .iter()
            .filter(|(key, answer, _, _)| charged_key(answer) && !charged.contains(key))
            .map(|(key, _, _, _)| key)
            .collect();
        let slowest = self
            .calls
            .iter()
            .map(|(_, _, took, _)| *took)
            .max()
            .unwrap_or_default();
        let recovered = self.recovered;
        assert!(twice.is_empty(), "charged more than once: {twice:?}");
        assert!(
            without_record.is_empty() && without_charge.is_empty(),
            "lost completions: charges without their record {without_record:?}, records without \
             their charge {without_charge:?}"
        );
        assert!(
            told_but_lost.is_empty(),
            "charges answered to a client and lost in the failover: {told_but_lost:?}"
        );
        assert!(
            slowest <= CALL_BUDGET + MARGIN,
            "every call answered within its budget, the slowest took {slowest:?}"
        );
        assert!(
            recovered <= 2 * STORE_TIMEOUT,
            "charging again within two budgets of the promotion, took {recovered:?}"
        );
    }
}

/// Clients charging fresh keys under load (an engine with a replay cache if `cache`) while the
/// primary of `pair` fails by `fault` and its standby is promoted; then what the new primary
/// holds, read straight.
async fn promote_under_load(pair: &PgPair, fault: PrimaryFault, cache: bool) -> Promoted {
    // One load at a time: two on two cores would stretch each other's calls past their bounds.
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _one = ONE_AT_A_TIME.lock().await;
    let url = PgPair::hosts_url(pair.primary_port, pair.standby_port);
    let (idem, charges) = engine(&url, cache).await;
    let idem = Arc::new(idem);
    let charges = Arc::new(charges);
    let run = FencingToken::generate();
    let stop = Arc::new(AtomicBool::new(false));

    // Clients charge fresh keys one after another, retrying each until it is answered, then
    // send it once more (a client's retry of an answered request: a replay).
    let mut clients = Vec::new();
    for task in 0..TASKS {
        let (idem, charges, stop) = (Arc::clone(&idem), Arc::clone(&charges), Arc::clone(&stop));
        clients.push(tokio::spawn(async move {
            let mut calls: Vec<Call> = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("fo-{run}-{task}-{n}");
                n += 1;
                let until = Instant::now() + Duration::from_secs(30);
                loop {
                    let started = Instant::now();
                    let charged = charge_reporting_port(&idem, &charges, &key).await;
                    let done = answered(&charged);
                    calls.push((key.clone(), charged, started.elapsed(), started));
                    if done || Instant::now() >= until {
                        break;
                    }
                    tokio::time::sleep(RETRY_EVERY).await;
                }
                let started = Instant::now();
                let again = charge_reporting_port(&idem, &charges, &key).await;
                calls.push((key.clone(), again, started.elapsed(), started));
            }
            calls
        }));
    }

    tokio::time::sleep(Duration::from_millis(1500)).await;
    let frozen = pair.fail_primary(fault).await;
    let failed = Instant::now();
    // What a failover manager takes to notice.
    tokio::time::sleep(Duration::from_millis(500)).await;
    pair.promote_standby().await;
    let promoted = Instant::now();

    // A probe on keys of its own: how long after the promotion the store charges again.
    let mut probes = 0;
    let recovered = loop {
        probes += 1;
        let charged =
            charge_reporting_port(&idem, &charges, &format!("probe-{run}-{probes}")).await;
        if answered(&charged) {
            break promoted.elapsed();
        }
        assert!(
            promoted.elapsed() < Duration::from_secs(30),
            "the store never followed the promotion: {charged:?}"
        );
        tokio::time::sleep(RETRY_EVERY).await;
    };
    // Calls cut off on a frozen primary end at their budgets, later than a killed one's.
    let settle = match fault {
        PrimaryFault::Killed => Duration::from_secs(1),
        PrimaryFault::Frozen => Duration::from_secs(3),
    };
    tokio::time::sleep(settle).await;
    stop.store(true, Ordering::Relaxed);
    let mut calls = Vec::new();
    for client in clients {
        calls.extend(client.await.expect("a client"));
    }

    // Read on the new primary, straight.
    let mut conn = PgConnection::connect(&PgPair::url(pair.standby_port))
        .await
        .expect("connect to the new primary");
    let ids: HashMap<String, Vec<i64>> = sqlx::raw_sql(AssertSqlSafe(format!(
        "SELECT intent, array_agg(id) FROM {charges} GROUP BY intent"
    )))
    .fetch_all(&mut conn)
    .await
    .expect("charges")
    .iter()
    .map(|row| (row.get::<String, _>(0), row.get::<Vec<i64>, _>(1)))
    .collect();
    let per_intent = ids
        .iter()
        .map(|(key, ids)| (key.clone(), i64::try_from(ids.len()).unwrap_or(i64::MAX)))
        .collect();
    let table = idem.store().table();
    let completed: HashSet<String> = sqlx::raw_sql(AssertSqlSafe(format!(
        "SELECT key FROM {table} WHERE state = 1 AND doubt IS NULL"
    )))
    .fetch_all(&mut conn)
    .await
    .expect("records")
    .iter()
    .map(|row| row.get::<String, _>(0))
    .collect();
    conn.close().await.expect("close");
    drop(frozen);
    eprintln!(
        "failover: {} calls on {} keys, recovered {recovered:?} after the promotion ({:?} after \
         the failure, {probes} probes); answers {:?}",
        calls.len(),
        ids.len(),
        failed.elapsed().saturating_sub(promoted.elapsed()) + recovered,
        tally(calls.iter().map(|(_, answer, _, _)| answer))
    );
    Promoted {
        calls,
        per_intent,
        ids,
        completed,
        promoted,
        recovered,
    }
}

/// C13: given the standby first, the store skips it (it accepts no writes) and stays on the
/// primary; a store given only the standby with writes asked for does not connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_read_only_host_is_skipped() {
    let pair = PgPair::start().await;
    let url = PgPair::hosts_url(pair.standby_port, pair.primary_port);
    let (idem, charges) = engine(&url, false).await;
    let charged = charge_reporting_port(&idem, &charges, "on-the-primary").await;
    let Ok(Outcome::Executed(response)) = charged else {
        panic!("charged on the primary: {charged:?}");
    };
    let body = String::from_utf8_lossy(&response.body).into_owned();
    assert!(
        body.ends_with(&format!(" {}", pair.primary_port)),
        "the effect ran on the primary: {body}"
    );
    let (port,): (String,) = sqlx::query_as("SELECT current_setting('port')")
        .fetch_one(idem.store().pool())
        .await
        .expect("the pool");
    assert_eq!(port, pair.primary_port.to_string(), "the pool too");

    let standby_only = format!(
        "{}?target_session_attrs=read-write",
        PgPair::url(pair.standby_port)
    );
    let refused = PgStore::builder()
        .acquire_timeout(STORE_TIMEOUT)
        .connect(&standby_only)
        .await;
    assert!(refused.is_err(), "a read-only server only: refused");
    // What the effect's `BEGIN ..., READ WRITE` meets on a server in recovery: a refusal the
    // store takes for a connection on the wrong server.
    let mut standby = PgConnection::connect(&PgPair::url(pair.standby_port))
        .await
        .expect("connect to the standby");
    let begin = sqlx::raw_sql("BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE")
        .execute(&mut standby)
        .await
        .expect_err("no read-write transaction in recovery");
    let code = begin.as_database_error().and_then(|db| db.code());
    assert_eq!(code.as_deref(), Some("0A000"), "{begin}");
    let any = format!(
        "{}?target_session_attrs=any",
        PgPair::url(pair.standby_port)
    );
    assert!(
        PgStore::connect(&any).await.is_ok(),
        "any server, when any is asked for"
    );
}

/// C13: the primary stops taking writes while it stays up (its sessions answer 25006, as a
/// demoted server's would) and the standby is promoted: the calls in between are store errors
/// (a 503, never a configuration error), and the store leaves the connections it had on the
/// old server for the new primary by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_server_that_stops_taking_writes_is_left_for_the_promoted_standby() {
    let pair = PgPair::start().await;
    let url = PgPair::hosts_url(pair.primary_port, pair.standby_port);
    let (idem, charges) = engine(&url, false).await;
    let idem = Arc::new(idem);
    // Several connections of each kind on the primary, given back to the store.
    let mut before = Vec::new();
    for n in 0..CONNECTIONS {
        let (idem, charges) = (Arc::clone(&idem), charges.clone());
        before.push(tokio::spawn(async move {
            charge_reporting_port(&idem, &charges, &format!("before-{n}")).await
        }));
    }
    for charged in before {
        let charged = charged.await.expect("a charge");
        assert!(answered(&charged), "charged on the primary: {charged:?}");
    }

    let mut conn = PgConnection::connect(&PgPair::url(pair.primary_port))
        .await
        .expect("connect to the primary");
    for statement in [
        "ALTER SYSTEM SET default_transaction_read_only = on",
        "SELECT pg_reload_conf()",
    ] {
        sqlx::raw_sql(statement)
            .execute(&mut conn)
            .await
            .expect(statement);
    }
    conn.close().await.expect("close");
    tokio::time::sleep(Duration::from_millis(300)).await;
    pair.promote_standby().await;
    let promoted = Instant::now();

    let mut attempts = 0;
    let body = loop {
        attempts += 1;
        let started = Instant::now();
        let charged = charge_reporting_port(&idem, &charges, &format!("after-{attempts}")).await;
        assert!(
            started.elapsed() <= CALL_BUDGET + MARGIN,
            "answered within its budget: {:?}",
            started.elapsed()
        );
        match charged {
            Ok(Outcome::Executed(response)) => {
                break String::from_utf8_lossy(&response.body).into_owned()
            }
            other => assert!(
                support::bench::unavailable(&other),
                "a store that cannot write yet is unavailable, not misconfigured: {other:?}"
            ),
        }
        assert!(
            promoted.elapsed() < 2 * STORE_TIMEOUT,
            "the store never left the read-only server ({attempts} attempts)"
        );
        tokio::time::sleep(RETRY_EVERY).await;
    };
    eprintln!(
        "left the read-only server {:?} after the promotion ({attempts} attempts)",
        promoted.elapsed()
    );
    assert!(
        body.ends_with(&format!(" {}", pair.standby_port)),
        "the effect ran on the new primary: {body}"
    );
}

/// C13, C17: the pool the store built (your transactions, the outbox's and the inbox's
/// statements) follows a promotion on its own, with no call of the store to find the new
/// primary: asked for while its host refuses every connect, it has the store search its hosts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_the_store_s_pool_alone_follows_a_promotion() {
    let pair = PgPair::start().await;
    let url = PgPair::hosts_url(pair.primary_port, pair.standby_port);
    let (idem, _charges) = engine(&url, false).await;
    let store = idem.store();
    let port = |pool| async move {
        sqlx::query_as::<_, (String,)>("SELECT current_setting('port')")
            .fetch_one(pool)
            .await
            .map(|(port,)| port)
    };
    assert_eq!(
        port(store.pool()).await.expect("the pool on the primary"),
        pair.primary_port.to_string()
    );
    pair.kill_primary().await;
    pair.promote_standby().await;
    let promoted = Instant::now();
    let mut attempts = 0;
    let on = loop {
        attempts += 1;
        let started = Instant::now();
        let answer = port(store.pool()).await;
        assert!(
            started.elapsed() <= STORE_TIMEOUT + MARGIN,
            "the pool answers within its acquire timeout: {:?}",
            started.elapsed()
        );
        if let Ok(on) = answer {
            break on;
        }
        assert!(
            promoted.elapsed() < 2 * STORE_TIMEOUT,
            "the pool never followed the promotion ({attempts} attempts): {answer:?}"
        );
        tokio::time::sleep(RETRY_EVERY).await;
    };
    eprintln!(
        "the pool followed {:?} after the promotion ({attempts} attempts)",
        promoted.elapsed()
    );
    assert_eq!(on, pair.standby_port.to_string(), "on the new primary");
}

/// Two fault proxies in front of the tests' server, standing for two hosts, and the URL that
/// names both.
async fn two_hosts() -> (fault_proxy::FaultProxy, fault_proxy::FaultProxy, String) {
    let server = pg_url();
    let (first, _) = support::proxied(&server).await;
    let (second, _) = support::proxied(&server).await;
    let hosts = format!("{},{}", first.addr(), second.addr());
    let url = support::pg_url::with_authority(&server, &hosts);
    (first, second, url)
}

/// An engine over a store on `url` (a table of its own, four connections, `acquire`), its
/// calls within `budget`.
async fn engine_over(url: &str, acquire: Duration, budget: Duration) -> Idempotency<PgStore> {
    let store = PgStore::builder()
        .table(&format!("s_{}", FencingToken::generate()))
        .max_connections(4)
        .acquire_timeout(acquire)
        .connect(url)
        .await
        .expect("connect through the first host");
    store.migrate().await.expect("migrate");
    Idempotency::with_policy(store, Policy::default().store_timeout(budget)).expect("policy")
}

/// C13: a new connection whose set-up goes unanswered (the host took the connection, then its
/// link went silent) moves the store to the next host, as a statement cut off does: the
/// calls after it are served there, not by the host that left it hanging. Two fault proxies
/// in front of the tests' server stand for two hosts; the first holds the first set-up it
/// sees, the rest of its traffic flowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_set_up_cut_off_moves_the_store_to_the_next_host() {
    use fault_proxy::{Fault, Hold};
    let (first, second, url) = two_hosts().await;
    let idem = engine_over(&url, Duration::from_millis(800), STORE_TIMEOUT).await;
    assert_eq!(second.connections(), 0, "the first host serves");

    // The store's set-up of a session (prepared statements: its deadlines and isolation level).
    first.set(Hold::to(&b"SET SESSION CHARACTERISTICS"[..]));
    let mut burst = 0;
    while matches!(first.fault(), Fault::Hold(_)) {
        burst += 1;
        assert!(burst <= 50, "no new connection was opened in 50 bursts");
        // Calls at once: some find the stack empty and open a connection.
        let calls: Vec<_> = (0..4)
            .map(|n| {
                let idem = idem.clone();
                tokio::spawn(async move {
                    let request = request(&idem, &format!("burst-{burst}-{n}"));
                    idem.begin(&request).await.map(|_| ())
                })
            })
            .collect();
        for call in calls {
            let _ = call.await.expect("the call's task");
        }
    }
    assert!(
        matches!(first.fault(), Fault::Holding(_)),
        "{:?}",
        first.fault()
    );

    idem.begin(&request(&idem, "after-the-hold"))
        .await
        .map(|_| ())
        .expect("served by the next host");
    assert!(
        second.connections() > 0,
        "the store moved to the second host after the first left a set-up unanswered"
    );
}

/// C13: a host is suspect only for time it used itself. The first host is silent, the second
/// slow (a new connection there takes most of the acquire timeout, within it on its own, not
/// after the first host's share); each new connection spends the first host's share before
/// the second takes it. Its set-up then has the second host's own share, a call's budget
/// (1.8 acquire timeouts) that runs out on it leaves it current, and the calls are served
/// there, instead of the store pointing back at the silent host after every attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_slow_host_is_not_blamed_for_the_time_a_silent_one_took() {
    use fault_proxy::Fault;
    let (first, second, url) = two_hosts().await;
    let second_url = support::pg_url::with_authority(&pg_url(), &second.addr().to_string());
    let delay = Duration::from_millis(100);

    // How long a new connection (connect, set-up, a first statement) takes on the second host.
    second.set(Fault::Delay(delay));
    let started = Instant::now();
    let alone = PgStore::builder()
        .table(&format!("s_{}", FencingToken::generate()))
        .connect(&second_url)
        .await
        .expect("the second host alone");
    let on_the_second = started.elapsed();
    drop(alone);
    second.set(Fault::PassThrough);

    let acquire = on_the_second * 11 / 5;
    let idem = engine_over(&url, acquire, acquire * 9 / 5).await;
    let request = |key: &str| request(&idem, key);

    first.set(Fault::Freeze);
    second.set(Fault::Delay(delay));
    // A short budget cuts a statement off on the silent first host: a new connection there
    // is not answered within its share either, and the store moves on.
    let short = request("short-1").with_store_budget(Duration::from_millis(300));
    let _ = idem.begin(&short).await.map(|_| ());
    until_served(&idem, "on-the-second", acquire * 4).await;
    // A budget shorter than a round trip to the second host cuts a statement off there: a new
    // connection there is answered, and the store stays.
    let shorter = request("short-2").with_store_budget(Duration::from_millis(50));
    assert!(
        idem.begin(&shorter).await.is_err(),
        "cut off on the slow host"
    );

    let mut answers = Vec::new();
    for n in 0..6 {
        let started = Instant::now();
        let begun = idem.begin(&request(&format!("after-{n}"))).await;
        answers.push((begun.map(|_| ()), started.elapsed()));
    }
    let served = answers.iter().filter(|(begun, _)| begun.is_ok()).count();
    assert!(
        served >= 4,
        "served {served} of 6 on the slow host: {answers:#?}"
    );
}

/// Calls `idem` (keys `<prefix>-<n>`, 20 ms apart) until one is served, within `within` from
/// now; each call's outcome and when it ended.
async fn until_served(
    idem: &Idempotency<PgStore>,
    prefix: &str,
    within: Duration,
) -> Vec<(Result<(), idem_core::Error>, Duration)> {
    let started = Instant::now();
    let mut answers = Vec::new();
    loop {
        let key = format!("{prefix}-{}", answers.len());
        let begun = idem.begin(&request(idem, &key)).await;
        let served = begun.is_ok();
        answers.push((begun.map(|_| ()), started.elapsed()));
        if served {
            return answers;
        }
        assert!(started.elapsed() < within, "never served: {answers:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// C13: a store budget shorter than a host's share of the acquire timeout still leaves a
/// silent host. The current host is silent, the store holds no connection to it, and each
/// call's budget ends while the call connects there, before the next host could be tried: the
/// connection goes on being opened, on the next host, and the calls after that are served
/// there, instead of every call starting over on the silent one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_budget_shorter_than_a_host_s_share_still_leaves_a_silent_host() {
    use fault_proxy::Fault;
    let (first, second, url) = two_hosts().await;
    let acquire = Duration::from_secs(2);
    let idem = engine_over(&url, acquire, Duration::from_millis(300)).await;
    let request = |key: &str| request(&idem, key);

    // To the second host and back to the first, in a new epoch: the store's connections are
    // all on the second, and none is reused on the first.
    first.set(Fault::Freeze);
    let _ = idem.begin(&request("cut-off-on-the-first")).await;
    first.set(Fault::PassThrough);
    let on_the_second = request("on-the-second").with_store_budget(Duration::from_secs(5));
    idem.begin(&on_the_second)
        .await
        .map(|_| ())
        .expect("served by the second host");
    second.set(Fault::Freeze);
    let _ = idem.begin(&request("cut-off-on-the-second")).await;
    let before = first.connections();

    // The first host goes silent; each call's 300 ms end within its 1 s share.
    first.set(Fault::Freeze);
    second.set(Fault::PassThrough);
    let answers = until_served(&idem, "after", acquire * 3).await;
    assert!(
        first.connections() > before,
        "the calls did connect to the silent first host: {answers:#?}"
    );
    eprintln!("served by the second host after {answers:?}");
}

/// C13: a host that was silent is served again as soon as it answers. During the silence
/// every call's budget ends while it opens a connection; those calls give their permits back
/// when they are cut off, so that once the host answers again, no call waits for a handshake
/// that will never end (an acquire timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_host_silent_for_a_while_is_served_again_at_once() {
    use fault_proxy::Fault;
    let (proxy, _) = support::proxied(&pg_url()).await;
    let url = support::pg_url::with_authority(&pg_url(), &proxy.addr().to_string());
    let acquire = Duration::from_secs(4);
    let idem = engine_over(&url, acquire, Duration::from_millis(300)).await;
    idem.begin(&request(&idem, "before"))
        .await
        .map(|_| ())
        .expect("served before the silence");

    // Silent: the links open now hear nothing more; new ones are accepted and hear nothing.
    proxy.set(Fault::ServerGone);
    let silence = Instant::now() + Duration::from_millis(1500);
    let callers: Vec<_> = (0..8)
        .map(|caller| {
            let idem = idem.clone();
            tokio::spawn(async move {
                let mut n = 0;
                while Instant::now() < silence {
                    let key = format!("silent-{caller}-{n}");
                    let _ = idem.begin(&request(&idem, &key)).await;
                    n += 1;
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.expect("a caller");
    }

    proxy.set(Fault::PassThrough);
    let answers = until_served(&idem, "back", acquire * 2).await;
    let served_after = answers.last().map(|(_, at)| *at).unwrap_or_default();
    assert!(
        served_after < acquire / 3,
        "served {served_after:?} after the host answered again: {answers:#?}"
    );
}

/// C13: a server gone silent behind a pooler is left all the same. The pooler (PgBouncer,
/// `target_session_attrs=any`) logs a client in from its cache without the server, so the
/// check of a host whose statement was cut off makes a round trip on its new connection, not
/// only the connection: the store moves to the second host and is served there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_silent_server_behind_a_pooler_is_left() {
    use fault_proxy::Fault;
    use idem_postgres::StatementMode;
    let server = pg_url();
    let (first, through) = support::proxied(&server).await;
    let bouncer = support::private_bouncer::PrivateBouncer::start(&through, "postgres", 8).await;
    let (second, _) = support::proxied(&server).await;
    let hosts = format!(
        "{},{}",
        support::pg_url::authority(bouncer.url()),
        second.addr()
    );
    let url = format!(
        "{}?target_session_attrs=any",
        support::pg_url::with_authority(bouncer.url(), &hosts)
    );
    let store = PgStore::builder()
        .table(&format!("s_{}", FencingToken::generate()))
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(1))
        .statements(StatementMode::Simple)
        .listener_url(&server)
        .connect(&url)
        .await
        .expect("connect through the pooler");
    store.migrate().await.expect("migrate");
    let budget = Duration::from_millis(300);
    let idem =
        Idempotency::with_policy(store, Policy::default().store_timeout(budget)).expect("policy");
    until_served(&idem, "before", Duration::from_secs(5)).await;
    assert_eq!(second.connections(), 0, "served behind the pooler first");

    first.set(Fault::Freeze);
    until_served(&idem, "behind-a-silent-pooler", Duration::from_secs(8)).await;
    assert!(second.connections() > 0, "served by the second host");
}
