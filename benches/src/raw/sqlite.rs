//! SQLite by hand with rusqlite, the same statements on three arrangements of the connections:
//! - `raw`: one writer connection behind an async mutex (FIFO) and reader connections behind a
//!   semaphore, one `spawn_blocking` hop per phase: the store's design before its connections
//!   had threads of their own;
//! - `floor`: one blocking hop per phase and nothing else: `spawn_blocking`, and in it the
//!   writer's `std::sync::Mutex` (or a reader's) taken with a blocking lock, the way a careful
//!   person writes it for the fewest hand-offs;
//! - `raw_inline`: no hop at all (it blocks the executor, which a server must not do).

use crate::harness::{Op, Path, Side};
use crate::library::{response, Requests, BODY, LEASE, OTHER_BODY};
use idem::sqlite::rusqlite::types::ValueRef;
use idem::sqlite::rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use idem::store::FencingToken;
use idem::{Request, StoredResponse};
use std::hint::black_box;
use std::path::Path as FsPath;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{Mutex as AsyncMutex, Semaphore};

/// The table name of the store's schema (`idem::sqlite::schema_sql`): both sides have the same
/// table and indexes.
const TABLE: &str = "idem_records";
const CHARGES: &str =
    "CREATE TABLE IF NOT EXISTS bench_charges (id INTEGER PRIMARY KEY, cents INTEGER)";
const CHARGE: &str = "INSERT INTO bench_charges (cents) VALUES (?1)";
const RESERVE: &str = "INSERT INTO idem_records (consumer, route, key, fingerprint, token, state, deadline, response, reserved_at, holder) \
                       VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, NULL, ?7, ?8) ON CONFLICT (consumer, route, key) DO NOTHING";
const COMPLETE: &str = "UPDATE idem_records SET state = 1, response = ?5, deadline = ?6, completed_at = ?7, \
                        doubt = NULL, doubt_check_at = NULL \
                        WHERE consumer = ?1 AND route = ?2 AND key = ?3 AND token = ?4 AND state = 0";
/// The read of a duplicate: the response column only for a completed row of the same
/// fingerprint (a replay).
const LOOKUP: &str = "SELECT fingerprint, state, deadline, \
                      CASE WHEN state = 1 AND fingerprint = ?4 THEN response END \
                      FROM idem_records WHERE consumer = ?1 AND route = ?2 AND key = ?3";
const PURGE: &str = "DELETE FROM idem_records WHERE rowid IN \
                     (SELECT rowid FROM idem_records WHERE deadline <= ?1 LIMIT ?2)";
const READERS: usize = 4;
const RETENTION: Duration = Duration::from_secs(24 * 3600);

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A connection with the store's settings: WAL, `synchronous = NORMAL`, busy timeout 5 s.
pub fn connection(path: &FsPath) -> Connection {
    let conn = Connection::open(path).expect("open");
    conn.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .expect("wal");
    assert!(mode.eq_ignore_ascii_case("wal"));
    conn.pragma_update(None, "synchronous", "NORMAL")
        .expect("synchronous");
    conn
}

/// The reservation: one compare-and-set insert, autocommit.
fn reserve(conn: &Connection, request: &Request, token: &FencingToken, lease: Duration) -> bool {
    let (id, now) = (request.id(), now_ms());
    conn.prepare_cached(RESERVE)
        .expect("prepare")
        .execute(params![
            id.consumer(),
            id.route(),
            id.key(),
            request.fingerprint().as_bytes(),
            token.as_bytes(),
            now + i64::try_from(lease.as_millis()).unwrap_or(i64::MAX),
            now,
            idem::store::Holder::this_process().encode()
        ])
        .expect("reserve")
        == 1
}

/// The effect and the completion in one `BEGIN IMMEDIATE` transaction.
fn effect_and_complete(
    conn: &mut Connection,
    request: &Request,
    token: &FencingToken,
    response: &StoredResponse,
) {
    let id = request.id();
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .expect("begin");
    tx.prepare_cached(CHARGE)
        .expect("prepare")
        .execute(params![2500])
        .expect("charge");
    let body = response.encode().expect("encode");
    let now = now_ms();
    let done = tx
        .prepare_cached(COMPLETE)
        .expect("prepare")
        .execute(params![
            id.consumer(),
            id.route(),
            id.key(),
            token.as_bytes(),
            body,
            now + i64::try_from(RETENTION.as_millis()).unwrap_or(i64::MAX),
            now
        ])
        .expect("complete");
    assert_eq!(done, 1, "the completion is fenced on the token");
    tx.commit().expect("commit");
}

