//! The SQLite store next to the same work written by hand with rusqlite, in one run.
//!
//! `cargo bench --bench sqlite -- --warm-up-time 1 --measurement-time 2` (docs/benchmarks.md).
//!
//! Three sides for each path, each on its own database file with the same schema, the same
//! rows and the same settings (WAL, `synchronous = NORMAL`, busy timeout 5 s):
//! - `store`: idem's `SqliteStore` through the engine (`Idempotency::begin` for the answers,
//!   `SqliteIdempotency::run_in_transaction` for a fresh key);
//! - `raw_one_hop`: the same work by hand, designed as a careful person would: one writer
//!   connection behind a Tokio mutex (FIFO) and 4 reader connections behind a semaphore, every
//!   call ONE `spawn_blocking` hop, the same number of hops as the store's path:
//!   - fresh key: lock the writer, then one hop that runs `INSERT .. ON CONFLICT DO NOTHING`
//!     (the reservation, autocommit), `BEGIN IMMEDIATE`, the business insert, the completion
//!     `UPDATE` and `COMMIT`;
//!   - replay, in flight, mismatch: one hop on a reader that runs one `SELECT` (the response
//!     column only read when the fingerprint matches a completed row) and decodes the stored
//!     response with `StoredResponse::decode` for a replay;
//! - `raw_inline`: the same SQL with no hop at all, on the calling thread (the floor; it blocks
//!   the async executor, which a server must not do).
//!
//! Paths: `fresh_key` (a new key, reservation + effect + completion), `replay` (a completed
//! key asked again), `in_flight` (a key reserved and not completed, asked again) and
//! `mismatch` (a completed key asked with another body), the three answers for stored bodies
//! of 100 B, 64 KiB and 1 MiB. An in-progress row has no response: for `in_flight` the size
//! is the request body the key was reserved with (only its fingerprint is stored, so the
//! row is the same at every size). `MemoryStore` is measured at c = 1 for reference.
//!
//! Two parts:
//! 1. criterion groups, concurrency 1 (one caller): latency of each path and side;
//! 2. a table printed at the end: 1, 8, 32 and 64 callers (tasks at once on a 2-worker
//!    multi-thread runtime), throughput (ops/s) and per-op latency p50 / p99, store, raw one
//!    hop and raw inline measured in alternating rounds (the order rotates each round) and
//!    reported as medians of the rounds, so the machine's noise hits every side.
//!
//! Diagnostics, not baselines: `mismatch/raw_inline_store_select/*` answers a mismatch inline
//! with the store's own `SELECT` (idem-sqlite/sql/select_record.sql), which names the response
//! column without this code reading it; `fresh_key/raw_inline_read_first` is the inline
//! fresh key with a `SELECT` of the key first on the writer, as the store's reservation does;
//! `raw_pre_read` (a second table) is the hand-written fresh key in the store's order of work
//! (a read on a reader first whenever the writer is busy).
//!
//! Environment: `IDEM_BENCH_TABLE=off` skips the table, `=only` runs only the table;
//! `IDEM_BENCH_ROUNDS` (default 5), `IDEM_BENCH_ROUND_MS` (default 250, measured per round and
//! side, after 50 ms of unmeasured warm-up); `IDEM_BENCH_PATHS=fresh_key,mismatch` limits the
//! table to the paths whose names start with one of these prefixes.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use idem::sqlite::rusqlite::types::ValueRef;
use idem::sqlite::rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use idem::sqlite::{SqliteIdempotency, SqliteStore};
use idem::{
    Answer, Begin, FencingToken, Idempotency, MemoryStore, Outcome, Policy, Request, StoredResponse,
};
use std::hint::black_box;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::runtime::Runtime;
use tokio::sync::{Mutex as AsyncMutex, Semaphore};

/// The store's own schema file, so both databases have the same table and indexes.
const SCHEMA: &str = include_str!("../idem-sqlite/sql/migrations/0001_create_records.sql");
const CHARGES: &str = "CREATE TABLE charges (id INTEGER PRIMARY KEY, cents INTEGER)";
const CHARGE: &str = "INSERT INTO charges (cents) VALUES (?1)";
const RESERVE: &str = "INSERT INTO idem_records (consumer, route, key, fingerprint, token, state, deadline, response) \
                       VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, NULL) ON CONFLICT (consumer, route, key) DO NOTHING";
