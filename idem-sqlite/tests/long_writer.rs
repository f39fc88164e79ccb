//! Another process holding SQLite's write lock (`BEGIN IMMEDIATE`) longer than the store budget
//! (C5, C13): duplicates are answered at once, in flight, replayed or mismatched, whether this
//! process's writer is idle or itself waiting for that lock; only a write waits, and only for
//! the budget.

use idem_core::{Answer, Begin, Idempotency, Outcome, Policy, Request, StoredResponse};
use idem_sqlite::{rusqlite, SqliteIdempotency, SqliteStore};
use std::time::{Duration, Instant};

const BUDGET: Duration = Duration::from_secs(1);
const QUICK: Duration = Duration::from_millis(300);

fn request(idem: &Idempotency<SqliteStore>, key: &str, body: &[u8]) -> Request {
    idem.request("acct_long", "POST", "/charges")
        .key(Some(key))
        .body(body)
        .build()
        .expect("request")
}

async fn charge(idem: &Idempotency<SqliteStore>, key: &str, body: &[u8]) -> (Outcome, Duration) {
    let started = Instant::now();
    let outcome = idem
        .run_in_transaction(&request(idem, key, body), |tx, _| {
            tx.execute("CREATE TABLE IF NOT EXISTS charges (v INTEGER)", [])?;
            tx.execute("INSERT INTO charges VALUES (1)", [])?;
            Ok::<_, rusqlite::Error>(StoredResponse::new(201, "charged"))
        })
        .await
        .map_err(|e| e.to_string());
    let took = started.elapsed();
    (outcome.unwrap_or_else(|e| panic!("{key}: {e}")), took)
}

/// Answers that write nothing never wait for another process's write lock (C5).
async fn answered_at_once(idem: &Idempotency<SqliteStore>, when: &str) {
    let (live, took) = charge(idem, "live", b"{}").await;
    assert!(
        matches!(live, Outcome::Answered(Answer::InFlight { .. })) && took < QUICK,
        "{when}: in flight at once: {live:?} in {took:?}"
    );
    let started = Instant::now();
    let begun = idem
        .begin(&request(idem, "live", b"{}"))
        .await
        .expect("begin");
    let took = started.elapsed();
    assert!(
        matches!(begun, Begin::Answered(Answer::InFlight { .. })) && took < QUICK,
        "{when}: guard in flight at once: {begun:?} in {took:?}"
    );
    let (done, took) = charge(idem, "done", b"{}").await;
    assert!(
        matches!(done, Outcome::Answered(Answer::Replay(_))) && took < QUICK,
        "{when}: replay at once: {done:?} in {took:?}"
    );
    let (other, took) = charge(idem, "done", b"{\"other\":1}").await;
    assert!(
        matches!(other, Outcome::Answered(Answer::Mismatch)) && took < QUICK,
        "{when}: mismatch at once: {other:?} in {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c05_another_process_writing_past_the_budget_never_delays_an_answer() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("long.db");
    let store = SqliteStore::open(&db).await.expect("open");
    let idem = Idempotency::with_policy(
        store,
        Policy::default()
            .store_timeout(BUDGET)
            .lease(Duration::from_secs(30)),
    )
    .expect("policy");
    let Begin::Acquired(_live) = idem
        .begin(&request(&idem, "live", b"{}"))
        .await
        .expect("begin")
    else {
        panic!("acquired");
    };
    assert!(matches!(
        charge(&idem, "done", b"{}").await.0,
        Outcome::Executed(_)
    ));

    // The other process: a long business transaction holding the write lock for 4 s.
    let (held, is_held) = std::sync::mpsc::channel();
    let rival_db = db.clone();
    let rival = std::thread::spawn(move || {
        let conn = rusqlite::Connection::open(rival_db).expect("open");
        conn.execute_batch("BEGIN IMMEDIATE; CREATE TABLE IF NOT EXISTS business (v); INSERT INTO business VALUES (1);")
            .expect("write lock");
        held.send(()).expect("held");
        std::thread::sleep(Duration::from_secs(4));
        conn.execute_batch("COMMIT").expect("commit");
    });
    is_held.recv().expect("held");

    answered_at_once(&idem, "writer idle").await;
    // This process's writer now waits for the lock with a fresh key's reservation.
    let fresh = {
        let idem = idem.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let outcome = idem
                .run_in_transaction(&request(&idem, "fresh", b"{}"), |_tx, _| {
                    Ok::<_, rusqlite::Error>(StoredResponse::new(201, "fresh"))
                })
                .await;
            (outcome.map_err(|e| e.to_string()), started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    answered_at_once(&idem, "writer waiting").await;
    let (fresh, took) = fresh.await.expect("fresh");
    assert!(
        fresh.is_err() && took < BUDGET * 2,
        "a write waits for the budget at most: {fresh:?} in {took:?}"
    );
    rival.join().expect("rival");
}
