//! What the PostgreSQL tests share: the server that scripts/test started (a missing server is a
//! failure, never a skip), and the conformance harness.
#![allow(dead_code)]

use idem_core::store::Completion;
use idem_core::testing::{Harness, Script, TransactHarness, TransactionalHarness};
use idem_core::{Error, FencingToken, RecordId};
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool};
use idem_postgres::{EffectFuture, Isolation, PgEffect, PgStore, StatementMode};

/// The schema every test table lives in.
pub(crate) const SCHEMA: &str = "idem_test";

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run `bash scripts/test`, which starts PostgreSQL and PgBouncer, or set it to a server of your own")
    })
}

/// The PostgreSQL server.
pub(crate) fn pg_url() -> String {
    env("IDEM_PG_URL")
}

/// A request of `idem` for `key` with an empty body.
pub(crate) fn request(idem: &idem_core::Idempotency<PgStore>, key: &str) -> idem_core::Request {
    idem.request("acct", "POST", "/charges")
        .key(Some(key))
        .body(b"{}")
        .build()
        .expect("request")
}

/// The PgBouncer (transaction mode) in front of it.
pub(crate) fn bouncer_url() -> String {
    env("IDEM_PGBOUNCER_URL")
}

/// A store on a new table of [`SCHEMA`], migrated, with a small pool.
pub(crate) async fn store_on(url: &str, mode: StatementMode, isolation: Isolation) -> PgStore {
    let table = format!("t_{}", FencingToken::generate());
    let mut builder = PgStore::builder()
        .schema(SCHEMA)
        .table(&table)
        .statements(mode)
        .isolation(isolation)
        .max_connections(8)
        .read_first(false);
    if mode == StatementMode::Simple {
        // Behind PgBouncer in transaction mode: the change feed's LISTEN needs the server.
        builder = builder.listener_url(&pg_url());
    }
    let store = builder.connect(url).await.expect("connect");
    store.migrate().await.expect("migrate");
    business_table(store.pool()).await;
    store
}

/// The business table of the tests: one row per charge, by intent. Call it after a store's
/// `migrate`, which creates the schema.
pub(crate) async fn business_table(pool: &PgPool) {
    // Concurrent CREATE ... IF NOT EXISTS can still collide in the catalog: serialize them.
    let mut tx = pool.begin().await.expect("begin");
    sqlx::raw_sql(
        "SELECT pg_advisory_xact_lock(4242); \
         CREATE TABLE IF NOT EXISTS idem_test.charges (id bigserial PRIMARY KEY, intent text NOT NULL, cents bigint NOT NULL DEFAULT 1)",
    )
    .execute(&mut *tx)
    .await
    .expect("business table");
    tx.commit().await.expect("commit");
}

/// The effect of a charge: one row of `idem_test.charges` (see [`business_table`]) for
/// `intent`, answered 201.
pub(crate) fn insert_charge(
    tx: &mut sqlx::PgConnection,
    intent: String,
) -> EffectFuture<'_, sqlx::Error> {
    Box::pin(async move {
        sqlx::query("INSERT INTO idem_test.charges (intent) VALUES ($1)")
            .bind(intent)
            .execute(&mut *tx)
            .await?;
        Ok(idem_core::StoredResponse::new(201, "charged"))
    })
}

/// How many charges exist for `intent`.
pub(crate) async fn charges(pool: &PgPool, intent: &str) -> i64 {
    let query = format!(
        "SELECT COUNT(*) FROM idem_test.charges WHERE intent = '{}'",
        intent.replace('\'', "''")
    );
    // The simple protocol: it also runs behind PgBouncer in transaction mode.
    let row = sqlx::raw_sql(AssertSqlSafe(query))
        .fetch_one(pool)
        .await
        .expect("count");
    sqlx::Row::try_get(&row, 0).expect("a count")
}

/// The conformance harness: every store is a new table, so scenarios, binaries and processes
/// never see each other's records.
pub(crate) struct Pg {
    pub url: String,
    pub mode: StatementMode,
    pub isolation: Isolation,
    /// `PgStoreBuilder::read_first`.
    pub read_first: bool,
}

impl Pg {
    pub(crate) fn direct(isolation: Isolation) -> Self {
        Self {
            url: pg_url(),
            mode: StatementMode::Prepared,
            isolation,
            read_first: false,
        }
    }

    /// [`direct`](Self::direct), each reservation reading first.
    pub(crate) fn reading_first(isolation: Isolation) -> Self {
        Self {
            read_first: true,
            ..Self::direct(isolation)
        }
    }

    pub(crate) fn bouncer() -> Self {
        Self {
            url: bouncer_url(),
            mode: StatementMode::Simple,
            isolation: Isolation::ReadCommitted,
            read_first: false,
        }
    }
}

#[idem_core::store::async_trait]
impl Harness for Pg {
    type Store = PgStore;

    async fn store(&self) -> PgStore {
        if !self.read_first {
            return store_on(&self.url, self.mode, self.isolation).await;
        }
        let table = format!("t_{}", FencingToken::generate());
        let store = PgStore::builder()
            .schema(SCHEMA)
            .table(&table)
            .isolation(self.isolation)
            .max_connections(8)
            .read_first(true)
            .connect(&self.url)
            .await
            .expect("connect");
        store.migrate().await.expect("migrate");
        business_table(store.pool()).await;
        store
    }

