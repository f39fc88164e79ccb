//! The store's connections: no caller sees another's unfinished transaction (C6, C12), and an
//! answer that writes nothing never waits behind a writer (C5).

mod common;

use common::{charges, with_charges};
use idem_core::{Answer, Begin, Failure, Idempotency, Outcome, Policy, StoredResponse};
use idem_sqlite::{SqliteIdempotency, SqliteStore};
use std::time::{Duration, Instant};

async fn own_store(dir: &tempfile::TempDir) -> SqliteStore {
    let store = SqliteStore::builder(dir.path().join("pool.db"))
        .readers(1)
        .open()
        .await
        .expect("open");
    with_charges(&store).await;
    store
}

fn count_elsewhere(store: &SqliteStore, sql: &str) -> i64 {
    store
        .connect()
        .expect("connect")
        .query_row(sql, [], |r| r.get(0))
        .expect("count")
}

/// A caller's batch that fails half-way leaves its transaction open on the connection. The
/// next caller must neither read that uncommitted write nor have its own completion swallowed
/// by it: a client must never be told "completed" for a record that is not on disk.
#[tokio::test]
async fn c06_a_connection_left_inside_a_transaction_is_rolled_back_before_reuse() {
    let dir = tempfile::tempdir().expect("dir");
    let store = own_store(&dir).await;
    let half_done = store
        .call(|db| {
            db.execute_batch(
                "BEGIN; INSERT INTO charges (intent, cents) VALUES ('half', 1); INSERT INTO nowhere VALUES (1);",
            )
        })
        .await
        .expect("call");
    assert!(half_done.is_err(), "the batch fails half-way");
    assert_eq!(
        charges(&store, "half").await,
        0,
        "uncommitted data was read"
    );

    let idem = Idempotency::new(store.clone());
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some("after-dirty"))
        .body(b"{}")
        .build()
        .expect("request");
    let outcome = idem
        .run(&request, |_| async {
            Ok::<_, Failure<String>>(StoredResponse::new(201, "charged"))
        })
        .await
        .expect("run");
    assert!(matches!(outcome, Outcome::Executed(_)));
    // What the client was told is on disk: another connection sees the completion.
    assert_eq!(
        count_elsewhere(
            &store,
            "SELECT COUNT(*) FROM idem_records WHERE key = 'after-dirty' AND state = 1"
        ),
        1
    );
    assert_eq!(
        count_elsewhere(&store, "SELECT COUNT(*) FROM charges WHERE intent = 'half'"),
        0
    );
    // And the writer still opens transactions of its own.
    let committed = idem
        .run_in_transaction(
            &idem
                .request("acct", "POST", "/charges")
                .key(Some("tx-after-dirty"))
                .body(b"{}")
                .build()
                .expect("request"),
            |tx, _| {
                tx.execute(
                    "INSERT INTO charges (intent, cents) VALUES ('clean', 1)",
                    [],
                )?;
                Ok::<_, rusqlite::Error>(StoredResponse::new(201, "ok"))
            },
        )
        .await
        .expect("run_in_transaction");
    assert!(matches!(committed, Outcome::Executed(_)));
    assert_eq!(
        count_elsewhere(
            &store,
            "SELECT COUNT(*) FROM charges WHERE intent = 'clean'"
        ),
        1
    );
}

