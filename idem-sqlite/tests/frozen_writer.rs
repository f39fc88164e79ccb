//! Another process frozen with SQLite's write lock (SIGSTOP in the middle of its effect's
//! transaction), as a payments team's workers share one file (C13, C5, C9).

use idem_core::{Answer, Begin, Failure, Idempotency, Outcome, Policy, RunError, StoredResponse};
use idem_sqlite::{rusqlite, SqliteStore};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "IDEM_SQLITE_FROZEN_CHILD";

/// The child: a worker in the middle of its effect's transaction (`BEGIN IMMEDIATE`, a write),
/// which then freezes (the parent sends SIGSTOP) with the write lock held.
#[test]
#[ignore = "child process of the frozen-writer tests"]
fn frozen_writer_child() {
    let db = std::env::var(CHILD_ENV).expect("run by the frozen-writer tests");
    let conn = rusqlite::Connection::open(db).expect("open");
    conn.execute_batch("BEGIN IMMEDIATE; CREATE TABLE IF NOT EXISTS business (v INTEGER); INSERT INTO business VALUES (1);")
        .expect("write lock");
    println!("READY");
    std::thread::sleep(Duration::from_secs(120));
}

/// Starts the child, waits until it holds the write lock, and freezes it.
fn frozen_worker(db: &Path) -> Child {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--ignored",
            "--exact",
            "frozen_writer_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, db)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn");
    let out = child.stdout.take().expect("stdout");
    let ready = BufReader::new(out)
        .lines()
        .map_while(Result::ok)
        .any(|line| line.ends_with("READY"));
    assert!(ready, "the child did not take the write lock");
    signal(&child, "-STOP");
    child
}

fn signal(child: &Child, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// C13, C9: a reservation that the store budget cut off (503: the store was unavailable, nothing
/// ran) must not land afterwards. The reservation's statement waits for the frozen worker's
/// write lock for the store's whole busy timeout (5 s), not for what is left of the request's
/// budget (1 s, as `run_in_transaction` does): when the worker thaws within those 5 s, the
/// reservation nobody waits for any more commits, and the key the client was told is free
/// answers 409 "in flight" to every retry until the lease passes (here 30 s; 60 s by default),
/// with no execution behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_reservation_cut_off_by_the_budget_does_not_land_after_its_503() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("frozen.db");
    let store = SqliteStore::open(&db).await.expect("open");
    let policy = Policy::default()
        .store_timeout(Duration::from_secs(1))
        .lease(Duration::from_secs(30));
    let idem = Idempotency::with_policy(store, policy).expect("policy");
    let request = idem
        .request("acct_frozen", "POST", "/charges")
        .key(Some("k-frozen"))
        .body(b"{\"cents\":100}")
        .build()
        .expect("request");
    let ran = Arc::new(AtomicUsize::new(0));

    let mut worker = frozen_worker(&db);
    let charge = |ran: Arc<AtomicUsize>| {
        move |_ctx| async move {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "charged"))
        }
    };
    let started = Instant::now();
    let first = idem.run(&request, charge(Arc::clone(&ran))).await;
    let took = started.elapsed();
    assert!(
        matches!(&first, Err(RunError::Idem(e)) if e.is_retryable()),
        "the store is unavailable: {first:?}"
    );
    assert!(
        took < Duration::from_millis(1500),
        "503 within the budget: {took:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0, "nothing ran");

    // The frozen worker thaws 2 s later (its transaction then ends): the store is back.
    tokio::time::sleep(Duration::from_secs(2)).await;
    signal(&worker, "-CONT");
    let _ = worker.kill();
    let _ = worker.wait();
    tokio::time::sleep(Duration::from_secs(3)).await;

    // The client retries its 503 once the store answers again.
    let retry = idem.run(&request, charge(Arc::clone(&ran))).await;
    let record = idem.begin(&request).await.map(|b| match b {
        Begin::Acquired(_) => "acquired".to_owned(),
        other => format!("{other:?}").chars().take(60).collect(),
    });
    assert!(
        matches!(retry, Ok(Outcome::Executed(_))),
        "after a 503 and the store's recovery the retry runs, got {:?} (nothing ran: {} \
         executions; a reservation nobody holds landed after the 503; begin now: {record:?})",
        retry
            .as_ref()
            .map(|o| matches!(o, Outcome::Answered(Answer::InFlight { .. }))),
        ran.load(Ordering::SeqCst),
    );
}

