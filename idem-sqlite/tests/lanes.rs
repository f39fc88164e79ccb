//! The store's connection threads, from the application's side: what a user of the store sees
//! of the threads that own its connections (the runtime their work runs in, the engine's
//! observers called there, what a caller that gave up leaves behind, what dropping the last
//! handle closes, and that the answering connections never write).

mod common;

use common::{charges, with_charges};
use idem_core::{Answer, Event, Idempotency, Observer, Outcome, StoredResponse};
use idem_sqlite::{SqliteIdempotency, SqliteStore};
use std::path::Path;

async fn own_store(path: &Path) -> SqliteStore {
    let store = SqliteStore::builder(path)
        .readers(2)
        .open()
        .await
        .expect("open");
    with_charges(&store).await;
    store
}

/// Work handed to `call` runs inside the caller's Tokio runtime, as work on Tokio's blocking
/// pool does: a synchronous transaction may reach the runtime (`Handle::current()`, to spawn a
/// notification or `block_on` a small async step) without panicking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_work_runs_inside_the_callers_tokio_runtime() {
    let dir = tempfile::tempdir().expect("dir");
    let store = own_store(&dir.path().join("runtime.db")).await;
    let in_runtime = store
        .call(|_| tokio::runtime::Handle::try_current().is_ok())
        .await
        .expect("call");
    assert!(
        in_runtime,
        "work on the store's writer runs outside the caller's Tokio runtime"
    );
}

/// Hands every event to a task of the application's runtime (an exporter), as observers that
/// "hand off" do.
struct SpawnsOnTheRuntime;

impl Observer for SpawnsOnTheRuntime {
    fn observe(&self, event: &Event<'_>) {
        let kind = event.kind();
        tokio::spawn(async move {
            let _ = kind;
        });
    }
}

/// C8: an execution that acquired its key never leaves it in progress with nobody executing
/// it. The engine reports the acquisition from inside the store's transactional step; an
/// observer that hands its events to the runtime (`tokio::spawn`) must work there as on every
/// other step, else the reservation has committed and the execution dies before its effect:
/// the key is stuck "in flight" for the whole lease and the client's retry cannot run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c08_an_observer_that_spawns_on_the_runtime_never_strands_a_transactional_key() {
    let dir = tempfile::tempdir().expect("dir");
    let store = own_store(&dir.path().join("observer.db")).await;
    let idem = Idempotency::builder(store.clone())
        .observer(SpawnsOnTheRuntime)
        .build()
        .expect("engine");
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some("observed"))
        .body(b"{}")
        .build()
        .expect("request");
    let charge = |tx: &rusqlite::Transaction<'_>, _: &_| {
        tx.execute(
            "INSERT INTO charges (intent, cents) VALUES ('observed', 1)",
            [],
        )?;
        Ok::<_, rusqlite::Error>(StoredResponse::new(201, "charged"))
    };
    let (first_idem, first_request) = (idem.clone(), request.clone());
    let first = tokio::spawn(async move {
        first_idem
            .run_in_transaction(&first_request, charge)
            .await
            .map(|outcome| matches!(outcome, Outcome::Executed(_)))
            .map_err(|error| error.to_string())
    })
    .await;
    let retry = idem
        .run_in_transaction(&request, charge)
        .await
        .expect("the retry is answered");
    assert!(
        !matches!(retry, Outcome::Answered(Answer::InFlight { .. })),
        "the key is stranded in progress after the first attempt ended as {:?}",
        first
            .as_ref()
            .map_err(|e| if e.is_panic() { "a panic" } else { "cancelled" })
    );
    assert!(
        matches!(first, Ok(Ok(true))),
        "the first attempt did not execute: {:?}",
        first.as_ref().map_err(|e| e.is_panic())
    );
    assert!(
        matches!(retry, Outcome::Answered(Answer::Replay(_))),
        "{retry:?}"
    );
    assert_eq!(charges(&store, "observed").await, 1);
}

/// Dropping the last handle on the store closes its connections before the drop returns, as
/// dropping a `rusqlite::Connection` does: the last close checkpoints the WAL into the
/// database file and removes it, so the file alone is the whole database (to copy it as a
/// backup, move it, or remove it with its `-wal` and `-shm` files and start again on that
/// path without a connection of the old file closing later and deleting the new file's WAL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_handle_closes_the_connections_before_it_returns() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("closed.db");
    let store = own_store(&path).await;
    store
        .try_call(|db| db.execute("INSERT INTO charges (intent, cents) VALUES ('kept', 1)", []))
        .await
        .expect("insert");
    drop(store);
    let wal_left = dir.path().join("closed.db-wal").exists();
    // A backup of the closed database: the file alone.
    let copy = dir.path().join("copy.db");
    std::fs::copy(&path, &copy).expect("copy");
    let in_copy: rusqlite::Result<i64> = rusqlite::Connection::open(&copy)
        .expect("open the copy")
        .query_row(
            "SELECT count(*) FROM charges WHERE intent = 'kept'",
            [],
            |row| row.get(0),
        );
    assert!(
        !wal_left,
        "the store's connections were still open after its last handle was dropped"
    );
    assert_eq!(
        in_copy.ok(),
        Some(1),
        "the database file alone lacks a committed write"
    );
}

