//! The stores the benches compare, each with its hand-written baselines, on the servers that
//! `scripts/services.sh` starts (`IDEM_PG_URL`, `IDEM_REDIS_URL`; a missing server is a failure,
//! never a skip).

use crate::harness::Side;
use crate::library::{response, CompleteOnly, Effect, Library};
use crate::raw;
use crate::raw::sqlite::Hops;
use crate::transaction::{Charge, InTransaction, Transacting};
use idem::postgres::{sqlx, PgStore};
use idem::redis::RedisStore;
use idem::sqlite::{rusqlite, SqliteStore};
use idem::{Idempotency, Lease, MemoryStore, Outcome, Request, StoredResponse};
use std::sync::Arc;

/// The connections of a server store's pool, library and baseline alike.
pub const POOL: u32 = 16;

/// One store and its sides: the library first, then the baselines (the first baseline is what
/// the library's ratio is taken against).
pub struct Subject {
    /// `memory`, `sqlite`, `postgres`, `redis`.
    pub store: &'static str,
    /// Library first, then the baselines.
    pub sides: Vec<Arc<dyn Side>>,
    /// The money path (`run_in_transaction`), on the SQL stores; its ratio is taken against
    /// the same baselines.
    pub in_transaction: Option<Arc<dyn Transacting>>,
    /// The money path with one commit per fresh key (C15), against the same (two-commit)
    /// baselines and, where there is one, [`one_commit_floor`](Self::one_commit_floor).
    pub one_commit: Option<Arc<dyn Transacting>>,
    /// The floor's fresh key in one transaction
    /// ([`FLOOR_ONE_COMMIT`](crate::harness::FLOOR_ONE_COMMIT)).
    pub one_commit_floor: Option<Arc<dyn Side>>,
    /// Keeps the SQLite files while the bench runs.
    _dir: Option<tempfile::TempDir>,
}

/// A server's URL from the environment: set by `scripts/bench` and `scripts/test`.
pub fn server_url(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: run the benches with `bash scripts/bench`, which starts the servers"
        )
    })
}

/// `MemoryStore`, the reference: no baseline (nothing to write by hand).
pub async fn memory() -> Subject {
    Subject {
        store: "memory",
        sides: vec![Arc::new(Library::new(
            Arc::new(MemoryStore::new()),
            CompleteOnly,
        ))],
        in_transaction: None,
        one_commit: None,
        one_commit_floor: None,
        _dir: None,
    }
}

/// The business insert of the SQLite library sides.
const SQLITE_CHARGE: &str = "INSERT INTO bench_charges (cents) VALUES (?1)";

/// The business insert and the completion in one SQLite transaction, one hop on the writer.
/// The effect of the SQLite side, for benches that build their own.
pub fn sqlite_effect() -> impl Effect<SqliteStore> {
    SqliteEffect
}

struct SqliteEffect;

#[async_trait::async_trait]
impl Effect<SqliteStore> for SqliteEffect {
    async fn run(&self, idem: &Idempotency<SqliteStore>, lease: Lease, response: StoredResponse) {
        let completion = idem.completion(&lease, response);
        let store = idem.store().clone();
        idem.store()
            .try_call(move |db| {
                let tx = db.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                tx.execute(SQLITE_CHARGE, [2500])?;
                store
                    .complete_in(&tx, &completion)
                    .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
                tx.commit()
            })
            .await
            .expect("effect and completion");
    }
}

#[async_trait::async_trait]
impl Charge for SqliteStore {
    async fn charge(
        idem: &Idempotency<Self>,
        request: &Request,
        size: usize,
        one_commit: bool,
    ) -> Outcome {
        let effect: idem::sqlite::SqliteEffect<rusqlite::Error> = Box::new(move |tx, _lease| {
            tx.execute(SQLITE_CHARGE, [2500])?;
            Ok(response(size))
        });
        // `run_in_transaction`, in one commit if `one_commit`, else two.
        // The engine's policy makes two commits: only a one-commit run carries the option
        // (its copy of the request is the only allocation this adds to the measured path).
        let owned;
        let request = if one_commit {
            owned = request.clone().with_one_commit(true);
            &owned
        } else {
            request
        };
        idem.transact(request, effect)
            .await
            .expect("run_in_transaction")
    }
}

/// A SQLite store on `path` with the benches' business table, opened for `one_commit`.
async fn sqlite_store(path: &std::path::Path, one_commit: bool) -> SqliteStore {
    let store = SqliteStore::builder(path)
        .one_commit(one_commit)
        .open()
        .await
        .expect("open");
    store
        .try_call(|db| {
            db.execute_batch("CREATE TABLE bench_charges (id INTEGER PRIMARY KEY, cents INTEGER)")
        })
        .await
        .expect("business table");
    store
}

/// `SqliteStore` (defaults: one writer, four readers), `raw` (the same statements behind an
/// async mutex, one hop per phase), `floor` (one blocking hop per phase) and `raw_inline` (no
/// hop), each on its own file in a temporary directory, same settings.
pub async fn sqlite() -> Subject {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = sqlite_store(&dir.path().join("library.db"), false).await;
    let one_commit = sqlite_store(&dir.path().join("one_commit.db"), true).await;
    let sides: Vec<Arc<dyn Side>> = vec![
        Arc::new(Library::new(store.clone(), SqliteEffect)),
        Arc::new(raw::sqlite::RawSqlite::open(
            &dir.path().join("raw.db"),
            Hops::Queued,
        )),
        Arc::new(raw::sqlite::RawSqlite::open(
            &dir.path().join("floor.db"),
            Hops::Blocking,
        )),
        Arc::new(raw::sqlite::RawSqlite::open(
            &dir.path().join("inline.db"),
            Hops::Inline,
        )),
        Arc::new(Library::new(store.clone(), SqliteEffect).cached(store.clone(), CACHED)),
    ];
    Subject {
        store: "sqlite",
        sides,
        in_transaction: Some(Arc::new(InTransaction::new(store, false))),
        one_commit: Some(Arc::new(InTransaction::new(one_commit, true))),
        one_commit_floor: None,
        _dir: Some(dir),
    }
}

