//! PostgreSQL by hand with sqlx: the store's own statements (`idem-postgres/sql/reserve.sql`,
//! `complete.sql`, `purge_expired.sql`, with this side's table in place of `idem_records`) on
//! the store's own schema (`idem::postgres::schema_sql`), sent the way the store sends them, and
//! nothing else in between.
//!
//! Why this is the fair comparison: the bytes on the wire and the round trips are the store's.
//! - The reservation and every answer run on a connection of a stack of `pool` connections
//!   kept by hand, taken and given back without a round trip (sqlx's pool pings a connection
//!   when it is given back): the store does the same for its own statements
//!   (`idem-postgres/src/connections.rs`), with the same acquire timeout (5 s) and the same
//!   `READ COMMITTED` session setting. Statements are prepared and cached per connection (sqlx's
//!   default, the store's `StatementMode::Prepared`).
//! - The business insert and the completion run in one transaction on a `PgPool` of `pool`
//!   connections built like the store's (`test_before_acquire(false)`, acquire timeout 5 s,
//!   opened lazily): the library side's effect runs on the store's pool the same way.
//! - The requests (scope, key, fingerprint) are built by the engine over a `MemoryStore`, so the
//!   same bytes reach the server; the response is encoded with `StoredResponse::encode`.
//!
//! What is left out is exactly the library: the engine's `begin`, the `Store` trait's boxed
//! futures, the record decoding into `Record` (token and fingerprint checked, rows copied), the
//! core's `decide`, the `Completion` preparation (header filter, validation). A duplicate is
//! checked by hand here from the same row: same fingerprint and state, deadline after the
//! server's now. A takeover of an expired record (`replace_reservation.sql`) is never on the
//! measured paths (the lease is an hour), so this side does not implement it: it panics if one
//! comes up.

use crate::harness::{Op, Path, Side};
use crate::library::{response, Requests, BODY, LEASE, OTHER_BODY};
use idem::postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem::postgres::sqlx::{self, AssertSqlSafe, ConnectOptions, PgConnection, PgPool, Row};
use idem::store::FencingToken;
use idem::{Policy, Request, StoredResponse};
use std::hint::black_box;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{Semaphore, SemaphorePermit};

/// The store's statements, as the files beside the store hold them.
const RESERVE: &str = include_str!("../../../idem-postgres/sql/reserve.sql");
const COMPLETE: &str = include_str!("../../../idem-postgres/sql/complete.sql");
const PURGE: &str = include_str!("../../../idem-postgres/sql/purge_expired.sql");
/// The business table, shared with the library side (which creates the same one).
const CHARGES: &str =
    "CREATE TABLE IF NOT EXISTS bench_charges (id bigserial PRIMARY KEY, cents bigint NOT NULL)";
const CHARGE: &str = "INSERT INTO bench_charges (cents) VALUES (2500)";
/// The store's schema.
const SCHEMA: &str = "public";
/// The store's acquire timeout (`PgStore::builder`'s default).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);
/// How many times a reservation runs again when its snapshot missed a concurrent one (the
/// store's bound).
const MAX_ATTEMPTS: usize = 8;

fn first_64_bits(bytes: &[u8; 32]) -> i64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(&bytes[..8]);
    i64::from_le_bytes(first)
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// A statement file with `"schema"."table"` in place of `idem_records` and without its `--`
/// comments: the text the store prepares (`idem-postgres/src/sql.rs`).
fn statement(file: &str, table: &str) -> Arc<str> {
    file.replace("idem_records", &format!("\"{SCHEMA}\".\"{table}\""))
        .lines()
        .map(|line| {
            line.split_once("--")
                .map_or(line, |(code, _)| code)
                .trim_end()
        })
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
        .into()
}

/// The reservation's connections: a stack taken and given back without a round trip, at most
/// `max` at a time, each opened `READ COMMITTED` (as the store's). The `floor` side
/// (`raw::postgres_floor`) keeps its connections the same way.
pub(crate) struct Connections {
    options: PgConnectOptions,
    idle: Mutex<Vec<PgConnection>>,
    permits: Semaphore,
}

/// A connection out of the stack: given back by [`Held::give_back`] once its statement
/// finished, closed if dropped (a panic in the middle of a statement).
pub(crate) struct Held<'a> {
    conn: Option<PgConnection>,
    home: &'a Connections,
    _permit: SemaphorePermit<'a>,
}

