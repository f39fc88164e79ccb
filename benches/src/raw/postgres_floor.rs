//! PostgreSQL by hand for the fewest round trips: the `floor` the library is measured against
//! (not the store's statements, not its schema).
//!
//! - A duplicate (replay, in flight, mismatch) is one `SELECT` by primary key on a connection of
//!   a stack of `pool` connections taken and given back without a round trip, decided by hand
//!   from its row: one round trip, the least a stored answer can cost.
//! - A fresh key is the plain two-commit design, all on one connection of the stack: the
//!   reservation `INSERT ... ON CONFLICT DO NOTHING` in autocommit (so a duplicate sees it at
//!   once), then `BEGIN`, the business insert, the completion `UPDATE`, `COMMIT`: five round
//!   trips and two commits, nothing around them. In one transaction
//!   ([`in_one_transaction`](FloorPostgres::in_one_transaction)): `BEGIN`, the reservation, the
//!   business insert, the completion, `COMMIT`: five round trips and one commit.
//! - Its table has the primary key and nothing else (no purge index, no listing index), so the
//!   completion `UPDATE` can be HOT; its purge scans the table.
//! - The requests (scope, key, fingerprint) are built by the engine over a `MemoryStore`, and
//!   the response encoded with `StoredResponse::encode` and decoded on a replay, as the library
//!   does: the same bytes reach the server.

use crate::harness::{Op, Path, Side, FLOOR, FLOOR_ONE_COMMIT};
use crate::library::{response, Requests, BODY, LEASE, OTHER_BODY};
use crate::raw::postgres::Connections;
use idem::postgres::sqlx::postgres::PgConnectOptions;
use idem::postgres::sqlx::{self, AssertSqlSafe, Connection, PgConnection, Row};
use idem::store::FencingToken;
use idem::{Policy, Request, StoredResponse};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

/// The business table, shared with the other sides (which create the same one).
const CHARGES: &str =
    "CREATE TABLE IF NOT EXISTS bench_charges (id bigserial PRIMARY KEY, cents bigint NOT NULL)";
const CHARGE: &str = "INSERT INTO bench_charges (cents) VALUES (2500)";

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The statements of this side, on its table.
struct Statements {
    create: String,
    reserve: Arc<str>,
    complete: Arc<str>,
    answer: Arc<str>,
    seed: Arc<str>,
    purge: Arc<str>,
}

impl Statements {
    fn new(table: &str) -> Self {
        let t = format!("\"public\".\"{table}\"");
        Self {
            create: format!(
                "CREATE TABLE {t} (consumer text NOT NULL, route text NOT NULL, key text NOT NULL, \
                 fingerprint bytea NOT NULL, token bytea NOT NULL, state smallint NOT NULL, \
                 deadline timestamptz NOT NULL, response bytea, PRIMARY KEY (consumer, route, key))"
            ),
            reserve: format!(
                "INSERT INTO {t} (consumer, route, key, fingerprint, token, state, deadline) \
                 VALUES ($1, $2, $3, $4, $5, 0, clock_timestamp() + $6 * interval '1 millisecond') \
                 ON CONFLICT DO NOTHING"
            )
            .into(),
            complete: format!(
                "UPDATE {t} SET state = 1, response = $5, \
                 deadline = clock_timestamp() + $6 * interval '1 millisecond' \
                 WHERE consumer = $1 AND route = $2 AND key = $3 AND token = $4 AND state = 0"
            )
            .into(),
            answer: format!(
                "SELECT state, fingerprint = $4 AS same, deadline > clock_timestamp() AS live, \
                 CASE WHEN fingerprint = $4 AND state = 1 THEN response END AS response \
                 FROM {t} WHERE consumer = $1 AND route = $2 AND key = $3"
            )
            .into(),
            seed: format!(
                "INSERT INTO {t} (consumer, route, key, fingerprint, token, state, deadline) \
                 SELECT $1, 'expired', n::text, '\\x00', '\\x00', 0, clock_timestamp() - interval '1 second' \
                 FROM generate_series($2::bigint, $3::bigint) AS n"
            )
            .into(),
            purge: format!(
                "DELETE FROM {t} WHERE ctid IN (SELECT ctid FROM {t} \
                 WHERE deadline <= (SELECT clock_timestamp()) LIMIT $1 FOR UPDATE SKIP LOCKED)"
            )
            .into(),
        }
    }
}

