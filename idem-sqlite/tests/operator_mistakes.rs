//! An operator's mistakes on a running store's files (C4, C12, C13): the database file or its
//! `-wal` deleted or replaced while a store has them open. A store whose path no longer names
//! the file it opened refuses to reserve with a typed error instead of executing a key on a
//! file no other process sees, so a key never runs once in each of two databases.

mod common;

use idem_core::{Idempotency, Outcome, Policy, RunError, StoredResponse};
use idem_sqlite::{rusqlite, SqliteIdempotency, SqliteStore};
use std::path::Path;
use std::time::Duration;

async fn opened(db: &Path) -> Idempotency<SqliteStore> {
    let store = SqliteStore::open(db).await.expect("open");
    common::with_intent_charges(&store).await;
    Idempotency::with_policy(
        store,
        Policy::default().store_timeout(Duration::from_secs(2)),
    )
    .expect("policy")
}

async fn charge(
    idem: &Idempotency<SqliteStore>,
    key: &str,
) -> Result<Outcome, RunError<rusqlite::Error>> {
    let request = idem
        .request("acct_ops", "POST", "/charges")
        .key(Some(key))
        .body(b"{\"cents\":100}")
        .build()
        .expect("request");
    let intent = key.to_owned();
    idem.run_in_transaction(&request, move |tx, _lease| {
        tx.execute("INSERT INTO charges (intent) VALUES (?1)", [&intent])?;
        Ok::<_, rusqlite::Error>(StoredResponse::new(201, "charged"))
    })
    .await
}

fn remove(db: &Path, suffixes: &[&str]) {
    for suffix in suffixes {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        let _ = std::fs::remove_file(&name);
    }
}

/// A key is executed at most once across the stores that share a path (C4): after the file a
/// store opened was deleted and a new one created at its path, the old store answers a typed
/// error, never a fresh execution on a database nobody else sees.
async fn at_most_once_after(db: &Path, suffixes: &[&str]) {
    let old = opened(db).await;
    assert!(matches!(
        charge(&old, "before").await,
        Ok(Outcome::Executed(_))
    ));
    remove(db, suffixes);
    let new = opened(db).await;
    assert!(matches!(charge(&new, "k").await, Ok(Outcome::Executed(_))));
    let again = charge(&old, "k").await;
    match again {
        Ok(Outcome::Executed(_)) => panic!("the key ran a second time on the removed file"),
        Err(RunError::Idem(error)) => {
            assert!(error.as_store().is_some(), "a store error: {error}");
        }
        other => panic!("unexpected: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c04_c13_a_database_file_deleted_while_open_never_runs_a_key_twice() {
    let dir = tempfile::tempdir().expect("dir");
    at_most_once_after(&dir.path().join("gone.db"), &["", "-wal", "-shm"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c04_c13_a_database_file_deleted_without_its_wal_never_runs_a_key_twice() {
    let dir = tempfile::tempdir().expect("dir");
    at_most_once_after(&dir.path().join("gone.db"), &[""]).await;
}

/// A file restored over a running store's (a copy renamed onto its path) is another file: the
/// running store refuses to reserve on the one it had open (C4, C13).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c04_c13_a_database_file_replaced_while_open_never_runs_a_key_twice() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("replaced.db");
    let copy = dir.path().join("copy.db");
    let old = opened(&db).await;
    assert!(matches!(
        charge(&old, "before").await,
        Ok(Outcome::Executed(_))
    ));
    std::fs::copy(&db, &copy).expect("copy");
    std::fs::rename(&copy, &db).expect("rename over");
    let outcome = charge(&old, "k").await;
    assert!(
        matches!(&outcome, Err(RunError::Idem(e)) if e.as_store().is_some()),
        "{outcome:?}"
    );
}

/// A running store whose `-wal` was deleted refuses to write on (C13): its commits would land
/// in a file no process opening the path reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_wal_deleted_while_open_is_a_store_error() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("wal.db");
    let old = opened(&db).await;
    assert!(matches!(
        charge(&old, "before").await,
        Ok(Outcome::Executed(_))
    ));
    remove(&db, &["-wal"]);
    let outcome = charge(&old, "k").await;
    assert!(
        matches!(&outcome, Err(RunError::Idem(e)) if e.as_store().is_some()),
        "{outcome:?}"
    );
}

const SHM_ENV: &str = "IDEM_SQLITE_SHM_CHILD";

/// The child of the `-shm` test: another process that opens the path, charges `k` and says
/// what it answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of the -shm test"]
async fn shm_child() {
    let db = std::path::PathBuf::from(std::env::var(SHM_ENV).expect("run by the test"));
    let idem = opened(&db).await;
    let outcome = charge(&idem, "k").await;
    println!("CHILD {}", matches!(outcome, Ok(Outcome::Executed(_))));
}

/// The `-shm` alone deleted under a running process (C4, C13): another process opening the
/// path makes a new one, whose locks and index the running process does not share, and runs a
/// key there; the running process then refuses to write rather than run that key again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c04_c13_a_shm_deleted_while_open_never_runs_a_key_twice() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("shm.db");
    let old = opened(&db).await;
    assert!(matches!(
        charge(&old, "before").await,
        Ok(Outcome::Executed(_))
    ));
    remove(&db, &["-shm"]);
    let child = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--ignored",
            "--exact",
            "shm_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(SHM_ENV, &db)
        .stderr(std::process::Stdio::null())
        .output()
        .expect("child");
    let said = String::from_utf8_lossy(&child.stdout);
    assert!(
        said.contains("CHILD true"),
        "the other process ran k: {said}"
    );
    let again = charge(&old, "k").await;
    assert!(
        matches!(&again, Err(RunError::Idem(e)) if e.as_store().is_some()),
        "the running process must not run k again: {again:?}"
    );
}