impl Connections {
    /// A stack of at most `max` connections to `options`, none open yet.
    pub(crate) fn new(options: PgConnectOptions, max: u32) -> Self {
        Self {
            options,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(usize::try_from(max.max(1)).unwrap_or(1)),
        }
    }

    /// The connection given back last, or a new one.
    pub(crate) async fn get(&self) -> Held<'_> {
        let permit = tokio::time::timeout(ACQUIRE_TIMEOUT, self.permits.acquire())
            .await
            .expect("a connection free before the acquire timeout")
            .expect("the semaphore is never closed");
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let conn = match idle {
            Some(conn) => conn,
            None => self.open().await,
        };
        Held {
            conn: Some(conn),
            home: self,
            _permit: permit,
        }
    }

    async fn open(&self) -> PgConnection {
        let connect = async {
            let mut conn = self.options.connect().await?;
            sqlx::raw_sql(
                "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED",
            )
            .execute(&mut conn)
            .await?;
            Ok::<_, sqlx::Error>(conn)
        };
        tokio::time::timeout(ACQUIRE_TIMEOUT, connect)
            .await
            .expect("connecting before the acquire timeout")
            .expect("connect to PostgreSQL")
    }
}

impl Held<'_> {
    /// The connection.
    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        self.conn
            .as_mut()
            .expect("a held connection until it is given back")
    }

    /// Back to the stack: what ran on it finished.
    pub(crate) fn give_back(mut self) {
        if let Some(conn) = self.conn.take() {
            self.home
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(conn);
        }
    }
}

/// What the reservation's row says, checked by hand.
#[derive(Debug)]
enum Reply {
    /// A fresh reservation: the key is ours.
    Inserted,
    /// A live completed record of the same fingerprint: its response, decoded.
    Replay(StoredResponse),
    /// A live in-progress record of the same fingerprint, with how long its lease still runs.
    InFlight(Duration),
    /// A live record of another fingerprint.
    Mismatch,
    /// A record whose deadline has passed (a takeover or a start over: not on the paths).
    Expired,
}

/// Everything one side shares with its operations.
struct Inner {
    conns: Connections,
    pool: PgPool,
    reserve: Arc<str>,
    complete: Arc<str>,
    purge: Arc<str>,
    retention: Duration,
}

impl Inner {
    /// `reserve.sql`, one round trip on a stacked connection (again only if its snapshot missed
    /// a concurrent reservation, as the store does); the row read by hand.
    async fn reserve(&self, request: &Request, token: &FencingToken, lease: Duration) -> Reply {
        let id = request.id();
        let fingerprint = request.fingerprint().as_bytes().as_slice();
        // The gate's advisory-lock keys (any two 64-bit values of the record and of the
        // record with the fingerprint cost the server the same): a two-commit reservation.
        let digest = id.digest();
        let record_lock = first_64_bits(&digest);
        let fingerprint_lock = record_lock ^ first_64_bits(request.fingerprint().as_bytes());
        let mut held = self.conns.get().await;
        for _ in 0..MAX_ATTEMPTS {
            let rows = sqlx::query(AssertSqlSafe(Arc::clone(&self.reserve)))
                .bind(id.consumer())
                .bind(id.route())
                .bind(id.key())
                .bind(fingerprint)
                .bind(token.as_bytes().as_slice())
                .bind(millis(lease))
                .bind(idem::store::Holder::this_process().encode())
                .bind(record_lock)
                .bind(fingerprint_lock)
                .bind(false)
                .bind(fingerprint)
                .fetch_all(held.conn())
                .await
                .expect("reserve.sql");
            let Some(row) = rows.first() else { continue };
            let reply = read(row, fingerprint);
            held.give_back();
            return reply;
        }
        panic!("the reservation kept missing a concurrent one")
    }