/// What the row of a key says, decided by hand.
#[derive(Debug)]
enum Reply {
    /// No live row (none, or expired: not on the measured paths).
    Absent,
    /// A live completed row of the same fingerprint: its response, decoded.
    Replay(StoredResponse),
    /// A live in-progress row of the same fingerprint.
    InFlight,
    /// A live row of another fingerprint.
    Mismatch,
}

/// Everything one side shares with its operations.
struct Inner {
    conns: Connections,
    sql: Statements,
    retention: Duration,
}

impl Inner {
    /// Reserve in autocommit, then the business insert and the completion in one transaction,
    /// all on one stacked connection: five round trips, two commits. With `one_transaction`,
    /// `BEGIN` first and the reservation in the transaction: five round trips, one commit (a
    /// duplicate of an uncommitted key would wait on its row: what the library's gate is for).
    async fn fresh(&self, request: &Request, response: &StoredResponse, one_transaction: bool) {
        let token = FencingToken::generate();
        let encoded = response.encode().expect("encode the response");
        let mut held = self.conns.get().await;
        if !one_transaction {
            self.reserve(held.conn(), request, &token).await;
        }
        let mut tx = held.conn().begin().await.expect("begin");
        if one_transaction {
            self.reserve(&mut tx, request, &token).await;
        }
        sqlx::query(CHARGE)
            .execute(&mut *tx)
            .await
            .expect("the business insert");
        let id = request.id();
        let done = sqlx::query(AssertSqlSafe(Arc::clone(&self.sql.complete)))
            .bind(id.consumer())
            .bind(id.route())
            .bind(id.key())
            .bind(token.as_bytes().as_slice())
            .bind(encoded.as_slice())
            .bind(millis(self.retention))
            .execute(&mut *tx)
            .await
            .expect("the completion")
            .rows_affected();
        assert_eq!(done, 1, "the completion is fenced on the token");
        tx.commit().await.expect("commit");
        held.give_back();
    }

    /// The reservation of a fresh key under `token`, on `conn`.
    async fn reserve(&self, conn: &mut PgConnection, request: &Request, token: &FencingToken) {
        let id = request.id();
        let reserved = sqlx::query(AssertSqlSafe(Arc::clone(&self.sql.reserve)))
            .bind(id.consumer())
            .bind(id.route())
            .bind(id.key())
            .bind(request.fingerprint().as_bytes().as_slice())
            .bind(token.as_bytes().as_slice())
            .bind(millis(LEASE))
            .execute(conn)
            .await
            .expect("the reservation")
            .rows_affected();
        assert_eq!(reserved, 1, "a fresh key is reserved");
    }

    /// One `SELECT` by primary key; the answer decided from its row.
    async fn answer(&self, request: &Request) -> Reply {
        let id = request.id();
        let mut held = self.conns.get().await;
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&self.sql.answer)))
            .bind(id.consumer())
            .bind(id.route())
            .bind(id.key())
            .bind(request.fingerprint().as_bytes().as_slice())
            .fetch_optional(held.conn())
            .await
            .expect("the answer's SELECT");
        let reply = match row {
            None => Reply::Absent,
            Some(row) => read(&row),
        };
        held.give_back();
        reply
    }
}

/// The answer of a key's row.
fn read(row: &sqlx::postgres::PgRow) -> Reply {
    let live: bool = row.try_get("live").expect("live");
    if !live {
        return Reply::Absent;
    }
    let same: bool = row.try_get("same").expect("same");
    if !same {
        return Reply::Mismatch;
    }
    let state: i16 = row.try_get("state").expect("state");
    match state {
        0 => Reply::InFlight,
        1 => {
            let bytes: Option<&[u8]> = row.try_get("response").expect("response");
            let bytes = bytes.expect("a completed row of the same fingerprint has its response");
            Reply::Replay(StoredResponse::decode(bytes).expect("decode the stored response"))
        }
        other => panic!("state {other}"),
    }
}

/// PostgreSQL by hand for the fewest round trips, on a table of its own.
pub struct FloorPostgres {
    inner: Arc<Inner>,
    requests: Requests,
    one_transaction: bool,
}