const COMPLETE: &str = "UPDATE idem_records SET state = 1, response = ?5, deadline = ?6 \
                        WHERE consumer = ?1 AND route = ?2 AND key = ?3 AND token = ?4 AND state = 0";
/// The hand-written read of a duplicate: the response column is only read for a completed row
/// whose fingerprint matches (a replay).
const LOOKUP: &str = "SELECT fingerprint, state, deadline, \
                      CASE WHEN state = 1 AND fingerprint = ?4 THEN response END \
                      FROM idem_records WHERE consumer = ?1 AND route = ?2 AND key = ?3";

/// The store's own read (idem-sqlite/sql/select_record.sql), used only by the diagnostic row
/// `mismatch/raw_inline_store_select`: it selects the response column even when the caller
/// never reads it.
const STORE_SELECT: &str = include_str!("../idem-sqlite/sql/select_record.sql");

const READERS: usize = 4;
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Long enough that the in-flight keys stay in flight for the whole run.
const LEASE: Duration = Duration::from_secs(3600);
const RETENTION: Duration = Duration::from_secs(24 * 3600);
const BODY: &[u8] = br#"{"cents":2500}"#;
const OTHER_BODY: &[u8] = br#"{"cents":9900}"#;
const SIZES: [(&str, usize); 3] = [("100B", 100), ("64KiB", 64 * 1024), ("1MiB", 1024 * 1024)];
const CONCURRENCY: [usize; 4] = [1, 8, 32, 64];

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().expect("lock")
}

fn request(idem: &Idempotency<impl idem::Store>, key: &str, body: &[u8]) -> Request {
    idem.request("acct_bench", "POST", "/v1/charges")
        .key(Some(key))
        .body(body)
        .build()
        .expect("request")
}

/// The small response of a fresh key.
fn response() -> StoredResponse {
    StoredResponse::new(201, r#"{"charge":"ch_1","cents":2500}"#)
        .with_header("content-type", "application/json")
}

/// A stored response whose body is `size` bytes.
fn sized_response(size: usize) -> StoredResponse {
    StoredResponse::new(201, vec![b'x'; size]).with_header("content-type", "application/json")
}

fn raw_connection(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("open");
    conn.busy_timeout(BUSY_TIMEOUT).expect("busy");
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .expect("wal");
    assert!(mode.eq_ignore_ascii_case("wal"));
    conn.pragma_update(None, "synchronous", "NORMAL")
        .expect("sync");
    conn
}

/// The hand-written reservation of `request`: one compare-and-set insert, autocommit.
fn raw_reserve(conn: &Connection, request: &Request, token: &FencingToken) -> bool {
    let id = request.id();
    conn.prepare_cached(RESERVE)
        .expect("prepare")
        .execute(params![
            id.consumer(),
            id.route(),
            id.key(),
            request.fingerprint().as_bytes(),
            token.as_bytes(),
            now_ms() + LEASE.as_millis() as i64
        ])
        .expect("reserve")
        == 1
}

/// The hand-written fresh key, all on one connection: the reservation (autocommit), then one
/// `BEGIN IMMEDIATE` transaction with the business insert and the completion.
fn raw_fresh(conn: &mut Connection, request: &Request, response: &StoredResponse) {
    let token = FencingToken::generate();
    assert!(raw_reserve(conn, request, &token), "fresh key");
    let id = request.id();
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .expect("begin");
    tx.prepare_cached(CHARGE)
        .expect("prepare")
        .execute(params![2500])
        .expect("charge");
    let body = response.encode().expect("encode");
    let done = tx
        .prepare_cached(COMPLETE)
        .expect("prepare")
        .execute(params![
            id.consumer(),
            id.route(),
            id.key(),
            token.as_bytes(),
            body,
            now_ms() + RETENTION.as_millis() as i64
        ])
        .expect("complete");
    assert_eq!(done, 1);
    tx.commit().expect("commit");
}

/// What the hand-written read answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Replay,
    InFlight,
    Mismatch,
}

