//! Records locked by another transaction (C13, C5): an operator's or a job's transaction holds
//! more of the store's rows `FOR UPDATE` than the store has connections, while their holders
//! try to complete and renew. The holders give up within their lock deadline (a 503, nothing
//! committed) instead of waiting as long as the lock is held, so no connection of the store or
//! of the pool waits behind the lock and unrelated keys are answered all along. Once the lock
//! is gone, every key is charged exactly once.

mod common;
mod support;

use common::{pg_url, SCHEMA};
use idem_core::{Answer, Failure, FencingToken, Outcome, Policy, RunError, StoredResponse};
use idem_postgres::sqlx::{self, AssertSqlSafe, Connection, PgConnection};
use idem_postgres::{PgIdempotency, PgStore};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::bench::{answered, kind, tally, unavailable, Bench, Charged};
use tokio::sync::{mpsc, watch};

const STORE_TIMEOUT: Duration = Duration::from_millis(700);
const STATEMENT_TIMEOUT: Duration = Duration::from_millis(500);
const LOCK_TIMEOUT: Duration = Duration::from_millis(300);
const IDLE_IN_TRANSACTION: Duration = Duration::from_millis(250);
/// Renewed every third of it, so renewals meet the lock too.
const LEASE: Duration = Duration::from_millis(1_500);
const CONNECTIONS: u32 = 3;
/// How long the other transaction holds the rows: several store timeouts.
const LOCK_HELD: Duration = Duration::from_secs(8);
const RETRY_EVERY: Duration = Duration::from_millis(100);
/// The longest a call may take: a completion that gives up at its lock deadline, a bounded
/// rollback, a release that gives up at its lock deadline, and a margin.
const CALL_DEADLINE: Duration = Duration::from_millis(1_800);
/// How long a retrying client of an unrelated key keeps trying: a call, and the lease of a
/// reservation that a call cut at its budget may have written all the same (C9, C13).
const UNRELATED_WITHIN: Duration = Duration::from_millis(1_800 + 1_500);

/// C13, C8: holders under `run` (completion on the store's connections, renewals on the
/// heartbeat's) whose rows another transaction locks, more rows than the store has
/// connections: each completion and renewal gives up at its lock deadline (the completion is
/// retried within the lease, then the caller gets a 500 outcome-pending), and unrelated keys are
/// answered all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c13_rows_locked_by_another_transaction_never_starve_unrelated_keys() {
    locked_rows(Holders::Closure, CONNECTIONS as usize + 2).await;
}

/// C13, C6: holders under `run_in_transaction` (the completion in the effect's transaction, on
/// the pool) whose rows another transaction locks, as many as the pool has connections: each
/// completion gives up at its lock deadline and its transaction rolls back (a 503, nothing
/// committed); no pool connection waits behind the lock, so unrelated keys still run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c13_rows_locked_under_effects_transactions_never_starve_the_pool() {
    locked_rows(Holders::Transaction, CONNECTIONS as usize).await;
}

/// How the holders of the locked rows run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holders {
    /// `Idempotency::run`: the completion on the store's own connections.
    Closure,
    /// `run_in_transaction`: the completion inside the effect's transaction.
    Transaction,
}

