//! Commits in doubt and a frozen server, for real (C6, C8, C13): a fault proxy between the store
//! and PostgreSQL loses the answer to the effect's COMMIT, holds the COMMIT before it reaches
//! the server, or freezes every connection. The engine reports what committed, never "nothing
//! ran" for a commit that may still land, answers within its deadline, and recovers by itself
//! when the fault ends. Charges are counted on a connection straight to the server.

mod common;
mod support;

use common::{pg_url, SCHEMA};
use fault_proxy::{Fault, FaultProxy, Hold, LoseAnswer, COMMIT_QUERY};
use idem_core::{
    Answer, Begin, Error, FencingToken, Idempotency, Outcome, Policy, Request, RunError,
    StoredResponse,
};
use idem_postgres::sqlx::{self, AssertSqlSafe, Connection, PgConnection, Row};
use idem_postgres::{EffectFuture, PgIdempotency, PgStore};
use std::time::{Duration, Instant};

/// The engine's deadline for one store call.
const STORE_TIMEOUT: Duration = Duration::from_millis(800);

/// The lease: long enough for a commit in doubt to be classified and a duplicate to find it
/// live, short enough to wait out.
const LEASE: Duration = Duration::from_secs(4);

/// The longest an execution whose COMMIT is held may take to be answered in doubt: the COMMIT's
/// deadline, then the bounded read of the record, and a margin.
const IN_DOUBT_WITHIN: Duration = Duration::from_secs(3);

type Charged = Result<Outcome, RunError<sqlx::Error>>;

/// An engine over a store reached through a fault proxy, and a charges table of its own.
struct Bench {
    proxy: FaultProxy,
    idem: Idempotency<PgStore>,
    /// The store's table, unqualified (a new one per bench).
    records: String,
    /// The charges table, schema-qualified.
    charges: String,
}

impl Bench {
    async fn new() -> Self {
        let (proxy, url) = support::proxied(&pg_url()).await;
        let records = format!("t_{}", FencingToken::generate());
        let store = PgStore::builder()
            .schema(SCHEMA)
            .table(&records)
            .connect(&url)
            .await
            .expect("connect through the proxy");
        store.migrate().await.expect("migrate");
        let charges = format!("{SCHEMA}.charges_{}", FencingToken::generate());
        direct(&format!(
            "CREATE TABLE {charges} (id bigserial PRIMARY KEY, intent text NOT NULL)"
        ))
        .await;
        let policy = Policy::default().store_timeout(STORE_TIMEOUT).lease(LEASE);
        let idem = Idempotency::with_policy(store, policy).expect("policy");
        Self {
            proxy,
            idem,
            records,
            charges,
        }
    }

    fn request(&self, key: &str) -> Request {
        self.idem
            .request("acct", "POST", "/charges")
            .key(Some(key))
            .body(b"{\"cents\":2500}")
            .build()
            .expect("request")
    }

    /// The charge, in the transaction of the engine's transactional closure.
    async fn charge(&self, request: &Request) -> Charged {
        self.charge_with(request, false).await
    }

    /// [`charge`](Self::charge) in one commit if `one_commit`, else two.
    async fn charge_with(&self, request: &Request, one_commit: bool) -> Charged {
        let insert = format!(
            "INSERT INTO {} (intent) VALUES ($1) RETURNING id",
            self.charges
        );
        let intent = request.id().key().to_owned();
        match one_commit {
            true => {
                self.idem
                    .run_in_transaction(&request.clone().with_one_commit(true), move |tx, _| {
                        insert_charge(tx, insert, intent)
                    })
                    .await
            }
            false => {
                self.idem
                    .run_in_transaction(request, move |tx, _| insert_charge(tx, insert, intent))
                    .await
            }
        }
    }

    /// The ids of the charges for `request`, read straight from the server.
    async fn charges(&self, request: &Request) -> Vec<i64> {
        let query = format!(
            "SELECT id FROM {} WHERE intent = '{}' ORDER BY id",
            self.charges,
            request.id().key().replace('\'', "''")
        );
        let mut conn = PgConnection::connect(&pg_url()).await.expect("connect");
        sqlx::raw_sql(AssertSqlSafe(query))
            .fetch_all(&mut conn)
            .await
            .expect("charges")
            .iter()
            .map(|row| row.try_get(0).expect("an id"))
            .collect()
    }