/// The hand-written answer to a duplicate: one `SELECT`, the stored response decoded for a
/// replay only.
fn raw_answer(conn: &Connection, request: &Request) -> Option<Expect> {
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
                (false, _) => Expect::Mismatch,
                (true, 0) => Expect::InFlight,
                (true, _) => match row.get_ref(3)? {
                    ValueRef::Blob(bytes) => {
                        black_box(StoredResponse::decode(bytes).expect("decode"));
                        Expect::Replay
                    }
                    _ => panic!("completed row without a response"),
                },
            }))
        },
    )
    .optional()
    .expect("lookup")
    .flatten()
}

/// Diagnostic: the mismatch answered inline with the store's `SELECT` (response column in the
/// select list, never read by this code), to show what selecting it costs.
fn store_select_mismatch(conn: &Connection, request: &Request) {
    let id = request.id();
    let mut stmt = conn.prepare_cached(STORE_SELECT).expect("prepare");
    let same = stmt
        .query_row(params![id.consumer(), id.route(), id.key()], |row| {
            Ok(matches!(row.get_ref(0)?, ValueRef::Blob(f) if f == request.fingerprint().as_bytes()))
        })
        .expect("select");
    assert!(!same, "mismatch");
}

/// The hand-written code: one writer behind an async mutex, readers behind a semaphore, one
/// `spawn_blocking` hop per call; plus the same connections' inline twins (no hop).
struct Raw {
    writer: Arc<AsyncMutex<Connection>>,
    readers: Arc<Mutex<Vec<Connection>>>,
    permits: Arc<Semaphore>,
    inline_writer: Mutex<Connection>,
    inline_readers: Mutex<Vec<Connection>>,
}

impl Raw {
    fn open(path: &Path) -> Self {
        let writer = raw_connection(path);
        writer.execute_batch(SCHEMA).expect("schema");
        writer.execute_batch(CHARGES).expect("charges");
        let readers = |n| (0..n).map(|_| raw_connection(path)).collect::<Vec<_>>();
        Self {
            writer: Arc::new(AsyncMutex::new(writer)),
            readers: Arc::new(Mutex::new(readers(READERS))),
            permits: Arc::new(Semaphore::new(READERS)),
            inline_writer: Mutex::new(raw_connection(path)),
            inline_readers: Mutex::new(readers(READERS)),
        }
    }

    async fn fresh(&self, request: Request) {
        let mut writer = Arc::clone(&self.writer).lock_owned().await;
        tokio::task::spawn_blocking(move || raw_fresh(&mut writer, &request, &response()))
            .await
            .expect("join");
    }

    /// [`fresh`](Self::fresh) in the store's order: the writer at once if it is free, else a
    /// read on a reader first (which finds no record), then the writer's queue.
    async fn fresh_pre_read(&self, request: Request) {
        let mut writer = match Arc::clone(&self.writer).try_lock_owned() {
            Ok(writer) => writer,
            Err(_) => {
                assert_eq!(self.answer(&request).await, None);
                Arc::clone(&self.writer).lock_owned().await
            }
        };
        tokio::task::spawn_blocking(move || raw_fresh(&mut writer, &request, &response()))
            .await
            .expect("join");
    }

    async fn answer(&self, request: &Request) -> Option<Expect> {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .expect("permit");
        let (readers, request) = (Arc::clone(&self.readers), request.clone());
        tokio::task::spawn_blocking(move || {
            let conn = lock(&readers).pop().expect("reader");
            let answer = raw_answer(&conn, &request);
            lock(&readers).push(conn);
            drop(permit);
            answer
        })
        .await
        .expect("join")
    }

    fn fresh_inline(&self, request: &Request) {
        raw_fresh(&mut lock(&self.inline_writer), request, &response());
    }

    fn answer_inline(&self, request: &Request) -> Option<Expect> {
        let conn = lock(&self.inline_readers).pop().expect("reader");
        let answer = raw_answer(&conn, request);
        lock(&self.inline_readers).push(conn);
        answer
    }
}