async fn locked_rows(holders_run: Holders, locked: usize) {
    let builder = PgStore::builder()
        .max_connections(CONNECTIONS)
        .acquire_timeout(STORE_TIMEOUT)
        .statement_timeout(STATEMENT_TIMEOUT)
        .lock_timeout(LOCK_TIMEOUT)
        .idle_in_transaction_timeout(IDLE_IN_TRANSACTION);
    let policy = Policy::default().store_timeout(STORE_TIMEOUT).lease(LEASE);
    let bench = Arc::new(Bench::new(&pg_url(), SCHEMA, builder, policy).await);
    let run = FencingToken::generate();

    // The holders: each charges, says so, and completes once the rows are locked.
    let (ready, mut readies) = mpsc::unbounded_channel();
    let (go, going) = watch::channel(false);
    let mut holders = Vec::new();
    for n in 0..locked {
        let request = bench.request(&format!("locked-{run}-{n}"));
        let (insert, intent) = bench.insert(&request);
        let (bench, ready, mut going) = (Arc::clone(&bench), ready.clone(), going.clone());
        holders.push(tokio::spawn(async move {
            let first: Charged = match holders_run {
                Holders::Transaction => {
                    bench
                        .idem
                        .run_in_transaction(&request, move |tx, _lease| {
                            Box::pin(async move {
                                let (id,): (i64,) = sqlx::query_as(AssertSqlSafe(insert))
                                    .bind(intent)
                                    .fetch_one(&mut *tx)
                                    .await?;
                                let _ = ready.send(());
                                let _ = going.wait_for(|go| *go).await;
                                Ok::<_, sqlx::Error>(StoredResponse::new(
                                    201,
                                    format!("charge {id}"),
                                ))
                            })
                        })
                        .await
                }
                Holders::Closure => {
                    let url = bench.direct_url.clone();
                    bench
                        .idem
                        .run(&request, move |_| async move {
                            let mut conn = PgConnection::connect(&url).await?;
                            let (id,): (i64,) = sqlx::query_as(AssertSqlSafe(insert))
                                .bind(intent)
                                .fetch_one(&mut conn)
                                .await?;
                            let _ = ready.send(());
                            let _ = going.wait_for(|go| *go).await;
                            Ok::<_, Failure<sqlx::Error>>(StoredResponse::new(
                                201,
                                format!("charge {id}"),
                            ))
                        })
                        .await
                }
            };
            (request, first, Instant::now())
        }));
    }
    for _ in 0..locked {
        readies.recv().await.expect("a holder is running");
    }

    // Another transaction locks every holder's row, on a connection straight to the server.
    let mut locker = PgConnection::connect(&pg_url()).await.expect("connect");
    let lock = format!(
        "BEGIN; SELECT 1 FROM {} WHERE key LIKE 'locked-{run}-%' FOR UPDATE",
        bench.records
    );
    let rows = sqlx::raw_sql(AssertSqlSafe(lock))
        .fetch_all(&mut locker)
        .await
        .expect("lock the rows");
    assert_eq!(rows.len(), locked, "every holder's row is locked");
    let locked_at = Instant::now();
    go.send_replace(true);
    // Past a renewal or two, so they meet the lock too.
    tokio::time::sleep(LEASE / 5).await;

    // Unrelated keys, while the rows stay locked: retrying clients, each answered. The holders'
    // completions, retried within their leases on the store's connections, each wait up to the
    // lock deadline: they can fill the connections for a whole budget, and an unrelated call
    // then gets a 503 within its own (C13). A reservation that call sent may still have been
    // written, which nobody holds: the retries are answered in flight until its lease ends
    // (C9). The key then executes while the rows are still locked.
    let mut unrelated = Vec::new();
    let mut n = 0;
    while locked_at.elapsed() + UNRELATED_WITHIN + CALL_DEADLINE < LOCK_HELD {
        let request = bench.request(&format!("free-{run}-{n}"));
        n += 1;
        let attempts = bench
            .charge_until_answered(&request, RETRY_EVERY, UNRELATED_WITHIN)
            .await;
        unrelated.push((request, attempts));
    }
    let released = locked_at.elapsed();
    sqlx::raw_sql("COMMIT")
        .execute(&mut locker)
        .await
        .expect("release the rows");
    let lock_ended = Instant::now();

    let mut firsts = Vec::new();
    for holder in holders {
        firsts.push(holder.await.expect("a holder"));
    }
    for (_, first, finished) in &firsts {
        eprintln!(
            "holder: {} {:?} after the rows were locked",
            kind(first),
            finished.saturating_duration_since(locked_at)
        );
    }
    eprintln!(
        "{holders_run:?}: while {locked} rows were locked ({released:?}): unrelated keys {:?}, slowest {:?}",
        tally(unrelated.iter().flat_map(|(_, attempts)| attempts.iter().map(|(c, _)| c))),
        unrelated
            .iter()
            .flat_map(|(_, attempts)| attempts.iter().map(|(_, took)| *took))
            .max()
            .unwrap_or_default()
    );
    assert!(
        !unrelated.is_empty(),
        "unrelated keys ran while the rows were locked"
    );
    for (request, attempts) in &unrelated {
        let key = request.id().key();
        let (last, _) = attempts.last().expect("an attempt");
        assert!(
            matches!(last, Ok(Outcome::Executed(_))),
            "an unrelated key ({key}) while the rows are locked: {attempts:?}"
        );
        for (i, (charged, took)) in attempts.iter().enumerate() {
            let after_a_503 = attempts[..i].iter().any(|(c, _)| unavailable(c));
            let in_flight = matches!(charged, Ok(Outcome::Answered(Answer::InFlight { .. })));
            assert!(
                unavailable(charged)
                    || matches!(charged, Ok(Outcome::Executed(_)))
                    || (in_flight && after_a_503),
                "an unrelated key ({key}): executed, a 503 to retry, or in flight after a 503 \
                 (its cut reservation): {charged:?}"
            );
            assert!(
                *took <= CALL_DEADLINE,
                "an unrelated key answered within the deadline, took {took:?}"
            );
        }
    }
    for (_, first, finished) in &firsts {
        let took = finished.saturating_duration_since(locked_at);
        match holders_run {
            // Nothing committed: a 503 within one call's deadline.
            Holders::Transaction => {
                assert!(
                    unavailable(first),
                    "a holder whose row is locked: a 503, got {first:?}"
                );
                assert!(
                    took <= CALL_DEADLINE,
                    "a holder gave up within its deadline, not the lock's {LOCK_HELD:?}: \
                     took {took:?}"
                );
            }
            // The effect ran: its completion is retried within the lease, then the caller
            // is told the outcome is pending (and the execution goes on trying).
            Holders::Closure => {
                assert!(
                    matches!(first, Err(RunError::Incomplete(_))) || answered(first),
                    "a holder whose row is locked: outcome pending, got {first:?}"
                );
                assert!(
                    took <= LEASE + CALL_DEADLINE,
                    "a holder answered within its lease, took {took:?}"
                );
            }
        }
    }

    // Once the lock is gone, every holder's key resolves, charged exactly once.
    for (request, first, _) in &firsts {
        if !answered(first) {
            let attempts = bench
                .charge_until_answered(request, RETRY_EVERY, Duration::from_secs(8))
                .await;
            let (last, _) = attempts.last().expect("an attempt");
            assert!(answered(last), "a holder's retry after the lock: {last:?}");
        }
    }
    eprintln!(
        "all holders resolved {:?} after the lock ended",
        lock_ended.elapsed()
    );
    let charges = bench.charges_by_intent().await;
    let twice: Vec<_> = charges.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "charged more than once: {twice:?}");
    for (request, _, _) in &firsts {
        assert_eq!(charges.get(request.id().key()), Some(&1));
    }
}