/// The business insert of the PostgreSQL library sides.
const PG_CHARGE: &str = "INSERT INTO bench_charges (cents) VALUES (2500)";

/// The business insert and the completion in one PostgreSQL transaction.
/// The effect of the PostgreSQL side, for benches that build their own.
pub fn pg_effect() -> impl Effect<PgStore> {
    PgEffect
}

struct PgEffect;

#[async_trait::async_trait]
impl Effect<PgStore> for PgEffect {
    async fn run(&self, idem: &Idempotency<PgStore>, lease: Lease, response: StoredResponse) {
        let completion = idem.completion(&lease, response);
        let mut tx = idem.store().pool().begin().await.expect("begin");
        sqlx::query(PG_CHARGE)
            .execute(&mut *tx)
            .await
            .expect("charge");
        idem.store()
            .complete_in(&mut tx, &completion)
            .await
            .expect("complete_in");
        tx.commit().await.expect("commit");
    }
}

#[async_trait::async_trait]
impl Charge for PgStore {
    async fn charge(
        idem: &Idempotency<Self>,
        request: &Request,
        size: usize,
        one_commit: bool,
    ) -> Outcome {
        let effect: idem::postgres::PgEffect<sqlx::Error> = Box::new(move |tx, _lease| {
            Box::pin(async move {
                sqlx::query(PG_CHARGE).execute(&mut *tx).await?;
                Ok(response(size))
            })
        });
        // `run_in_transaction`, in one commit if `one_commit`, else two.
        // The engine's policy makes two commits: only a one-commit run carries the option
        // (its copy of the request is the only allocation this adds to the measured path).
        let owned;
        let request = if one_commit {
            owned = request.clone().with_one_commit(true);
            &owned
        } else {
            request
        };
        idem.transact(request, effect)
            .await
            .expect("run_in_transaction")
    }
}

/// The library side with the store's `read_first(false)`: never a read before the reservation
/// (the default of both stores reads first while answers dominate).
pub const RESERVE_FIRST: &str = "library_reserve_first";
/// The library side with a replay cache (`ReplayCache`): replays from process memory.
pub const CACHED: &str = "library_cached";

/// `PgStore` on a table of its own (pool of [`POOL`]) and the same work by hand with sqlx.
pub async fn postgres() -> Subject {
    let url = server_url("IDEM_PG_URL");
    let table = format!("bench_{}", idem::store::FencingToken::generate());
    let store = PgStore::builder()
        .table(&table)
        .max_connections(POOL)
        .connect(&url)
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    // The other setting of the read before the reservation, on the same table.
    let reserve_first = PgStore::builder()
        .table(&table)
        .max_connections(POOL)
        .read_first(false)
        .connect(&url)
        .await
        .expect("connect");
    sqlx::raw_sql("CREATE TABLE IF NOT EXISTS bench_charges (id bigserial PRIMARY KEY, cents bigint NOT NULL)")
        .execute(store.pool())
        .await
        .expect("business table");
    let sides: Vec<Arc<dyn Side>> = vec![
        Arc::new(Library::new(store.clone(), PgEffect)),
        Arc::new(raw::postgres::RawPostgres::connect(&url, POOL).await),
        Arc::new(raw::postgres_floor::FloorPostgres::connect(&url, POOL).await),
        Arc::new(Library::new(reserve_first, PgEffect).named(RESERVE_FIRST)),
        Arc::new(Library::new(store.clone(), PgEffect).cached(store.clone(), CACHED)),
    ];
    Subject {
        store: "postgres",
        sides,
        in_transaction: Some(Arc::new(InTransaction::new(store.clone(), false))),
        one_commit: Some(Arc::new(InTransaction::new(store, true))),
        one_commit_floor: Some(Arc::new(
            raw::postgres_floor::FloorPostgres::connect(&url, POOL)
                .await
                .in_one_transaction(),
        )),
        _dir: None,
    }
}

/// `RedisStore` (one node) and the same commands by hand with redis-rs.
pub async fn redis() -> Subject {
    let url = server_url("IDEM_REDIS_URL");
    let store = RedisStore::connect(&url).await.expect("connect");
    let cached = Library::new(store.clone(), CompleteOnly).cached(store.clone(), CACHED);
    // The other setting of the read before the reservation.
    let reserve_first = RedisStore::builder()
        .read_first(false)
        .connect(&url)
        .await
        .expect("connect");
    let sides: Vec<Arc<dyn Side>> = vec![
        Arc::new(Library::new(store, CompleteOnly)),
        Arc::new(raw::redis::RawRedis::connect(&url).await),
        Arc::new(raw::redis_floor::FloorRedis::connect(&url).await),
        Arc::new(Library::new(reserve_first, CompleteOnly).named(RESERVE_FIRST)),
        Arc::new(cached),
    ];
    Subject {
        store: "redis",
        sides,
        in_transaction: None,
        one_commit: None,
        one_commit_floor: None,
        _dir: None,
    }
}