/// Holds SQLite's write lock from another connection (another worker's transaction) for `for_`,
/// once `go` is called; `go` returns when the lock is held.
struct Rival {
    db: std::path::PathBuf,
    for_: Duration,
}

impl Rival {
    fn take(&self) {
        let (held, is_held) = std::sync::mpsc::channel();
        let (db, for_) = (self.db.clone(), self.for_);
        std::thread::spawn(move || {
            let conn = rusqlite::Connection::open(db).expect("open");
            conn.busy_timeout(Duration::from_secs(10)).expect("busy");
            conn.execute_batch("BEGIN IMMEDIATE; INSERT INTO business VALUES (2);")
                .expect("write lock");
            held.send(()).expect("held");
            std::thread::sleep(for_);
            conn.execute_batch("COMMIT").expect("commit");
        });
        is_held.recv().expect("the rival holds the lock");
    }
}

/// Another worker takes the write lock again at the moment this one's reservation has
/// committed (an observer of `acquired` widens that window, which is otherwise a few
/// microseconds wide between the reservation's commit and the effect's `BEGIN IMMEDIATE`).
struct TakesTheLockOnAcquired(Arc<Rival>);

impl idem_core::Observer for TakesTheLockOnAcquired {
    fn observe(&self, event: &idem_core::Event<'_>) {
        if event.kind() == idem_core::EventKind::Acquired {
            self.0.take();
        }
    }
}

/// C13: one budget per request, counted across every store step. Another process holds the
/// write lock for 0.8 s before the reservation and takes it again the moment the reservation
/// commits: the effect's `BEGIN IMMEDIATE` waits only what the reservation left of the 1 s
/// budget, and the release after it what is left then (not, as each once did, a budget of its
/// own: about 2.8 s in all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_run_in_transaction_spends_its_budget_once_across_reservation_and_begin() {
    use idem_sqlite::SqliteIdempotency;
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("budget.db");
    let store = SqliteStore::open(&db).await.expect("open");
    store
        .try_call(|db| db.execute_batch("CREATE TABLE business (v INTEGER)"))
        .await
        .expect("business");
    let budget = Duration::from_secs(1);
    let rival = Arc::new(Rival {
        db: db.clone(),
        for_: Duration::from_secs(4),
    });
    let idem = Idempotency::builder(store)
        .policy(
            Policy::default()
                .store_timeout(budget)
                .lease(Duration::from_secs(30)),
        )
        .observer(TakesTheLockOnAcquired(Arc::clone(&rival)))
        .build()
        .expect("engine");
    // A frozen worker holds the lock for 0.8 s: the reservation waits most of the budget.
    let first = Rival {
        db: db.clone(),
        for_: Duration::from_millis(800),
    };
    first.take();
    let request = idem
        .request("acct_budget", "POST", "/charges")
        .key(Some("k-budget"))
        .body(b"{}")
        .build()
        .expect("request");
    let started = Instant::now();
    let outcome = idem
        .run_in_transaction(&request, |tx, _| {
            tx.execute("INSERT INTO business VALUES (3)", [])?;
            Ok::<_, rusqlite::Error>(StoredResponse::new(201, "charged"))
        })
        .await;
    let took = started.elapsed();
    assert!(
        // 2.8 s when each wait had the whole budget; room for a loaded machine.
        took < budget + Duration::from_millis(800),
        "answered {:?} after {took:?}, past the 1 s store budget",
        outcome.map(|_| ()).map_err(|e| e.to_string())
    );
}