/// What the read answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Replay,
    InFlight,
    Mismatch,
}

/// The answer to a duplicate: one `SELECT`, the stored response decoded for a replay only.
fn answer(conn: &Connection, request: &Request) -> Option<Answer> {
    let id = request.id();
    let fingerprint = request.fingerprint().as_bytes();
    let now = now_ms();
    let mut stmt = conn.prepare_cached(LOOKUP).expect("prepare");
    stmt.query_row(
        params![id.consumer(), id.route(), id.key(), fingerprint],
        |row| {
            let deadline: i64 = row.get(2)?;
            if deadline <= now {
                return Ok(None);
            }
            let same = matches!(row.get_ref(0)?, ValueRef::Blob(stored) if stored == fingerprint);
            let state: i64 = row.get(1)?;
            Ok(Some(match (same, state) {
                (false, _) => Answer::Mismatch,
                (true, 0) => Answer::InFlight,
                (true, _) => match row.get_ref(3)? {
                    ValueRef::Blob(bytes) => {
                        black_box(StoredResponse::decode(bytes).expect("decode"));
                        Answer::Replay
                    }
                    _ => panic!("a completed row without a response"),
                },
            }))
        },
    )
    .optional()
    .expect("lookup")
    .flatten()
}

/// How a side's calls reach its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hops {
    /// `raw`: an async mutex (writer) or semaphore (readers), then one `spawn_blocking`.
    Queued,
    /// `floor`: one `spawn_blocking`, and a blocking lock in it.
    Blocking,
    /// `raw_inline`: on the calling task, no hop.
    Inline,
}

/// The connections of one side.
struct Connections {
    writer: Arc<AsyncMutex<Connection>>,
    readers: Arc<Mutex<Vec<Connection>>>,
    permits: Arc<Semaphore>,
    /// `floor`'s connections: the writer and each reader behind a lock of its own.
    blocking_writer: Arc<Mutex<Connection>>,
    blocking_readers: Arc<Vec<Mutex<Connection>>>,
    next_reader: AtomicUsize,
}

/// SQLite by hand, with hops (`raw`), one blocking hop (`floor`) or inline (`raw_inline`).
pub struct RawSqlite {
    hops: Hops,
    conns: Arc<Connections>,
    requests: Requests,
}

impl RawSqlite {
    /// A side on the database file at `path` (the store's schema is created if missing).
    pub fn open(path: &FsPath, hops: Hops) -> Self {
        let writer = connection(path);
        writer
            .execute_batch(&idem::sqlite::schema_sql(TABLE))
            .expect("schema");
        writer.execute_batch(CHARGES).expect("charges");
        let blocking_writer = connection(path);
        Self {
            hops,
            conns: Arc::new(Connections {
                writer: Arc::new(AsyncMutex::new(writer)),
                readers: Arc::new(Mutex::new((0..READERS).map(|_| connection(path)).collect())),
                permits: Arc::new(Semaphore::new(READERS)),
                blocking_writer: Arc::new(Mutex::new(blocking_writer)),
                blocking_readers: Arc::new(
                    (0..READERS).map(|_| Mutex::new(connection(path))).collect(),
                ),
                next_reader: AtomicUsize::new(0),
            }),
            requests: Requests::new("raw"),
        }
    }

    fn request(&self, key: &str, body: &[u8]) -> Request {
        self.requests.request(key, body)
    }
}