impl FloorPostgres {
    /// A side on the server at `url` with a stack of `pool` connections, on a new table
    /// `floor_<random>` (primary key only), and the shared business table.
    pub async fn connect(url: &str, pool: u32) -> Self {
        let options: PgConnectOptions = url.parse().expect("a PostgreSQL URL");
        let table = format!("floor_{}", FencingToken::generate());
        let conns = Connections::new(options, pool);
        let sql = Statements::new(&table);
        let mut held = conns.get().await;
        sqlx::raw_sql(AssertSqlSafe(sql.create.clone()))
            .execute(held.conn())
            .await
            .expect("the floor's table");
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
                sql,
                retention: Policy::default().retention,
            }),
            requests: Requests::new("floor"),
            one_transaction: false,
        }
    }

    /// This side with a fresh key in one transaction ([`FLOOR_ONE_COMMIT`]): what one commit
    /// (C15) is measured against beside the two-commit floor.
    pub fn in_one_transaction(mut self) -> Self {
        self.one_transaction = true;
        self
    }
}

#[async_trait::async_trait]
impl Side for FloorPostgres {
    fn name(&self) -> &'static str {
        if self.one_transaction {
            FLOOR_ONE_COMMIT
        } else {
            FLOOR
        }
    }

    async fn op(&self, path: Path, size: usize) -> Op {
        let inner = Arc::clone(&self.inner);
        match path {
            Path::Fresh => {
                let requests = self.requests.clone();
                let one_transaction = self.one_transaction;
                Arc::new(move || {
                    let inner = Arc::clone(&inner);
                    let request = requests.fresh();
                    Box::pin(
                        async move { inner.fresh(&request, &response(100), one_transaction).await },
                    )
                })
            }
            Path::Replay | Path::InFlight | Path::Mismatch => {
                let key = format!("asked-{}", self.requests.numbers(1));
                let first = self.requests.request(&key, BODY);
                if path == Path::InFlight {
                    let reserved = {
                        let mut held = inner.conns.get().await;
                        let id = first.id();
                        let done = sqlx::query(AssertSqlSafe(Arc::clone(&inner.sql.reserve)))
                            .bind(id.consumer())
                            .bind(id.route())
                            .bind(id.key())
                            .bind(first.fingerprint().as_bytes().as_slice())
                            .bind(FencingToken::generate().as_bytes().as_slice())
                            .bind(millis(LEASE))
                            .execute(held.conn())
                            .await
                            .expect("the reservation")
                            .rows_affected();
                        held.give_back();
                        done
                    };
                    assert_eq!(reserved, 1, "a new key is reserved");
                } else {
                    inner.fresh(&first, &response(size), false).await;
                }
                let asked = match path {
                    Path::Mismatch => self.requests.request(&key, OTHER_BODY),
                    _ => first,
                };
                let asked = Arc::new(asked);
                Arc::new(move || {
                    let (inner, asked) = (Arc::clone(&inner), Arc::clone(&asked));
                    Box::pin(async move {
                        match (path, inner.answer(&asked).await) {
                            (Path::Replay, Reply::Replay(stored)) => {
                                black_box(stored);
                            }
                            (Path::InFlight, Reply::InFlight)
                            | (Path::Mismatch, Reply::Mismatch) => {}
                            (path, other) => panic!("{path:?} answered {other:?}"),
                        }
                    })
                })
            }
        }
    }

    async fn seed_expired(&self, n: usize) {
        let first = i64::try_from(self.requests.numbers(n as u64)).unwrap_or(i64::MAX);
        let last = first.saturating_add(i64::try_from(n).unwrap_or(i64::MAX)) - 1;
        let mut held = self.inner.conns.get().await;
        sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.seed)))
            .bind(format!("seed_{}", FencingToken::generate()))
            .bind(first)
            .bind(last)
            .execute(held.conn())
            .await
            .expect("seed expired records");
        held.give_back();
    }

    async fn purge(&self, n: usize) -> usize {
        let mut held = self.inner.conns.get().await;
        let deleted = sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.purge)))
            .bind(i64::try_from(n).unwrap_or(i64::MAX))
            .execute(held.conn())
            .await
            .expect("purge")
            .rows_affected();
        held.give_back();
        usize::try_from(deleted).unwrap_or(usize::MAX)
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
        let side = FloorPostgres::connect(&url, 4).await;
        assert_eq!(side.name(), "floor");
        crate::exercise::every_path(&side).await;
        side.seed_expired(50).await;
        assert_eq!(side.purge(20).await, 20, "one bounded batch");
        assert_eq!(side.purge(1000).await, 30, "the rest of the seeded records");
    }
}