/// Everything the measurements share.
struct Setup {
    rt: Runtime,
    _dir: tempfile::TempDir,
    idem: Idempotency<SqliteStore>,
    memory: Idempotency<Arc<MemoryStore>>,
    raw: Raw,
    keys: AtomicU64,
    /// Per size: (replay, mismatch, in-flight) requests, asked again and again.
    asks: Vec<[Request; 3]>,
    memory_replay: Request,
}

impl Setup {
    fn new() -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let dir = tempfile::tempdir().expect("dir");
        let policy = Policy::default().lease(LEASE).retention(RETENTION);
        let store = rt
            .block_on(SqliteStore::builder(dir.path().join("store.db")).open())
            .expect("store");
        rt.block_on(store.try_call(|db| db.execute_batch(CHARGES)))
            .expect("charges");
        let idem = Idempotency::with_policy(store, policy.clone()).expect("policy");
        let memory =
            Idempotency::with_policy(Arc::new(MemoryStore::new()), policy).expect("policy");
        let raw = Raw::open(&dir.path().join("raw.db"));

        // The same rows on both sides: per size a completed key whose stored body has that
        // size, and a key in flight reserved with a body of that size.
        let mut asks = Vec::new();
        for (label, size) in SIZES {
            let (done, flight) = (format!("done-{label}"), format!("flight-{label}"));
            let completed = request(&idem, &done, BODY);
            let big_body = vec![b'y'; size];
            let in_flight = request(&idem, &flight, &big_body);
            rt.block_on(async {
                let outcome = idem
                    .run_in_transaction(&completed, move |_, _| {
                        Ok::<_, idem::sqlite::rusqlite::Error>(sized_response(size))
                    })
                    .await
                    .expect("complete");
                assert!(matches!(outcome, Outcome::Executed(_)));
                let begun = idem.begin(&in_flight).await.expect("reserve");
                assert!(matches!(begun, Begin::Acquired(_)), "in flight");
            });
            {
                let mut writer = lock(&raw.inline_writer);
                raw_fresh(&mut writer, &completed, &sized_response(size));
                assert!(raw_reserve(&writer, &in_flight, &FencingToken::generate()));
            }
            asks.push([completed, request(&idem, &done, OTHER_BODY), in_flight]);
        }
        let memory_replay = request(&memory, "done", BODY);
        let outcome = rt
            .block_on(memory.run(&memory_replay, |_| async {
                Ok::<_, idem::Failure<idem::Error>>(response())
            }))
            .expect("memory");
        assert!(matches!(outcome, Outcome::Executed(_)));
        Self {
            rt,
            _dir: dir,
            idem,
            memory,
            raw,
            keys: AtomicU64::new(0),
            asks,
            memory_replay,
        }
    }

    fn next_key(&self, side: &str) -> String {
        format!("{side}-{}", self.keys.fetch_add(1, Ordering::Relaxed))
    }

    /// One fresh key through the store: reservation + effect + completion.
    async fn store_fresh(&self) {
        let request = request(&self.idem, &self.next_key("store"), BODY);
        let outcome = self
            .idem
            .run_in_transaction(&request, |tx, _| {
                tx.prepare_cached(CHARGE)?.execute(params![2500])?;
                Ok::<_, idem::sqlite::rusqlite::Error>(response())
            })
            .await
            .expect("run");
        assert!(matches!(outcome, Outcome::Executed(_)));
    }

    async fn raw_fresh(&self) {
        let request = request(&self.idem, &self.next_key("raw"), BODY);
        self.raw.fresh(request).await;
    }

    fn inline_fresh(&self) {
        let request = request(&self.idem, &self.next_key("inline"), BODY);
        self.raw.fresh_inline(&request);
    }

    async fn store_answer(&self, request: &Request, expect: Expect) {
        let begun = self.idem.begin(request).await.expect("begin");
        let got = match begun {
            Begin::Answered(Answer::Replay(r)) => {
                black_box(r);
                Expect::Replay
            }
            Begin::Answered(Answer::InFlight { .. }) => Expect::InFlight,
            Begin::Answered(Answer::Mismatch) => Expect::Mismatch,
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(got, expect);
    }

    async fn raw_answer(&self, request: &Request, expect: Expect) {
        assert_eq!(self.raw.answer(request).await, Some(expect));
    }

    fn inline_answer(&self, request: &Request, expect: Expect) {
        assert_eq!(self.raw.answer_inline(request), Some(expect));
    }
}