impl Connections {
    /// Runs `work` on the writer.
    async fn write<T: Send + 'static>(
        &self,
        hops: Hops,
        work: impl FnOnce(&mut Connection) -> T + Send + 'static,
    ) -> T {
        if hops == Hops::Blocking {
            let writer = Arc::clone(&self.blocking_writer);
            return tokio::task::spawn_blocking(move || work(&mut lock(&writer)))
                .await
                .expect("join");
        }
        let mut writer = Arc::clone(&self.writer).lock_owned().await;
        if hops == Hops::Inline {
            return work(&mut writer);
        }
        tokio::task::spawn_blocking(move || work(&mut writer))
            .await
            .expect("join")
    }

    /// Runs `work` on a reader.
    async fn read<T: Send + 'static>(
        &self,
        hops: Hops,
        work: impl FnOnce(&Connection) -> T + Send + 'static,
    ) -> T {
        if hops == Hops::Blocking {
            // A free reader if there is one, else the next in turn, waited for on this thread.
            let start = self.next_reader.fetch_add(1, Ordering::Relaxed);
            let readers = Arc::clone(&self.blocking_readers);
            return tokio::task::spawn_blocking(move || {
                let n = readers.len();
                let free = (0..n).find_map(|i| readers[(start + i) % n].try_lock().ok());
                let conn = free.unwrap_or_else(|| lock(&readers[start % n]));
                work(&conn)
            })
            .await
            .expect("join");
        }
        let inline = hops == Hops::Inline;
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .expect("permit");
        let readers = Arc::clone(&self.readers);
        let run = move || {
            let conn = lock(&readers).pop().expect("a reader");
            let out = work(&conn);
            lock(&readers).push(conn);
            drop(permit);
            out
        };
        if inline {
            return run();
        }
        tokio::task::spawn_blocking(run).await.expect("join")
    }
}

#[async_trait::async_trait]
impl Side for RawSqlite {
    fn name(&self) -> &'static str {
        match self.hops {
            Hops::Queued => "raw",
            Hops::Blocking => "floor",
            Hops::Inline => "raw_inline",
        }
    }

    async fn op(&self, path: Path, size: usize) -> Op {
        let (conns, hops) = (Arc::clone(&self.conns), self.hops);
        let n = self.requests.numbers(1);
        match path {
            Path::Fresh => {
                let requests = self.requests.clone();
                Arc::new(move || {
                    let conns = Arc::clone(&conns);
                    let request = requests.fresh();
                    Box::pin(async move {
                        // The same phases as the store: the reservation, then the effect's
                        // transaction with the completion, each one hop on the writer.
                        let token = FencingToken::generate();
                        let (r, t) = (request.clone(), token);
                        let reserved = conns
                            .write(hops, move |db| reserve(db, &r, &t, LEASE))
                            .await;
                        assert!(reserved, "a fresh key is reserved");
                        conns
                            .write(hops, move |db| {
                                effect_and_complete(db, &request, &token, &response(100))
                            })
                            .await;
                    })
                })
            }
            Path::Replay | Path::Mismatch | Path::InFlight => {
                let key = format!("asked-{n}");
                let first = self.request(&key, BODY);
                let token = FencingToken::generate();
                let (r, t) = (first.clone(), token);
                assert!(
                    conns
                        .write(Hops::Inline, move |db| reserve(db, &r, &t, LEASE))
                        .await
                );
                if path != Path::InFlight {
                    let r = first.clone();
                    conns
                        .write(Hops::Inline, move |db| {
                            effect_and_complete(db, &r, &token, &response(size))
                        })
                        .await;
                }
                let (asked, expected) = match path {
                    Path::Replay => (first, Answer::Replay),
                    Path::InFlight => (first, Answer::InFlight),
                    _ => (self.request(&key, OTHER_BODY), Answer::Mismatch),
                };
                let asked = Arc::new(asked);
                Arc::new(move || {
                    let (conns, asked) = (Arc::clone(&conns), Arc::clone(&asked));
                    Box::pin(async move {
                        let got = conns.read(hops, move |db| answer(db, &asked)).await;
                        assert_eq!(got, Some(expected));
                    })
                })
            }
        }
    }

    async fn seed_expired(&self, n: usize) {
        let base = self.requests.numbers(n as u64);
        let requests: Vec<Request> = (0..n as u64)
            .map(|i| self.request(&format!("expired-{}", base + i), BODY))
            .collect();
        // One reservation (autocommit) per record with a 1 ms lease, as the library's side
        // seeds: the same rows written the same way, so both purges delete the same layout.
        for request in requests {
            self.conns
                .write(Hops::Queued, move |db| {
                    reserve(
                        db,
                        &request,
                        &FencingToken::generate(),
                        Duration::from_millis(1),
                    );
                })
                .await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    async fn purge(&self, n: usize) -> usize {
        let limit = i64::try_from(n).unwrap_or(i64::MAX);
        self.conns
            .write(self.hops, move |db| {
                db.prepare_cached(PURGE)
                    .expect("prepare")
                    .execute(params![now_ms(), limit])
                    .expect("purge")
            })
            .await
    }
}