    async fn corrupt_response(&self, store: &PgStore, id: &RecordId) {
        let query = format!(
            "UPDATE {} SET response = '\\x00ff00'::bytea WHERE consumer = '{}' AND route = '{}' AND key = '{}'",
            store.table(),
            id.consumer().replace('\'', "''"),
            id.route().replace('\'', "''"),
            id.key().replace('\'', "''"),
        );
        let done = sqlx::raw_sql(AssertSqlSafe(query))
            .execute(store.pool())
            .await
            .expect("update");
        assert_eq!(done.rows_affected(), 1);
    }

    async fn corrupt_in_progress(&self, store: &PgStore, id: &RecordId) -> bool {
        let query = format!(
            "UPDATE {} SET response = '\\x00ff00'::bytea WHERE consumer = '{}' AND route = '{}' AND key = '{}' AND state = 0",
            store.table(),
            id.consumer().replace('\'', "''"),
            id.route().replace('\'', "''"),
            id.key().replace('\'', "''"),
        );
        let done = sqlx::raw_sql(AssertSqlSafe(query))
            .execute(store.pool())
            .await
            .expect("update");
        assert_eq!(done.rows_affected(), 1, "an in-progress record");
        true
    }
}

#[idem_core::store::async_trait]
impl TransactionalHarness for Pg {
    async fn effect_then_complete(
        &self,
        store: &PgStore,
        intent: &str,
        completion: Completion,
        commit: bool,
    ) -> Result<(), Error> {
        let fail = |e| Error::store("postgres", idem_core::StoreErrorKind::Other, e);
        let begin = match self.isolation {
            Isolation::ReadCommitted => "BEGIN ISOLATION LEVEL READ COMMITTED",
            Isolation::RepeatableRead => "BEGIN ISOLATION LEVEL REPEATABLE READ",
            _ => "BEGIN ISOLATION LEVEL SERIALIZABLE",
        };
        let mut tx = store.pool().begin_with(begin).await.map_err(fail)?;
        let insert = format!(
            "INSERT INTO idem_test.charges (intent) VALUES ('{}')",
            intent.replace('\'', "''")
        );
        sqlx::raw_sql(AssertSqlSafe(insert))
            .execute(&mut *tx)
            .await
            .map_err(fail)?;
        store.complete_in(&mut tx, &completion).await?;
        if commit {
            tx.commit().await.map_err(fail)?;
        } else {
            tx.rollback().await.map_err(fail)?;
        }
        Ok(())
    }

    async fn business_rows(&self, store: &PgStore, intent: &str) -> usize {
        usize::try_from(charges(store.pool(), intent).await).expect("a count")
    }
}

#[idem_core::store::async_trait]
impl TransactHarness for Pg {
    async fn store_for(&self, _one_commit: bool) -> PgStore {
        self.store().await
    }

    fn effect(&self, intent: &str, script: Script) -> PgEffect<String> {
        let insert = format!(
            "INSERT INTO idem_test.charges (intent) VALUES ('{}')",
            intent.replace('\'', "''")
        );
        Box::new(move |tx, _lease| {
            Box::pin(async move {
                sqlx::raw_sql(AssertSqlSafe(insert))
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| e.to_string())?;
                script.started();
                script.wait().await;
                script.end()
            })
        })
    }

    fn shared_by_processes(&self, _one_commit: bool) -> bool {
        true
    }
}

/// Runs enough fresh keys through `idem` (each reserved, then given back) that its reservations
/// expect fresh keys ([`Claim::expects_fresh`](idem_core::store::Claim::expects_fresh)): the
/// store then sends its insert alone first.
pub(crate) async fn expecting_fresh_keys(idem: &idem_core::Idempotency<PgStore>) {
    for n in 0..100 {
        let request = idem
            .request("acct_warm", "POST", "/warm")
            .key(Some(&format!("warm-{}-{n}", FencingToken::generate())))
            .body(b"{}")
            .build()
            .expect("request");
        if let Ok(idem_core::Begin::Acquired(lease)) = idem.begin(&request).await {
            idem.release(lease).await.expect("release");
        }
    }
}

/// The money path's effect in the tests: one statement of its own, answered 201.
pub(crate) fn select_one<'c>(
    tx: &'c mut sqlx::PgConnection,
    _lease: &'c idem_core::Lease,
) -> idem_postgres::EffectFuture<'c, sqlx::Error> {
    Box::pin(async move {
        sqlx::query("SELECT 1").execute(&mut *tx).await?;
        Ok(idem_core::StoredResponse::new(201, "charged"))
    })
}

/// A running one-commit execution of `held` whose effect inserts a charge for `intent`, then
/// holds its transaction until the sender is used (or dropped): its task and that sender.
pub(crate) async fn hold(
    idem: &idem_core::Idempotency<PgStore>,
    held: idem_core::Request,
    intent: String,
) -> (
    tokio::task::JoinHandle<Result<idem_core::Outcome, idem_core::RunError<sqlx::Error>>>,
    tokio::sync::oneshot::Sender<()>,
) {
    use idem_postgres::PgIdempotency;
    let (started, on_start) = tokio::sync::oneshot::channel::<()>();
    let (go, on_go) = tokio::sync::oneshot::channel::<()>();
    let held = held.with_one_commit(true);
    let engine = idem.clone();
    let holder = tokio::spawn(async move {
        engine
            .run_in_transaction(&held, move |tx, _| {
                Box::pin(async move {
                    sqlx::query("INSERT INTO idem_test.charges (intent) VALUES ($1)")
                        .bind(intent)
                        .execute(&mut *tx)
                        .await?;
                    let _ = started.send(());
                    let _ = on_go.await;
                    Ok::<_, sqlx::Error>(idem_core::StoredResponse::new(201, "held"))
                })
            })
            .await
    });
    on_start.await.expect("the effect started");
    (holder, go)
}