/// The paths, in the order they are reported.
#[derive(Debug, Clone, Copy)]
enum Case {
    Fresh,
    Answer(Expect, usize),
}

impl Case {
    fn all() -> Vec<Case> {
        let mut all = vec![Case::Fresh];
        for expect in [Expect::Replay, Expect::InFlight, Expect::Mismatch] {
            all.extend((0..SIZES.len()).map(|size| Case::Answer(expect, size)));
        }
        all
    }

    fn name(self) -> String {
        match self {
            Case::Fresh => "fresh_key".to_owned(),
            Case::Answer(expect, size) => format!("{}/{}", expect_name(expect), SIZES[size].0),
        }
    }
}

fn expect_name(expect: Expect) -> &'static str {
    match expect {
        Expect::Replay => "replay",
        Expect::InFlight => "in_flight",
        Expect::Mismatch => "mismatch",
    }
}

fn ask(setup: &Setup, expect: Expect, size: usize) -> &Request {
    let [replay, mismatch, in_flight] = &setup.asks[size];
    match expect {
        Expect::Replay => replay,
        Expect::Mismatch => mismatch,
        Expect::InFlight => in_flight,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Store,
    Raw,
    Inline,
    /// Diagnostic, fresh key only: the hand-written code with the store's order of work, a
    /// read on a reader first whenever the writer is busy, then the writer.
    PreRead,
}

const SIDES: [Side; 3] = [Side::Store, Side::Raw, Side::Inline];

/// The sides measured for `path`: the diagnostic side for a fresh key only.
fn sides(path: Case) -> &'static [Side] {
    match path {
        Case::Fresh => &[Side::Store, Side::Raw, Side::Inline, Side::PreRead],
        Case::Answer(..) => &SIDES,
    }
}

/// One operation of `path` on `side`.
async fn op(setup: &Setup, side: Side, path: Case) {
    match (side, path) {
        (Side::Store, Case::Fresh) => setup.store_fresh().await,
        (Side::Raw, Case::Fresh) => setup.raw_fresh().await,
        (Side::Inline, Case::Fresh) => setup.inline_fresh(),
        (Side::PreRead, Case::Fresh) => {
            let request = request(&setup.idem, &setup.next_key("pre-read"), BODY);
            setup.raw.fresh_pre_read(request).await
        }
        (Side::PreRead, Case::Answer(..)) => unreachable!("fresh key only"),
        (Side::Store, Case::Answer(e, s)) => setup.store_answer(ask(setup, e, s), e).await,
        (Side::Raw, Case::Answer(e, s)) => setup.raw_answer(ask(setup, e, s), e).await,
        (Side::Inline, Case::Answer(e, s)) => setup.inline_answer(ask(setup, e, s), e),
    }
}

