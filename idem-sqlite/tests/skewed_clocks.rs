//! Two processes on one file whose clocks disagree by 30 s (C11: SQLite takes time from the
//! process clock, so processes of one machine share it; a clock of its own, `.clock(..)`, is
//! for tests). What the skew does: the process ahead sees the other's live lease as passed
//! and takes the record over. On the transactional path the effect lives in the completion's
//! transaction, so the holder left behind is fenced out with its effect rolled back: one
//! charge whatever the clocks say.

mod common;

use idem_core::{Begin, Idempotency, ManualClock, Outcome, Policy, RunError, StoredResponse};
use idem_sqlite::{rusqlite, SqliteIdempotency, SqliteStore};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const LEASE: Duration = Duration::from_secs(10);

async fn process(db: &Path, clock: ManualClock) -> Idempotency<SqliteStore> {
    let store = SqliteStore::builder(db)
        .clock(clock)
        .open()
        .await
        .expect("open");
    common::with_intent_charges(&store).await;
    Idempotency::with_policy(store, Policy::default().lease(LEASE)).expect("policy")
}

fn request(idem: &Idempotency<SqliteStore>) -> idem_core::Request {
    idem.request("acct_skew", "POST", "/charges")
        .key(Some("k-skew"))
        .body(b"{\"cents\":100}")
        .build()
        .expect("request")
}

/// C6, C9, C11: a process whose clock runs 30 s ahead takes over a lease the other still holds
/// by its own clock; the holder's completion is fenced out and its charge rolled back with it,
/// so the key is charged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c11_processes_30s_apart_charge_once_on_the_transactional_path() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("skew.db");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("time")
        .as_millis() as u64;
    let behind = process(
        &db,
        ManualClock::new(idem_core::Timestamp::from_millis(now)),
    )
    .await;
    let ahead = process(
        &db,
        ManualClock::new(idem_core::Timestamp::from_millis(now + 30_000)),
    )
    .await;

    let Begin::Acquired(lease) = behind.begin(&request(&behind)).await.expect("begin") else {
        panic!("the first reservation acquires");
    };
    let taken = ahead
        .run_in_transaction(&request(&ahead), |tx, _| {
            tx.execute("INSERT INTO charges (intent) VALUES ('k-skew')", [])?;
            Ok::<_, rusqlite::Error>(StoredResponse::new(201, "ahead"))
        })
        .await;
    assert!(
        matches!(taken, Ok(Outcome::Executed(_))),
        "the process ahead took the lease over: {taken:?}"
    );
    let late = behind
        .complete_transaction(
            &lease,
            Box::new(
                |tx: &rusqlite::Transaction<'_>, _: &idem_core::store::Lease| {
                    tx.execute("INSERT INTO charges (intent) VALUES ('k-skew')", [])?;
                    Ok::<_, rusqlite::Error>(StoredResponse::new(201, "behind"))
                },
            ),
        )
        .await;
    assert!(
        matches!(late, Err(RunError::Idem(_))),
        "fenced out: {late:?}"
    );
    let charges: i64 = behind
        .store()
        .read(|db| db.query_row("SELECT COUNT(*) FROM charges", [], |r| r.get(0)))
        .await
        .expect("read")
        .expect("count");
    assert_eq!(charges, 1, "one charge");
}
