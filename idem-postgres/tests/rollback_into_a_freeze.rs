//! A server that freezes while the effect's transaction is open (C13): a completion statement
//! cut off by its deadline is not rolled back over the frozen link (the transaction is dropped
//! with its connection, and the server rolls back); the ROLLBACK after the effect's error has
//! the store timeout, past which the same happens. The request is answered within the
//! deadline.

mod common;
mod support;

use common::{pg_url, SCHEMA};
use fault_proxy::{Fault, FaultProxy};
use idem_core::{FencingToken, Idempotency, Outcome, Policy, Request, RunError, StoredResponse};
use idem_postgres::sqlx::{self, AssertSqlSafe, Connection, PgConnection};
use idem_postgres::{PgIdempotency, PgStore};
use std::sync::Arc;
use std::time::{Duration, Instant};

const STORE_TIMEOUT: Duration = Duration::from_millis(800);
const LEASE: Duration = Duration::from_secs(30);
/// How long the server stays frozen.
const FROZEN_FOR: Duration = Duration::from_secs(8);
/// What the engine may take to answer once the server froze: the completion's (or the
/// effect's bounded rollback's) deadline, a bounded release, and a margin short of a third
/// store timeout, which a ROLLBACK awaited after the cut-off completion would add.
const ANSWER_WITHIN: Duration = Duration::from_millis(3 * 800);

type Charged = Result<Outcome, RunError<sqlx::Error>>;

struct Bench {
    proxy: Arc<FaultProxy>,
    idem: Idempotency<PgStore>,
    charges: String,
}

async fn direct(statement: &str) {
    let mut conn = PgConnection::connect(&pg_url()).await.expect("connect");
    sqlx::raw_sql(AssertSqlSafe(statement.to_owned()))
        .execute(&mut conn)
        .await
        .expect(statement);
}

impl Bench {
    async fn new() -> Self {
        let (proxy, url) = support::proxied(&pg_url()).await;
        let store = PgStore::builder()
            .schema(SCHEMA)
            .table(&format!("t_{}", FencingToken::generate()))
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
        Self {
            proxy: Arc::new(proxy),
            idem: Idempotency::with_policy(store, policy).expect("policy"),
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

    /// A charge whose server freezes right after the effect's INSERT was answered; the effect
    /// then answers `Ok` (`fail` false) or its own error (`fail` true).
    async fn charge_then_freeze(&self, request: &Request, fail: bool) -> Charged {
        let insert = format!(
            "INSERT INTO {} (intent) VALUES ($1) RETURNING id",
            self.charges
        );
        let intent = request.id().key().to_owned();
        let proxy = Arc::clone(&self.proxy);
        self.idem
            .run_in_transaction(request, move |tx, _lease| {
                Box::pin(async move {
                    let (id,): (i64,) = sqlx::query_as(AssertSqlSafe(insert))
                        .bind(intent)
                        .fetch_one(&mut *tx)
                        .await?;
                    proxy.set(Fault::Freeze);
                    if fail {
                        return Err(sqlx::Error::Protocol("the effect gave up".into()));
                    }
                    Ok::<_, sqlx::Error>(StoredResponse::new(201, format!("charge {id}")))
                })
            })
            .await
    }
}

async fn answered_within_the_deadline(fail: bool) {
    let bench = Bench::new().await;
    let request = bench.request(&format!("freeze-{}", FencingToken::generate()));
    let thaw = {
        let proxy = Arc::clone(&bench.proxy);
        tokio::spawn(async move {
            // Thaws FROZEN_FOR after the freeze began (the effect freezes at once).
            tokio::time::sleep(FROZEN_FOR).await;
            proxy.set(Fault::PassThrough);
        })
    };
    let started = Instant::now();
    let outcome = bench.charge_then_freeze(&request, fail).await;
    let took = started.elapsed();
    eprintln!("frozen after the effect (fail = {fail}): {outcome:?} after {took:?}");
    thaw.abort();
    bench.proxy.set(Fault::PassThrough);
    assert!(
        took < ANSWER_WITHIN,
        "answered only after {took:?}: the engine's ROLLBACK waited for the frozen server \
         (store timeout {STORE_TIMEOUT:?}, frozen for {FROZEN_FOR:?})"
    );
}

#[tokio::test]
async fn c13_a_server_that_freezes_during_the_completion_is_answered_within_the_deadline() {
    answered_within_the_deadline(false).await;
}

#[tokio::test]
async fn c13_a_server_that_freezes_before_the_effects_error_is_answered_within_the_deadline() {
    answered_within_the_deadline(true).await;
}