/// Criterion at one caller: the latency of each path and side.
fn latency_groups(c: &mut Criterion, setup: &Arc<Setup>) {
    let rt = &setup.rt;
    let mut group = c.benchmark_group("fresh_key");
    group.bench_function("store", |b| b.to_async(rt).iter(|| setup.store_fresh()));
    group.bench_function("raw_one_hop", |b| b.to_async(rt).iter(|| setup.raw_fresh()));
    group.bench_function("raw_inline", |b| b.iter(|| setup.inline_fresh()));
    group.bench_function("raw_inline_read_first", |b| {
        b.iter(|| {
            let request = request(&setup.idem, &setup.next_key("inline-read"), BODY);
            let mut writer = lock(&setup.raw.inline_writer);
            assert_eq!(raw_answer(&writer, &request), None);
            raw_fresh(&mut writer, &request, &response());
        })
    });
    group.bench_function("memory", |b| {
        b.to_async(rt).iter(|| async {
            let request = request(&setup.memory, &setup.next_key("memory"), BODY);
            let outcome = setup
                .memory
                .run(&request, |_| async {
                    Ok::<_, idem::Failure<idem::Error>>(response())
                })
                .await
                .expect("run");
            assert!(matches!(outcome, Outcome::Executed(_)));
        })
    });
    group.finish();

    for expect in [Expect::Replay, Expect::InFlight, Expect::Mismatch] {
        let mut group = c.benchmark_group(expect_name(expect));
        for (size, (label, _)) in SIZES.iter().enumerate() {
            let request = ask(setup, expect, size);
            group.bench_with_input(BenchmarkId::new("store", label), request, |b, r| {
                b.to_async(rt).iter(|| setup.store_answer(r, expect))
            });
            group.bench_with_input(BenchmarkId::new("raw_one_hop", label), request, |b, r| {
                b.to_async(rt).iter(|| setup.raw_answer(r, expect))
            });
            group.bench_with_input(BenchmarkId::new("raw_inline", label), request, |b, r| {
                b.iter(|| setup.inline_answer(r, expect))
            });
        }
        if expect == Expect::Mismatch {
            for (size, (label, _)) in SIZES.iter().enumerate() {
                let request = ask(setup, expect, size);
                group.bench_with_input(
                    BenchmarkId::new("raw_inline_store_select", label),
                    request,
                    |b, r| {
                        let conn = lock(&setup.raw.inline_readers).pop().expect("reader");
                        b.iter(|| store_select_mismatch(&conn, r));
                        lock(&setup.raw.inline_readers).push(conn);
                    },
                );
            }
        }
        if expect == Expect::Replay {
            group.bench_function(BenchmarkId::new("memory", SIZES[0].0), |b| {
                b.to_async(rt).iter(|| async {
                    black_box(
                        setup
                            .memory
                            .begin(&setup.memory_replay)
                            .await
                            .expect("begin"),
                    )
                })
            });
        }
        group.finish();
    }
}

/// One round of one side: `callers` tasks run `path` back to back for `warm + measure`.
/// Returns the ops/s completed in the measured window and the latencies (ns) of the ops
/// started in it.
fn round(
    setup: &Arc<Setup>,
    side: Side,
    path: Case,
    callers: usize,
    warm: Duration,
    measure: Duration,
) -> (f64, Vec<u64>) {
    setup.rt.block_on(async {
        let start = Instant::now();
        let (from, to) = (start + warm, start + warm + measure);
        let tasks: Vec<_> = (0..callers)
            .map(|_| {
                let setup = Arc::clone(setup);
                tokio::spawn(async move {
                    let (mut done, mut latencies) = (0u64, Vec::with_capacity(4096));
                    loop {
                        let began = Instant::now();
                        if began >= to {
                            break;
                        }
                        op(&setup, side, path).await;
                        let ended = Instant::now();
                        if ended >= from && ended <= to {
                            done += 1;
                        }
                        if began >= from {
                            latencies.push((ended - began).as_nanos() as u64);
                        }
                    }
                    (done, latencies)
                })
            })
            .collect();
        let (mut done, mut latencies) = (0, Vec::new());
        for task in tasks {
            let (d, l) = task.await.expect("task");
            done += d;
            latencies.extend(l);
        }
        latencies.sort_unstable();
        (done as f64 / measure.as_secs_f64(), latencies)
    })
}