    /// The business insert and `complete.sql` in one transaction on the pool.
    async fn effect_and_complete(
        &self,
        request: &Request,
        token: &FencingToken,
        response: &StoredResponse,
    ) {
        let id = request.id();
        let encoded = response.encode().expect("encode the response");
        let mut tx = self.pool.begin().await.expect("begin");
        sqlx::query(CHARGE)
            .execute(&mut *tx)
            .await
            .expect("the business insert");
        let done = sqlx::query(AssertSqlSafe(Arc::clone(&self.complete)))
            .bind(id.consumer())
            .bind(id.route())
            .bind(id.key())
            .bind(token.as_bytes().as_slice())
            .bind(encoded.as_slice())
            .bind(millis(self.retention))
            // No mark of doubt: the execution's own answer (store rule 6).
            .bind(None::<&[u8]>)
            // A transaction of the caller's (the guard's `complete_in`), not one the store
            // began for an effect.
            .bind(false)
            .execute(&mut *tx)
            .await
            .expect("complete.sql")
            .rows_affected();
        assert_eq!(done, 1, "the completion is fenced on the token");
        tx.commit().await.expect("commit");
    }
}

/// The answer of `reserve.sql`'s row for `fingerprint`: the core's decision, by hand.
fn read(row: &sqlx::postgres::PgRow, fingerprint: &[u8]) -> Reply {
    let source: &str = row.try_get("source").expect("source");
    if source == "inserted" {
        return Reply::Inserted;
    }
    // Instants come as `timestamptz_send`: microseconds since 2000-01-01, big endian.
    let micros = |name: &str| -> i64 {
        let sent: &[u8] = row.try_get(name).expect(name);
        i64::from_be_bytes(sent.try_into().expect("8 bytes"))
    };
    let (now, deadline) = (micros("now_at"), micros("deadline_at"));
    if deadline <= now {
        return Reply::Expired;
    }
    let stored: &[u8] = row.try_get("fingerprint").expect("fingerprint");
    if stored != fingerprint {
        return Reply::Mismatch;
    }
    let state: i16 = row.try_get("state").expect("state");
    match state {
        0 => Reply::InFlight(Duration::from_micros(
            u64::try_from(deadline - now).unwrap_or(0),
        )),
        1 => {
            let bytes: Option<&[u8]> = row.try_get("response").expect("response");
            let bytes = bytes.expect("a completed row of the same fingerprint has its response");
            Reply::Replay(StoredResponse::decode(bytes).expect("decode the stored response"))
        }
        other => panic!("state {other}"),
    }
}

/// PostgreSQL by hand, on a table of its own.
pub struct RawPostgres {
    inner: Arc<Inner>,
    requests: Requests,
}

impl RawPostgres {
    /// A side on the server at `url` with `pool` connections for the reservations and `pool`
    /// for the transactions (as the store has), on a new table `raw_<random>` created from the
    /// store's schema, and the shared business table.
    pub async fn connect(url: &str, pool: u32) -> Self {
        let options: PgConnectOptions = url.parse().expect("a PostgreSQL URL");
        let table = format!("raw_{}", FencingToken::generate());
        let conns = Connections::new(options.clone(), pool);
        let pool = PgPoolOptions::new()
            .max_connections(pool)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .test_before_acquire(false)
            .connect_lazy_with(options);
        let schema = idem::postgres::schema_sql(SCHEMA, &table).expect("a valid table name");
        let mut held = conns.get().await;
        sqlx::raw_sql(AssertSqlSafe(schema))
            .execute(held.conn())
            .await
            .expect("the store's schema");
        // Another side may create the business table at the same moment: CREATE TABLE IF NOT
        // EXISTS can then fail on the catalog's unique index; the second try sees it.
        if sqlx::raw_sql(CHARGES).execute(held.conn()).await.is_err() {
            sqlx::raw_sql(CHARGES)
                .execute(held.conn())
                .await
                .expect("the business table");
        }
        held.give_back();
        Self {
            inner: Arc::new(Inner {
                conns,
                pool,
                reserve: statement(RESERVE, &table),
                complete: statement(COMPLETE, &table),
                purge: statement(PURGE, &table),
                retention: Policy::default().retention,
            }),
            requests: Requests::new("raw"),
        }
    }

    fn request(&self, key: &str, body: &[u8]) -> Request {
        self.requests.request(key, body)
    }
}

