//! The SQLite store next to the same statements written by hand with rusqlite, in one run.
//!
//! `cargo bench --bench sqlite`
//!
//! Three ways for each path:
//! - `store`: idem's `SqliteStore` through the engine (one `spawn_blocking` hop per phase, on a
//!   pooled connection);
//! - `raw_inline`: the same SQL by hand on a connection owned by the benchmark thread (no hop:
//!   the floor, but blocking the executor, which a server must not do);
//! - `raw_one_hop`: the same SQL by hand behind one `spawn_blocking` hop per phase, which is what
//!   hand-written code that keeps the executor free pays.
//!
//! Paths: `replay` (a completed key is asked again), `reserve` (a new key is reserved) and
//! `fresh_cycle` (reserve a new key, then one transaction with a business insert and the
//! completion). `MemoryStore` is measured too, as the cost of the protocol without storage.
//!
//! The hop dominates and the machine's scheduler makes it noisy: compare rows of one run, and
//! repeat the run before trusting a difference of a few microseconds. Each group measures the
//! store first and again last (`store_again`), which shows how much the position in the run
//! alone moves a row.

use criterion::{criterion_group, criterion_main, Bencher, Criterion};
use idem::sqlite::rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use idem::sqlite::{SqliteIdempotency, SqliteStore};
use idem::{Idempotency, MemoryStore, Request, StoredResponse};
use std::hint::black_box;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

const SELECT: &str = "SELECT fingerprint, token, state, deadline, response FROM idem_records \
                      WHERE consumer = ?1 AND route = ?2 AND key = ?3";
const RESERVE: &str = "INSERT INTO idem_records (consumer, route, key, fingerprint, token, state, deadline, response) \
                       VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, NULL) ON CONFLICT (consumer, route, key) DO NOTHING";
const COMPLETE: &str = "UPDATE idem_records SET state = 1, response = ?5, deadline = ?6 \
                        WHERE consumer = ?1 AND route = ?2 AND key = ?3 AND token = ?4 AND state = 0";
