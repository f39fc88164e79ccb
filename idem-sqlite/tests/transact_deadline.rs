//! `run_in_transaction` while another process holds SQLite's write lock (C13): the wait for it
//! is bounded by the engine's store timeout, not by the connection's whole busy timeout at each
//! step.

mod common;

use common::db_path;
use idem_core::{Begin, FencingToken, Idempotency, Lease, Policy, RunError, StoredResponse};
use idem_sqlite::{SqliteIdempotency, SqliteStore};
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Another process's connection holds the write lock of the database at `path` for `hold`,
/// from when this returns.
fn hold_the_write_lock(path: PathBuf, hold: Duration) -> JoinHandle<()> {
    let (locked_tx, locked) = std::sync::mpsc::channel();
    let other = std::thread::spawn(move || {
        let conn = rusqlite::Connection::open(path).expect("open");
        conn.execute_batch("BEGIN IMMEDIATE").expect("write lock");
        locked_tx.send(()).expect("send");
        std::thread::sleep(hold);
        conn.execute_batch("ROLLBACK").expect("rollback");
    });
    locked.recv().expect("locked");
    other
}

#[tokio::test]
async fn c13_a_transactional_request_is_answered_within_the_store_timeout_when_another_process_writes(
) {
    const STORE_TIMEOUT: Duration = Duration::from_millis(500);
    let store = SqliteStore::builder(db_path())
        .table(&format!("t_{}", FencingToken::generate()))
        .open()
        .await
        .expect("open");
    let idem = Idempotency::with_policy(store, Policy::default().store_timeout(STORE_TIMEOUT))
        .expect("policy");
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some("busy"))
        .body(b"{}")
        .build()
        .expect("request");
    // Another process's connection holds the write lock for 8 s.
    let other = hold_the_write_lock(db_path(), Duration::from_secs(8));
    let started = Instant::now();
    let outcome = idem
        .run_in_transaction(&request, |_tx, _lease| {
            Ok::<_, rusqlite::Error>(StoredResponse::new(201, "charged"))
        })
        .await;
    let took = started.elapsed();
    eprintln!("with the write lock held elsewhere: {outcome:?} after {took:?}");
    other.join().expect("joined");
    assert!(
        took < STORE_TIMEOUT * 3,
        "answered after {took:?}, store timeout {STORE_TIMEOUT:?}"
    );
}

/// C13: the guard's transactional completion (`complete_transaction`, what the HTTP layer's
/// `Reservation::transaction` calls) draws from the budget of the request that took the lease,
/// here the request's own 300 ms, not a fresh one: while another process holds the write lock
/// for 2 s it gives up within that budget, nothing written, instead of committing after the
/// lock.
#[tokio::test]
async fn c13_the_guards_transaction_draws_from_the_requests_budget() {
    const BUDGET: Duration = Duration::from_millis(300);
    // A file of its own: the other test holds the shared one's write lock for 8 s.
    let dir = tempfile::tempdir().expect("a directory");
    let path = dir.path().join("guarded.db");
    let store = SqliteStore::builder(&path).open().await.expect("open");
    let idem = Idempotency::new(store);
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some("guarded"))
        .body(b"{}")
        .build()
        .expect("request")
        .with_store_budget(BUDGET);
    let Begin::Acquired(lease) = idem.begin(&request).await.expect("begin") else {
        panic!("a fresh key is acquired");
    };
    let other = hold_the_write_lock(path, Duration::from_secs(2));
    let started = Instant::now();
    let effect = |_tx: &rusqlite::Transaction<'_>, _lease: &Lease| {
        Ok::<_, rusqlite::Error>(StoredResponse::new(201, "charged"))
    };
    let ended = idem.complete_transaction(&lease, Box::new(effect)).await;
    let took = started.elapsed();
    other.join().expect("joined");
    assert!(
        matches!(ended, Err(RunError::Idem(_) | RunError::Released(_))),
        "{ended:?}"
    );
    assert!(
        took < BUDGET + Duration::from_millis(700),
        "gave up after {took:?}"
    );
}