#[async_trait::async_trait]
impl Side for RawPostgres {
    fn name(&self) -> &'static str {
        "raw"
    }

    async fn op(&self, path: Path, size: usize) -> Op {
        let inner = Arc::clone(&self.inner);
        let n = self.requests.numbers(1);
        match path {
            Path::Fresh => {
                let requests = self.requests.clone();
                Arc::new(move || {
                    let inner = Arc::clone(&inner);
                    let request = requests.fresh();
                    Box::pin(async move {
                        // The store's phases: the reservation (one round trip), then the
                        // effect's transaction with the completion (BEGIN, insert, complete,
                        // COMMIT).
                        let token = FencingToken::generate();
                        let reply = inner.reserve(&request, &token, LEASE).await;
                        assert!(
                            matches!(reply, Reply::Inserted),
                            "a fresh key is reserved: {reply:?}"
                        );
                        inner
                            .effect_and_complete(&request, &token, &response(100))
                            .await;
                    })
                })
            }
            Path::Replay | Path::InFlight | Path::Mismatch => {
                let key = format!("asked-{n}");
                let first = self.request(&key, BODY);
                let token = FencingToken::generate();
                let reply = inner.reserve(&first, &token, LEASE).await;
                assert!(
                    matches!(reply, Reply::Inserted),
                    "a new key is reserved: {reply:?}"
                );
                if path != Path::InFlight {
                    inner
                        .effect_and_complete(&first, &token, &response(size))
                        .await;
                }
                let asked = match path {
                    Path::Mismatch => self.request(&key, OTHER_BODY),
                    _ => first,
                };
                let asked = Arc::new(asked);
                Arc::new(move || {
                    let (inner, asked) = (Arc::clone(&inner), Arc::clone(&asked));
                    Box::pin(async move {
                        // A duplicate: reserve.sql once (a new token, unused), answered from
                        // its row.
                        let token = FencingToken::generate();
                        match (path, inner.reserve(&asked, &token, LEASE).await) {
                            (Path::Replay, Reply::Replay(stored)) => {
                                black_box(stored);
                            }
                            (Path::InFlight, Reply::InFlight(retry_after)) => {
                                black_box(retry_after);
                            }
                            (Path::Mismatch, Reply::Mismatch) => {}
                            (path, other) => panic!("{path:?} answered {other:?}"),
                        }
                    })
                })
            }
        }
    }

    async fn seed_expired(&self, n: usize) {
        // One reservation per record with a 1 ms lease, as the library's side seeds: the same
        // rows written the same way, so both purges delete the same layout.
        let base = self.requests.numbers(n as u64);
        for i in 0..n as u64 {
            let request = self.request(&format!("expired-{}", base + i), BODY);
            self.inner
                .reserve(
                    &request,
                    &FencingToken::generate(),
                    Duration::from_millis(1),
                )
                .await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    async fn purge(&self, n: usize) -> usize {
        let mut held = self.inner.conns.get().await;
        // Window after window from the oldest record, as the store moves its window on, until
        // `n` are deleted or a window comes back short (the end of the table).
        let (mut purged, mut from) = (0, (-1_i64, String::new(), String::new(), String::new()));
        while purged < n {
            let batch = n - purged;
            let row = sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.purge)))
                .bind(i64::try_from(batch).unwrap_or(i64::MAX))
                .bind(from.0)
                .bind(&from.1)
                .bind(&from.2)
                .bind(&from.3)
                .fetch_one(held.conn())
                .await
                .expect("purge_expired.sql");
            let count = |name: &str| row.try_get::<i64, _>(name).expect(name);
            purged += usize::try_from(count("purged")).unwrap_or(0);
            let scanned = usize::try_from(count("scanned")).unwrap_or(0);
            let Ok(Some(at)) = row.try_get::<Option<i64>, _>("reserved_ms") else {
                break;
            };
            if scanned < 4 * batch {
                break;
            }
            let text = |name: &str| row.try_get::<String, _>(name).expect(name);
            from = (at, text("consumer"), text("route"), text("key"));
        }
        held.give_back();
        purged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each path a few hundred times, alone and from concurrent callers, then a purge of seeded
    /// records; on the server of `IDEM_PG_URL` (`scripts/services.sh`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_path_answers_as_expected() {
        let url = std::env::var("IDEM_PG_URL")
            .expect("IDEM_PG_URL is not set: start the servers with scripts/services.sh (or run scripts/test)");
        let side = RawPostgres::connect(&url, 4).await;
        assert_eq!(side.name(), "raw");
        crate::exercise::every_path(&side).await;
        side.seed_expired(50).await;
        assert_eq!(side.purge(20).await, 20, "one bounded batch");
        assert!(
            side.purge(1000).await >= 30,
            "the rest of the seeded records"
        );
    }
}