/// C13: while the writer is stuck (a frozen disk, a long transaction), callers give up at
/// their deadline and retry. What a caller that gave up handed to the store (its closure, a
/// reservation's request and body) is released when it gives up, as a dropped wait for the
/// writer was before: the queue of a stuck writer does not grow with every retry until the
/// process runs out of memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_work_whose_caller_gave_up_is_released_at_once_not_when_the_writer_frees() {
    let dir = tempfile::tempdir().expect("dir");
    let store = own_store(&dir.path().join("abandoned.db")).await;
    let holder = store.clone();
    let held = tokio::spawn(async move {
        holder
            .call(|_| std::thread::sleep(std::time::Duration::from_millis(1500)))
            .await
            .expect("held")
    });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    // Stands for what each request carries (its body, up to the 1 MiB limit).
    let payload = std::sync::Arc::new(vec![0_u8; 1024]);
    let mut gave_up = 0;
    for _ in 0..200 {
        let carried = std::sync::Arc::clone(&payload);
        let call = store.call(move |_| carried.len());
        if tokio::time::timeout(std::time::Duration::from_millis(2), call)
            .await
            .is_err()
        {
            gave_up += 1;
        }
    }
    let still_held = std::sync::Arc::strong_count(&payload) - 1;
    assert!(!held.is_finished(), "the writer was freed before the check");
    assert_eq!(gave_up, 200, "calls were answered behind a stuck writer");
    // The queue lets go of abandoned work each time it doubles (from 64 on), so what it holds
    // is bounded by what somebody still waits for, never by the number of retries.
    assert!(
        still_held < 64,
        "{still_held} abandoned calls are still held by the store's queue"
    );
    held.await.expect("holder");
}

/// C5: replays and in-flight answers are read on connections no writer holds. The
/// application's own reads share those connections (`SqliteStore::read`): a statement there
/// that writes must be refused, else a reader holds SQLite's write lock (and, inside a
/// transaction, keeps it for as long as the work runs) while answers queue behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c05_the_applications_reads_cannot_write_on_the_answering_connections() {
    let dir = tempfile::tempdir().expect("dir");
    let store = own_store(&dir.path().join("reads.db")).await;
    let written = store
        .read(|db| {
            db.execute(
                "INSERT INTO charges (intent, cents) VALUES ('on-a-reader', 1)",
                [],
            )
        })
        .await
        .expect("the read ran");
    assert!(
        written.is_err(),
        "a reader connection wrote {written:?} row(s)"
    );
    assert_eq!(charges(&store, "on-a-reader").await, 0);
}

/// Panics once, at the first acquisition it sees (an application's observer with a bug).
struct PanicsAtTheFirstAcquisition(std::sync::atomic::AtomicBool);

impl Observer for PanicsAtTheFirstAcquisition {
    fn observe(&self, event: &Event<'_>) {
        if event.kind() == idem_core::EventKind::Acquired
            && !self.0.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            panic!("an observer panics");
        }
    }
}

/// C8: a panic in the engine's own step right after the reservation committed (an observer
/// of the application's that panics at "acquired") ends nothing silently: the effect never
/// ran, the key is given back, the panic reaches the caller, and the retry executes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c08_a_panic_after_the_reservation_gives_the_key_back_and_the_retry_runs_once() {
    let dir = tempfile::tempdir().expect("dir");
    let store = own_store(&dir.path().join("panics.db")).await;
    let idem = Idempotency::builder(store.clone())
        .observer(PanicsAtTheFirstAcquisition(Default::default()))
        .build()
        .expect("engine");
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some("panicked"))
        .body(b"{}")
        .build()
        .expect("request");
    let charge = |tx: &rusqlite::Transaction<'_>, _: &_| {
        tx.execute(
            "INSERT INTO charges (intent, cents) VALUES ('panicked', 1)",
            [],
        )?;
        Ok::<_, rusqlite::Error>(StoredResponse::new(201, "charged"))
    };
    let (first_idem, first_request) = (idem.clone(), request.clone());
    let first = tokio::spawn(async move {
        let _ = first_idem.run_in_transaction(&first_request, charge).await;
    })
    .await;
    assert!(first.expect_err("the panic").is_panic());
    assert_eq!(charges(&store, "panicked").await, 0, "the effect ran");
    let retry = idem
        .run_in_transaction(&request, charge)
        .await
        .expect("the retry is answered");
    assert!(matches!(retry, Outcome::Executed(_)), "{retry:?}");
    assert_eq!(charges(&store, "panicked").await, 1);
}
