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