fn percentile(sorted: &[u64], p: usize) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)] as f64 / 1_000.0
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The concurrency table: per path and number of callers, the sides in alternating rounds;
/// medians of the rounds.
fn concurrency_table(setup: &Arc<Setup>) {
    let rounds = env_u64("IDEM_BENCH_ROUNDS", 5).max(1) as usize;
    let measure = Duration::from_millis(env_u64("IDEM_BENCH_ROUND_MS", 250));
    let warm = Duration::from_millis(50);
    let started = Instant::now();
    println!();
    println!(
        "concurrency table: {rounds} rounds x {} ms per side, medians of rounds; \
         ratio = median over rounds of store ops/s / raw_one_hop ops/s in that round (min..max in brackets)",
        measure.as_millis()
    );
    println!();
    println!(
        "| path | callers | store ops/s | raw_one_hop ops/s | raw_inline ops/s | store / raw_one_hop | \
         store p50 / p99 (µs) | raw_one_hop p50 / p99 (µs) | raw_inline p50 / p99 (µs) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut diagnostic = Vec::new();
    let only = std::env::var("IDEM_BENCH_PATHS").unwrap_or_default();
    let wanted = |path: Case| {
        only.is_empty()
            || only
                .split(',')
                .any(|prefix| path.name().starts_with(prefix))
    };
    for path in Case::all().into_iter().filter(|&path| wanted(path)) {
        for callers in CONCURRENCY {
            // [side] -> per-round (ops/s, p50, p99)
            let sides = sides(path);
            let mut figures: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); sides.len()];
            for r in 0..rounds {
                let mut order: Vec<usize> = (0..sides.len()).collect();
                order.rotate_left(r % sides.len());
                for i in order {
                    let (ops, lat) = round(setup, sides[i], path, callers, warm, measure);
                    figures[i].push((ops, percentile(&lat, 50), percentile(&lat, 99)));
                }
            }
            let med = |i: usize, f: fn(&(f64, f64, f64)) -> f64| {
                median(figures[i].iter().map(f).collect())
            };
            let ratios: Vec<f64> = figures[0]
                .iter()
                .zip(&figures[1])
                .map(|(s, r)| s.0 / r.0)
                .collect();
            let (lo, hi) = ratios
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            let cells: Vec<String> = (0..SIDES.len())
                .map(|i| format!("{:.0} / {:.0}", med(i, |f| f.1), med(i, |f| f.2)))
                .collect();
            println!(
                "| {} | {callers} | {:.0} | {:.0} | {:.0} | {:.2} [{lo:.2}..{hi:.2}] | {} | {} | {} |",
                path.name(),
                med(0, |f| f.0),
                med(1, |f| f.0),
                med(2, |f| f.0),
                median(ratios.clone()),
                cells[0],
                cells[1],
                cells[2],
            );
            if sides.len() > SIDES.len() {
                let per_round = |a: usize, b: usize| {
                    median(
                        figures[a]
                            .iter()
                            .zip(&figures[b])
                            .map(|(x, y)| x.0 / y.0)
                            .collect(),
                    )
                };
                diagnostic.push(format!(
                    "| {} | {callers} | {:.0} | {:.0} / {:.0} | {:.2} | {:.2} |",
                    path.name(),
                    med(3, |f| f.0),
                    med(3, |f| f.1),
                    med(3, |f| f.2),
                    per_round(0, 3),
                    per_round(3, 1),
                ));
            }
        }
    }
    if !diagnostic.is_empty() {
        println!();
        println!("diagnostic: raw_pre_read = the hand-written fresh key with the store's read on a reader first when the writer is busy (ratios: medians of per-round ratios)");
        println!();
        println!("| path | callers | raw_pre_read ops/s | raw_pre_read p50 / p99 (µs) | store / raw_pre_read | raw_pre_read / raw_one_hop |");
        println!("|---|---|---|---|---|---|");
        for line in diagnostic {
            println!("{line}");
        }
    }
    println!();
    println!(
        "concurrency table took {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

fn benches(c: &mut Criterion) {
    let table = std::env::var("IDEM_BENCH_TABLE").unwrap_or_default();
    let setup = Arc::new(Setup::new());
    // Warm the runtime's blocking threads, the connections' caches and the CPU on every side
    // before the first measurement.
    setup.rt.block_on(async {
        for _ in 0..500 {
            for path in Case::all() {
                for side in SIDES {
                    if !matches!(path, Case::Answer(_, 2)) {
                        op(&setup, side, path).await;
                    }
                }
            }
        }
    });
    if table != "only" {
        latency_groups(c, &setup);
    }
    if table != "off" {
        concurrency_table(&setup);
    }
}

criterion_group!(sqlite, benches);
criterion_main!(sqlite);
