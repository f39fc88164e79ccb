//! A store that cannot be written for longer than the lease after the effect (C8): another
//! connection holds SQLite's write lock. The execution keeps trying to complete, fenced, past
//! the lease and past its caller's answer; a retry meanwhile is answered in flight; once the
//! lock is gone the completion lands and the retry replays. One effect.

use idem_core::{Answer, Begin, Failure, Idempotency, Outcome, Policy, RunError, StoredResponse};
use idem_sqlite::rusqlite::{Connection, TransactionBehavior};
use idem_sqlite::SqliteStore;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const LEASE: Duration = Duration::from_millis(300);
/// How long the other connection holds the write lock once the effect ran.
const LOCKED: Duration = Duration::from_millis(1500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c08_a_write_lock_held_past_the_lease_never_turns_into_a_second_execution() {
    let dir = tempfile::tempdir().expect("a directory");
    let path = dir.path().join("shop.db");
    let store = SqliteStore::builder(&path)
        .busy_timeout(Duration::from_millis(50))
        .open()
        .await
        .expect("open");
    let policy = Policy::default()
        .lease(LEASE)
        .store_timeout(Duration::from_millis(500));
    let idem = Idempotency::with_policy(store, policy).expect("policy");
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some("locked-out"))
        .body(b"{}")
        .build()
        .expect("valid");
    // Another connection to the file takes the write lock when asked, and holds it.
    let (lock, locked) = (mpsc::channel::<()>(), mpsc::channel::<()>());
    let (take_lock, has_lock) = (lock.0, locked.1);
    let (lock_wanted, lock_taken) = (lock.1, locked.0);
    let locker = std::thread::spawn(move || {
        let mut other = Connection::open(&path).expect("open");
        lock_wanted.recv().expect("asked");
        let tx = other
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .expect("the write lock");
        lock_taken.send(()).expect("told");
        std::thread::sleep(LOCKED);
        drop(tx);
    });
    let effects = Arc::new(AtomicUsize::new(0));
    let run = |effects: Arc<AtomicUsize>, lock: Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>| {
        let (idem, request) = (idem.clone(), request.clone());
        async move {
            idem.run(&request, move |_| async move {
                effects.fetch_add(1, Ordering::SeqCst);
                if let Some((take_lock, has_lock)) = lock {
                    // The effect ran; now the store cannot be written.
                    take_lock.send(()).expect("ask");
                    has_lock.recv().expect("locked");
                }
                Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "charged"))
            })
            .await
        }
    };
    let started = Instant::now();
    let first = run(Arc::clone(&effects), Some((take_lock, has_lock))).await;
    assert!(
        matches!(first, Err(RunError::Incomplete(ref e)) if e.is_retryable()),
        "{first:?}"
    );
    assert!(
        started.elapsed() < LOCKED,
        "the caller is answered within the lease"
    );
    // Past the lease, while the lock is still held: a retry is in flight, never run again.
    tokio::time::sleep(LEASE).await;
    let retry = run(Arc::clone(&effects), None).await.expect("answered");
    assert!(
        matches!(retry, Outcome::Answered(Answer::InFlight { .. })),
        "{retry:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    locker.join().expect("locker");
    // The lock is gone: the completion lands on its own, and the retry replays it.
    let until = Instant::now() + Duration::from_secs(5);
    let replayed = loop {
        if let Ok(Begin::Answered(Answer::Replay(stored))) = idem.begin(&request).await {
            break stored;
        }
        assert!(Instant::now() < until, "the completion never landed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(replayed.body, b"charged");
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    idem.shutdown().await;
}