    /// Waits (at most `within`) until `request` has `n` charges; the ids.
    async fn await_charges(&self, request: &Request, n: usize, within: Duration) -> Vec<i64> {
        let until = Instant::now() + within;
        loop {
            let ids = self.charges(request).await;
            if ids.len() == n || Instant::now() >= until {
                return ids;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The server process whose transaction is open on the store's table, its statements done:
    /// the transaction whose COMMIT the proxy holds.
    async fn held_backend(&self) -> i32 {
        let query = format!(
            "SELECT pid FROM pg_stat_activity \
             WHERE state = 'idle in transaction' AND query LIKE '%{}%' AND pid <> pg_backend_pid()",
            self.records
        );
        let mut conn = PgConnection::connect(&pg_url()).await.expect("connect");
        let rows = sqlx::raw_sql(AssertSqlSafe(query))
            .fetch_all(&mut conn)
            .await
            .expect("pg_stat_activity");
        assert_eq!(rows.len(), 1, "one transaction open on the store's table");
        rows[0].try_get(0).expect("a pid")
    }
}

/// The effect: `insert` (of the bench's charges table) for `intent`, answered with its id.
fn insert_charge(
    tx: &mut PgConnection,
    insert: String,
    intent: String,
) -> EffectFuture<'_, sqlx::Error> {
    Box::pin(async move {
        let (id,): (i64,) = sqlx::query_as(AssertSqlSafe(insert))
            .bind(intent)
            .fetch_one(&mut *tx)
            .await?;
        Ok(StoredResponse::new(201, format!("charge {id}")))
    })
}

/// Runs `statement` on a connection straight to the server.
async fn direct(statement: &str) {
    let mut conn = PgConnection::connect(&pg_url()).await.expect("connect");
    sqlx::raw_sql(AssertSqlSafe(statement.to_owned()))
        .execute(&mut conn)
        .await
        .expect(statement);
}

/// The response of an execution, or a panic saying what came instead.
fn executed(outcome: &Charged, what: &str) -> StoredResponse {
    match outcome {
        Ok(Outcome::Executed(response)) => response.clone(),
        other => panic!("{what}: expected Executed, got {other:?}"),
    }
}

/// The body of a replay, or a panic saying what came instead.
fn replayed(outcome: &Charged, what: &str) -> Vec<u8> {
    match outcome {
        Ok(Outcome::Answered(Answer::Replay(response))) => response.body.clone(),
        other => panic!("{what}: expected a replay, got {other:?}"),
    }
}

/// Asserts an in-flight answer (409).
fn assert_in_flight(outcome: &Charged, what: &str) {
    match outcome {
        Ok(Outcome::Answered(Answer::InFlight { .. })) => {}
        other => panic!("{what}: expected in flight, got {other:?}"),
    }
}

/// Starts a transactional execution whose COMMIT the proxy holds; returns once the engine has
/// answered it in doubt (asserted: within [`IN_DOUBT_WITHIN`], a 500), the transaction still
/// open on the server, holding the record.
async fn held_commit(bench: &Bench, request: &Request) {
    held_commit_with(bench, request, false).await
}

/// [`held_commit`] in one commit if `one_commit`, else two.
async fn held_commit_with(bench: &Bench, request: &Request, one_commit: bool) {
    bench.proxy.set(Hold::to(COMMIT_QUERY));
    let started = Instant::now();
    let first = bench.charge_with(request, one_commit).await;
    let took = started.elapsed();
    eprintln!("held COMMIT: answered {first:?} after {took:?}");
    assert_eq!(bench.proxy.requests_held(), 1, "the COMMIT was held");
    match &first {
        Err(RunError::InDoubt(_)) => {}
        other => panic!("a COMMIT that never reached the server and still may: got {other:?}"),
    }
    assert!(
        took < IN_DOUBT_WITHIN,
        "in doubt within the store timeout and a margin, took {took:?}"
    );
    assert_eq!(
        bench.charges(request).await,
        Vec::<i64>::new(),
        "nothing committed yet"
    );
}

/// C8: the server commits the effect and its completion and the COMMIT's answer is lost (the
/// connection drops): the engine reads the record, finds it completed under its token and
/// answers what committed; one charge, and a retry replays it.
#[tokio::test]
async fn c08_a_commit_whose_answer_was_lost_reports_what_committed() {
    let bench = Bench::new().await;
    let request = bench.request(&format!("lost-{}", FencingToken::generate()));
    bench.proxy.set(LoseAnswer::to(COMMIT_QUERY));
    let first = bench.charge(&request).await;
    assert_eq!(
        bench.proxy.answers_lost(),
        1,
        "the COMMIT's answer was lost"
    );
    let ids = bench.charges(&request).await;
    assert_eq!(ids.len(), 1, "exactly one charge, got {ids:?}");
    let response = executed(&first, "a commit whose answer was lost");
    assert_eq!(response.status, 201);
    assert_eq!(response.body, format!("charge {}", ids[0]).into_bytes());
    let retry = bench.charge(&request).await;
    assert_eq!(replayed(&retry, "the retry"), response.body);
    assert_eq!(bench.charges(&request).await, ids, "the retry ran nothing");
}

/// C8: the COMMIT is held before it reaches the server (the transaction stays open, holding the
/// record): the engine cannot tell and says so, a 500 in doubt within its deadline, and keeps
/// the key; a duplicate meanwhile is in flight and runs nothing. Once released the COMMIT
/// lands, and a retry replays the one charge.
#[tokio::test]
async fn c08_a_commit_in_doubt_is_never_reported_as_nothing_ran() {
    let bench = Bench::new().await;
    let request = bench.request(&format!("held-{}", FencingToken::generate()));
    held_commit(&bench, &request).await;
    let duplicate = bench.charge(&request).await;
    assert_in_flight(&duplicate, "a duplicate while the commit is in doubt");
    assert!(bench.charges(&request).await.is_empty(), "no charge yet");

    bench.proxy.set(Fault::PassThrough);
    let ids = bench
        .await_charges(&request, 1, Duration::from_secs(5))
        .await;
    assert_eq!(ids.len(), 1, "the released COMMIT committed one charge");
    let retry = bench.charge(&request).await;
    assert_eq!(
        replayed(&retry, "a retry after the commit landed"),
        format!("charge {}", ids[0]).into_bytes()
    );
    assert_eq!(bench.charges(&request).await, ids, "exactly one charge");
}

/// C15, C8: the same in one commit, where the reservation itself is in the held transaction
/// (no row anybody else can see, let alone lock): the engine still cannot tell, and says so,
/// never "nothing ran" (the record's gate lock, not its row, is what the classification waits
/// for); a duplicate meanwhile is in flight; the released COMMIT lands one charge, replayed.
#[tokio::test]
async fn c15_a_one_commit_in_doubt_is_never_reported_as_nothing_ran() {
    let bench = Bench::new().await;
    let request = bench.request(&format!("held-once-{}", FencingToken::generate()));
    held_commit_with(&bench, &request, true).await;
    let duplicate = bench.charge_with(&request, true).await;
    assert_in_flight(&duplicate, "a duplicate while the one commit is in doubt");
    bench.proxy.set(Fault::PassThrough);
    let ids = bench
        .await_charges(&request, 1, Duration::from_secs(5))
        .await;
    assert_eq!(ids.len(), 1, "the released COMMIT committed one charge");
    let retry = bench.charge_with(&request, true).await;
    assert_eq!(
        replayed(&retry, "a retry after the commit landed"),
        format!("charge {}", ids[0]).into_bytes()
    );
    assert_eq!(bench.charges(&request).await, ids, "exactly one charge");
}

/// C8, C9: the same, and the transaction whose COMMIT is held is then killed on the server: it
/// rolls back, nothing charged; the key stays in flight until the lease passes (nothing gives
/// it back while the commit was in doubt), then a retry runs exactly once.
#[tokio::test]
async fn c08_a_commit_in_doubt_that_rolls_back_runs_once_after_the_lease() {
    let bench = Bench::new().await;
    let request = bench.request(&format!("killed-{}", FencingToken::generate()));
    held_commit(&bench, &request).await;
    let pid = bench.held_backend().await;
    direct(&format!("SELECT pg_terminate_backend({pid})")).await;
    let killed = Instant::now();
    assert!(bench.charges(&request).await.is_empty(), "rolled back");
    let duplicate = bench.charge(&request).await;
    assert_in_flight(&duplicate, "a retry while the lease lasts");

    let until = killed + LEASE + Duration::from_secs(5);
    let retried = loop {
        let retry = bench.charge(&request).await;
        match &retry {
            Ok(Outcome::Answered(Answer::InFlight { .. })) if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => break retry,
        }
    };
    let response = executed(&retried, "the retry once the lease passed");
    let ids = bench.charges(&request).await;
    assert_eq!(ids.len(), 1, "exactly one charge, got {ids:?}");
    assert_eq!(response.body, format!("charge {}", ids[0]).into_bytes());
    let again = bench.charge(&request).await;
    assert_eq!(replayed(&again, "a retry after it ran"), response.body);
    assert_eq!(bench.charges(&request).await, ids);
}

/// C13: a frozen server (sockets open, nothing answered) is a 503 within the store timeout for
/// a replay and for a fresh key, never a hang; once it thaws, the store recovers by itself
/// (no new store, no new process): within two store timeouts the replay is answered again and
/// the fresh key runs, once.
#[tokio::test]
async fn c13_a_frozen_server_is_a_503_within_the_deadline_and_recovers() {
    let bench = Bench::new().await;
    let done = bench.request(&format!("done-{}", FencingToken::generate()));
    let fresh = bench.request(&format!("fresh-{}", FencingToken::generate()));
    let stored = executed(&bench.charge(&done).await, "before the freeze");

    bench.proxy.set(Fault::Freeze);
    for (request, what) in [(&done, "a replay"), (&fresh, "a fresh key")] {
        let started = Instant::now();
        let begun = bench.idem.begin(request).await;
        let took = started.elapsed();
        eprintln!("frozen, {what}: {begun:?} after {took:?}");
        match &begun {
            Err(error) => assert!(matches!(error, Error::Store(_)), "{what}: {error}"),
            Ok(other) => panic!("{what} while the server is frozen: got {other:?}"),
        }
        assert!(
            took < STORE_TIMEOUT + Duration::from_millis(500),
            "{what}: answered within the store timeout, took {took:?}"
        );
    }

    bench.proxy.set(Fault::PassThrough);
    let thawed = Instant::now();
    let mut attempts = 0;
    let replay = loop {
        attempts += 1;
        match bench.idem.begin(&done).await {
            Err(error) if thawed.elapsed() < 2 * STORE_TIMEOUT => {
                eprintln!("attempt {attempts} after the thaw: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other,
        }
    };
    match &replay {
        Ok(Begin::Answered(Answer::Replay(response))) => assert_eq!(response.body, stored.body),
        other => panic!("the replay after the thaw (attempt {attempts}): got {other:?}"),
    }
    let ran = bench.charge(&fresh).await;
    let recovered = thawed.elapsed();
    eprintln!("thawed: replay at attempt {attempts}, the fresh key {ran:?} after {recovered:?}");
    executed(&ran, "the fresh key after the thaw");
    assert!(
        recovered < 2 * STORE_TIMEOUT,
        "recovered within two store timeouts, took {recovered:?}"
    );
    assert_eq!(
        bench.charges(&fresh).await.len(),
        1,
        "the fresh key ran once"
    );
    assert_eq!(
        bench.charges(&done).await.len(),
        1,
        "the replay ran nothing"
    );
}

/// C13, C9: a reservation sent into the freeze on a connection that waited in the store's stack
/// is not lost with its connection: it waits in the network and reaches the server once it
/// thaws, after the engine answered 503, and commits a reservation nobody holds. Whatever
/// becomes of it, the key runs exactly once: at once if it never landed, else once its lease
/// has passed (a retry meanwhile is answered in flight and runs nothing).
#[tokio::test]
async fn c13_a_reservation_sent_into_the_freeze_never_runs_twice() {
    let bench = Bench::new().await;
    // A store connection waits in the stack: the reservation goes out on it.
    let warm = bench.request(&format!("warm-{}", FencingToken::generate()));
    executed(&bench.charge(&warm).await, "before the freeze");
    let fresh = bench.request(&format!("fresh-{}", FencingToken::generate()));

    bench.proxy.set(Fault::Freeze);
    let begun = bench.idem.begin(&fresh).await;
    match &begun {
        Err(error) => assert!(matches!(error, Error::Store(_)), "{error}"),
        Ok(other) => panic!("a fresh key while the server is frozen: got {other:?}"),
    }
    bench.proxy.set(Fault::PassThrough);
    let thawed = Instant::now();

    let until = thawed + LEASE + Duration::from_secs(5);
    let mut in_flight = 0;
    let ran = loop {
        let retry = bench.charge(&fresh).await;
        match &retry {
            Ok(Outcome::Answered(Answer::InFlight { .. })) if Instant::now() < until => {
                in_flight += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => break retry,
        }
    };
    eprintln!(
        "after the thaw: {in_flight} in-flight answers, then ran after {:?}",
        thawed.elapsed()
    );
    let response = executed(&ran, "the fresh key after the thaw");
    let ids = bench.charges(&fresh).await;
    assert_eq!(ids.len(), 1, "exactly one charge, got {ids:?}");
    assert_eq!(response.body, format!("charge {}", ids[0]).into_bytes());
    let again = bench.charge(&fresh).await;
    assert_eq!(replayed(&again, "a retry after it ran"), response.body);
    assert_eq!(bench.charges(&fresh).await, ids);
}
