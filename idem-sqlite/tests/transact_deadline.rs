//! `run_in_transaction` while another process holds SQLite's write lock (C13): the wait for it
//! is bounded by the engine's store timeout, not by the connection's whole busy timeout at each
//! step.

mod common;

use common::db_path;
use idem_core::{FencingToken, Idempotency, Policy, StoredResponse};
use idem_sqlite::{SqliteIdempotency, SqliteStore};
use std::time::{Duration, Instant};

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
    let (locked_tx, locked) = std::sync::mpsc::channel();
    let other = std::thread::spawn(move || {
        let conn = rusqlite::Connection::open(db_path()).expect("open");
        conn.execute_batch("BEGIN IMMEDIATE").expect("write lock");
        locked_tx.send(()).expect("send");
        std::thread::sleep(Duration::from_secs(8));
        conn.execute_batch("ROLLBACK").expect("rollback");
    });
    locked.recv().expect("locked");
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