const CHARGE: &str = "INSERT INTO charges (cents) VALUES (?1)";

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn request(idem: &Idempotency<impl idem::Store>, key: &str) -> Request {
    idem.request("acct_bench", "POST", "/v1/charges")
        .key(Some(key))
        .body(br#"{"cents":2500}"#)
        .build()
        .expect("request")
}

fn response() -> StoredResponse {
    StoredResponse::new(201, r#"{"charge":"ch_1","cents":2500}"#)
        .with_header("content-type", "application/json")
}

fn raw_connection(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("open");
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .expect("busy");
    conn.pragma_update(None, "synchronous", "NORMAL")
        .expect("sync");
    conn
}

/// The hand-written replay: read the row, check it is a live completion, take the response.
fn raw_replay(conn: &Connection, key: &str) -> Option<Vec<u8>> {
    let mut stmt = conn.prepare_cached(SELECT).expect("prepare");
    stmt.query_row(params!["acct_bench", "POST /v1/charges", key], |row| {
        let state: i64 = row.get(2)?;
        let deadline: i64 = row.get(3)?;
        let response: Option<Vec<u8>> = row.get(4)?;
        Ok((state == 1 && deadline > now_ms())
            .then_some(response)
            .flatten())
    })
    .optional()
    .expect("select")
    .flatten()
}

/// The hand-written reservation of a fresh key (the request is built and fingerprinted exactly
/// as the store's is, so both sides pay for it).
fn raw_reserve(conn: &Connection, request: &Request) -> bool {
    let id = request.id();
    let token = [7u8; 16];
    let until = now_ms() + 60_000;
    conn.prepare_cached(RESERVE)
        .expect("prepare")
        .execute(params![
            id.consumer(),
            id.route(),
            id.key(),
            request.fingerprint().as_bytes(),
            token,
            until
        ])
        .expect("reserve")
        == 1
}

/// The hand-written effect + completion in one transaction (the response encoded as the store
/// encodes it).
fn raw_complete(conn: &mut Connection, request: &Request, response: &StoredResponse) {
    let id = request.id();
    let body = response.encode().expect("encode");
    let expires = now_ms() + 86_400_000;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .expect("tx");
    tx.prepare_cached(CHARGE)
        .expect("prepare")
        .execute(params![2500])
        .expect("charge");
    let done = tx
        .prepare_cached(COMPLETE)
        .expect("prepare")
        .execute(params![
            id.consumer(),
            id.route(),
            id.key(),
            [7u8; 16],
            body,
            expires
        ])
        .expect("complete");
    assert_eq!(done, 1);
    tx.commit().expect("commit");
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("bench.db");
    let store = rt.block_on(SqliteStore::open(&path)).expect("store");
    rt.block_on(store.call(|db| {
        db.execute_batch("CREATE TABLE charges (id INTEGER PRIMARY KEY, cents INTEGER)")
    }))
    .expect("call")
    .expect("schema");
    let idem = Idempotency::new(store);
    let memory = Idempotency::new(Arc::new(MemoryStore::new()));

    // A completed key to replay, in both stores.
    let replayed = request(&idem, "replayed");
    rt.block_on(async {
        let _ = idem
            .run_in_transaction(&replayed, |_, _| {
                Ok::<_, idem::sqlite::rusqlite::Error>(response())
            })
            .await
            .expect("complete");
        let _ = memory
            .run(&replayed, |_| async {
                Ok::<_, idem::Failure<idem::Error>>(response())
            })
            .await
            .expect("complete");
    });

    let inline = Arc::new(Mutex::new(raw_connection(&path)));
    // Warm the runtime's blocking threads, both connection caches and the CPU before the first
    // measurement: without it the first row measured pays for all three.
    rt.block_on(async {
        for _ in 0..3_000 {
            let _ = black_box(idem.begin(&replayed).await.expect("begin"));
            let conn = Arc::clone(&inline);
            tokio::task::spawn_blocking(move || {
                raw_replay(&conn.lock().expect("lock"), "replayed")
            })
            .await
            .expect("join");
        }
    });

    let mut group = c.benchmark_group("replay");
    let mut store_replay = |b: &mut Bencher| {
        b.to_async(&rt)
            .iter(|| async { black_box(idem.begin(&replayed).await.expect("begin")) })
    };
    group.bench_function("store", &mut store_replay);
    group.bench_function("raw_inline", |b| {
        let conn = inline.lock().expect("lock");
        b.iter(|| black_box(raw_replay(&conn, "replayed")))
    });
    group.bench_function("raw_one_hop", |b| {
        b.to_async(&rt).iter(|| {
            let conn = Arc::clone(&inline);
            async move {
                tokio::task::spawn_blocking(move || {
                    raw_replay(&conn.lock().expect("lock"), "replayed")
                })
                .await
                .expect("join")
            }
        })
    });
    group.bench_function("memory", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(memory.begin(&replayed).await.expect("begin")) })
    });
    group.bench_function("store_again", &mut store_replay);
    group.finish();

    let counter = AtomicU64::new(0);
    let next_key = |prefix: &str| format!("{prefix}-{}", counter.fetch_add(1, Ordering::Relaxed));
    let mut group = c.benchmark_group("reserve");
    let mut store_reserve = |b: &mut Bencher| {
        b.to_async(&rt).iter(|| {
            let request = request(&idem, &next_key("store-reserve"));
            let idem = idem.clone();
            async move { idem.begin(&request).await.expect("begin") }
        })
    };
    group.bench_function("store", &mut store_reserve);
    group.bench_function("raw_inline", |b| {
        let conn = inline.lock().expect("lock");
        b.iter(|| {
            assert!(raw_reserve(
                &conn,
                &request(&idem, &next_key("inline-reserve"))
            ))
        })
    });
    group.bench_function("raw_one_hop", |b| {
        b.to_async(&rt).iter(|| {
            let (request, conn) = (
                request(&idem, &next_key("hop-reserve")),
                Arc::clone(&inline),
            );
            async move {
                let reserved = tokio::task::spawn_blocking(move || {
                    raw_reserve(&conn.lock().expect("lock"), &request)
                })
                .await
                .expect("join");
                assert!(reserved);
            }
        })
    });
    group.bench_function("store_again", &mut store_reserve);
    group.finish();

    let mut group = c.benchmark_group("fresh_cycle");
    let mut store_cycle = |b: &mut Bencher| {
        b.to_async(&rt).iter(|| {
            let request = request(&idem, &next_key("store"));
            let idem = idem.clone();
            async move {
                idem.run_in_transaction(&request, |tx, _| {
                    tx.prepare_cached(CHARGE)?.execute(params![2500])?;
                    Ok::<_, idem::sqlite::rusqlite::Error>(response())
                })
                .await
                .expect("run")
            }
        })
    };
    group.bench_function("store", &mut store_cycle);
    group.bench_function("raw_inline", |b| {
        let mut conn = inline.lock().expect("lock");
        b.iter(|| {
            let request = request(&idem, &next_key("inline"));
            assert!(raw_reserve(&conn, &request));
            raw_complete(&mut conn, &request, &response());
        })
    });
    group.bench_function("raw_one_hop", |b| {
        b.to_async(&rt).iter(|| {
            let request = Arc::new(request(&idem, &next_key("hop")));
            let (c1, c2, r1, r2) = (
                Arc::clone(&inline),
                Arc::clone(&inline),
                Arc::clone(&request),
                request,
            );
            async move {
                let reserved = tokio::task::spawn_blocking(move || {
                    raw_reserve(&c1.lock().expect("lock"), &r1)
                })
                .await
                .expect("join");
                assert!(reserved);
                tokio::task::spawn_blocking(move || {
                    raw_complete(&mut c2.lock().expect("lock"), &r2, &response())
                })
                .await
                .expect("join");
            }
        })
    });
    group.bench_function("memory", |b| {
        b.to_async(&rt).iter(|| {
            let request = request(&memory, &next_key("memory"));
            let memory = memory.clone();
            async move {
                memory
                    .run(&request, |_| async {
                        Ok::<_, idem::Failure<idem::Error>>(response())
                    })
                    .await
                    .expect("run")
            }
        })
    });
    group.bench_function("store_again", &mut store_cycle);
    group.finish();
}

criterion_group!(sqlite, benches);
criterion_main!(sqlite);