/// While writers are busy (eight effects holding the write lock in turn, and another process's
/// connection holding it too), a duplicate of an in-flight request, a replay and a mismatch are
/// answered at once, not after the writers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c05_answers_never_wait_behind_writers() {
    let dir = tempfile::tempdir().expect("dir");
    let store = own_store(&dir).await;
    let idem = Idempotency::with_policy(
        store.clone(),
        Policy::default().lease(Duration::from_secs(30)),
    )
    .expect("policy");
    let request = |key: &str, body: &[u8]| {
        idem.request("acct", "POST", "/charges")
            .key(Some(key))
            .body(body)
            .build()
            .expect("request")
    };
    let held = request("held", b"{}");
    let Begin::Acquired(_lease) = idem.begin(&held).await.expect("begin") else {
        panic!("fresh");
    };
    let done = request("done", b"{}");
    let outcome = idem
        .run_in_transaction(&done, |_, _| {
            Ok::<_, rusqlite::Error>(StoredResponse::new(201, "done"))
        })
        .await
        .expect("run");
    assert!(matches!(outcome, Outcome::Executed(_)));

    // Eight slow business transactions queue for the writer, 150 ms each.
    let writers: Vec<_> = (0..8)
        .map(|i| {
            let idem = idem.clone();
            let req = request(&format!("slow-{i}"), b"{}");
            tokio::spawn(async move {
                idem.run_in_transaction(&req, |_, _| {
                    std::thread::sleep(Duration::from_millis(150));
                    Ok::<_, rusqlite::Error>(StoredResponse::new(201, "slow"))
                })
                .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(30)).await;
    let answers = [
        (held.clone(), "in flight"),
        (done.clone(), "replay"),
        (request("done", b"other body"), "mismatch"),
    ];
    for (req, expect) in &answers {
        answered_at_once(&idem, req, expect, "queued writers").await;
    }
    for writer in writers {
        assert!(matches!(
            writer.await.expect("task").expect("run"),
            Outcome::Executed(_)
        ));
    }

    // Another process's connection takes SQLite's write lock and keeps it.
    let mut foreign = store.connect().expect("connect");
    let foreign_tx = foreign
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .expect("write lock");
    for (req, expect) in &answers {
        answered_at_once(&idem, req, expect, "another process's write lock").await;
    }
    drop(foreign_tx);
}

async fn answered_at_once(
    idem: &Idempotency<SqliteStore>,
    req: &idem_core::Request,
    expect: &str,
    behind: &str,
) {
    let started = Instant::now();
    let answer = idem.begin(req).await.expect("begin");
    let waited = started.elapsed();
    let ok = matches!(
        (&answer, expect),
        (Begin::Answered(Answer::InFlight { .. }), "in flight")
            | (Begin::Answered(Answer::Replay(_)), "replay")
            | (Begin::Answered(Answer::Mismatch), "mismatch")
    );
    assert!(ok, "expected {expect}, got {answer:?}");
    assert!(
        waited < Duration::from_millis(100),
        "{expect} waited {waited:?} behind {behind}"
    );
}

/// Holds the writer's thread for `for_` with a call of the application's own.
fn hold_the_writer(store: &SqliteStore, for_: Duration) -> tokio::task::JoinHandle<()> {
    let store = store.clone();
    tokio::spawn(async move {
        store
            .call(move |_| std::thread::sleep(for_))
            .await
            .expect("held");
    })
}

/// A call whose caller gave up (its future dropped) before the writer reached it is not run
/// later behind the caller's back: an application's timeout around `call` means "not done".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_before_it_started_never_runs() {
    let dir = tempfile::tempdir().expect("dir");
    let store = own_store(&dir).await;
    let held = hold_the_writer(&store, Duration::from_millis(300));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let given_up = tokio::time::timeout(
        Duration::from_millis(50),
        store.try_call(|db| {
            db.execute("INSERT INTO charges (intent, cents) VALUES ('late', 1)", [])
        }),
    )
    .await;
    assert!(
        given_up.is_err(),
        "the call was still queued behind the writer"
    );
    held.await.expect("holder");
    // Anything queued after it has run once the writer is free.
    store.call(|_| ()).await.expect("a later call");
    assert_eq!(charges(&store, "late").await, 0, "a dropped call ran");
}

/// C13: a transactional request queued behind the store's own writer for longer than the
/// policy's store timeout is answered at the deadline, and it is not run afterwards: its effect
/// never happens, its key stays free, and the client's retry executes it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_transaction_still_queued_at_the_store_timeout_is_answered_and_never_runs() {
    let dir = tempfile::tempdir().expect("dir");
    let store = own_store(&dir).await;
    let idem = Idempotency::with_policy(
        store.clone(),
        Policy::default().store_timeout(Duration::from_millis(200)),
    )
    .expect("policy");
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some("queued"))
        .body(b"{}")
        .build()
        .expect("request");
    let charge = |tx: &rusqlite::Transaction<'_>, _: &_| {
        tx.execute(
            "INSERT INTO charges (intent, cents) VALUES ('queued', 1)",
            [],
        )?;
        Ok::<_, rusqlite::Error>(StoredResponse::new(201, "charged"))
    };
    let held = hold_the_writer(&store, Duration::from_millis(800));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let started = Instant::now();
    let answered = idem.run_in_transaction(&request, charge).await;
    let waited = started.elapsed();
    assert!(
        answered.is_err(),
        "answered {answered:?} behind a busy writer"
    );
    assert!(
        waited < Duration::from_millis(600),
        "answered after {waited:?}, not at the store timeout"
    );
    held.await.expect("holder");
    store.call(|_| ()).await.expect("a later call");
    assert_eq!(charges(&store, "queued").await, 0, "the effect ran late");
    let retried = idem
        .run_in_transaction(&request, charge)
        .await
        .expect("retry");
    assert!(matches!(retried, Outcome::Executed(_)), "{retried:?}");
    assert_eq!(charges(&store, "queued").await, 1);
}

/// A panic in the application's work reaches its caller, and the connection's thread goes on
/// serving the next calls (the store does not lose its writer).
#[tokio::test]
async fn a_panic_in_a_call_reaches_the_caller_and_the_writer_serves_on() {
    let dir = tempfile::tempdir().expect("dir");
    let store = own_store(&dir).await;
    let panicking = store.clone();
    let joined = tokio::spawn(async move {
        panicking
            .call(|db| {
                db.execute_batch("BEGIN; INSERT INTO charges (intent, cents) VALUES ('p', 1);")
                    .expect("batch");
                panic!("the application's work panics");
            })
            .await
    })
    .await;
    assert!(joined.expect_err("the panic").is_panic());
    // The half-done transaction was rolled back, and the writer still writes.
    store
        .try_call(|db| {
            db.execute(
                "INSERT INTO charges (intent, cents) VALUES ('after', 1)",
                [],
            )
        })
        .await
        .expect("the next call");
    assert_eq!(charges(&store, "p").await, 0);
    assert_eq!(charges(&store, "after").await, 1);
}
