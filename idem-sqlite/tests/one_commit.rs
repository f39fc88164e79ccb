//! The one-commit mode on SQLite (C15): reservation, effect and completion in one transaction,
//! duplicates still answered at once (C5), and the table held by one store alone.

mod common;

use common::{charges, with_charges};
use idem_core::store::Deadline;
use idem_core::store::{Lease, StoreExt};
use idem_core::testing::Elsewhere;
use idem_core::{
    Answer, Begin, Idempotency, Outcome, Policy, Request, RunError, Store, StoreErrorKind,
    StoredResponse,
};
use idem_sqlite::{SqliteIdempotency, SqliteStore};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn one_commit_store(path: &Path) -> SqliteStore {
    let store = SqliteStore::builder(path)
        .readers(2)
        .one_commit(true)
        .open()
        .await
        .expect("open for one commit");
    with_charges(&store).await;
    store
}

/// A store for two commits on the same file as a one-commit store, on a table of its own.
async fn two_commit_beside(path: &Path) -> SqliteStore {
    SqliteStore::builder(path)
        .table("two_commit_records")
        .open()
        .await
        .expect("a table for two commits")
}

fn request<S: Store>(idem: &Idempotency<S>, key: &str, body: &[u8]) -> Request {
    idem.request("acct_one", "POST", "/charges")
        .key(Some(key))
        .body(body)
        .build()
        .expect("request")
}

/// The kind of a store error, `None` for any other error.
fn store_kind(error: &idem_core::Error) -> Option<StoreErrorKind> {
    match error {
        idem_core::Error::Store(store) => Some(store.kind()),
        _ => None,
    }
}

fn charge(tx: &rusqlite::Transaction<'_>, intent: &str) -> Result<StoredResponse, rusqlite::Error> {
    tx.execute(
        "INSERT INTO charges (intent, cents) VALUES (?1, 100)",
        [intent],
    )?;
    Ok(StoredResponse::new(201, "charged"))
}

/// C5, C15: a duplicate that arrives while the one-commit execution is still queued for the
/// writer (before it reserved anything) is answered in flight at once, and one with another
/// body mismatch; neither queues behind the execution's transaction. The engine's claim is what
/// answers them: the store has nothing committed to show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c05_a_duplicate_of_an_execution_queued_for_the_writer_is_answered_at_once() {
    let dir = tempfile::tempdir().expect("dir");
    let store = one_commit_store(&dir.path().join("queued.db")).await;
    let idem = Idempotency::with_policy(store.clone(), Policy::default()).expect("policy");
    // The writer is busy: the execution queues behind this.
    let busy = store.clone();
    let hold = tokio::spawn(async move {
        busy.call(|_| std::thread::sleep(Duration::from_millis(2500)))
            .await
            .expect("hold the writer");
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let first_request = request(&idem, "k", b"{\"cents\":100}");
    let (engine, owned) = (idem.clone(), first_request.clone());
    let first = tokio::spawn(async move {
        engine
            .run_in_transaction(&owned.clone().with_one_commit(true), |tx, _| {
                charge(tx, "queued")
            })
            .await
    });
    // Time for the execution to claim its record and queue (a loaded machine included).
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = Instant::now();
    let duplicate = idem.begin(&request(&idem, "k", b"{\"cents\":100}")).await;
    let mismatch = idem
        .run_in_transaction(
            &request(&idem, "k", b"{\"cents\":999}").with_one_commit(true),
            |tx, _| charge(tx, "queued"),
        )
        .await;
    let took = started.elapsed();
    assert!(
        matches!(duplicate, Ok(Begin::Answered(Answer::InFlight { .. }))),
        "{duplicate:?}"
    );
    assert!(
        matches!(mismatch, Ok(Outcome::Answered(Answer::Mismatch))),
        "{mismatch:?}"
    );
    assert!(
        took < Duration::from_millis(1000),
        "the duplicates waited for the writer: {took:?}"
    );
    hold.await.expect("holder");
    let first = first.await.expect("first");
    assert!(matches!(first, Ok(Outcome::Executed(_))), "{first:?}");
    assert_eq!(charges(&store, "queued").await, 1);
    let replay = idem.begin(&first_request).await;
    assert!(
        matches!(replay, Ok(Begin::Answered(Answer::Replay(_)))),
        "{replay:?}"
    );
}

/// C15: a store opened for one commit holds its table alone. A second store opened for one
/// commit on the same table is refused, and a store opened for two commits is refused its
/// first reservation (it could not see the uncommitted ones); one that only reads and lists
/// still works. Another table of the same file is free. Once the store is dropped, the table
/// is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c15_a_store_opened_for_one_commit_holds_its_table_alone() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("alone.db");
    let store = one_commit_store(&path).await;
    let idem = Idempotency::new(store.clone());
    let req = request(&idem, "alone", b"{}");

    let again = SqliteStore::builder(&path).one_commit(true).open().await;
    let Err(refused) = again else {
        panic!("a second store opened for one commit on the same table");
    };
    assert_eq!(store_kind(&refused), Some(StoreErrorKind::Misconfigured));

    let two = SqliteStore::open(&path)
        .await
        .expect("open for two commits");
    let reserved = two
        .reservation(&req, Duration::from_secs(5), Deadline::default())
        .await;
    let Err(refused) = reserved else {
        panic!("a store for two commits reserved in a table held for one: {reserved:?}");
    };
    assert_eq!(store_kind(&refused), Some(StoreErrorKind::Misconfigured));
    assert!(two
        .lookup(req.id(), Deadline::default())
        .await
        .expect("reads work")
        .is_none());

    let other_table = SqliteStore::builder(&path)
        .table("other_records")
        .open()
        .await
        .expect("another table");
    assert!(matches!(
        other_table
            .reservation(&req, Duration::from_secs(5), Deadline::default())
            .await,
        Ok(Begin::Acquired(_))
    ));

    drop(idem);
    drop(store);
    let reopened = SqliteStore::builder(&path).one_commit(true).open().await;
    // `two` has not reserved, so it holds nothing: the table is free.
    assert!(reopened.is_ok(), "{reopened:?}");
}

/// C15: a store that has reserved for two commits keeps a store for one commit off its table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c15_a_table_reserved_in_for_two_commits_cannot_be_opened_for_one() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("shared.db");
    let two = SqliteStore::open(&path).await.expect("open");
    let idem = Idempotency::new(two.clone());
    let begun = idem.begin(&request(&idem, "k", b"{}")).await;
    assert!(matches!(begun, Ok(Begin::Acquired(_))), "{begun:?}");
    let one = SqliteStore::builder(&path).one_commit(true).open().await;
    let Err(refused) = one else {
        panic!("opened for one commit while another store reserves in the table");
    };
    assert_eq!(store_kind(&refused), Some(StoreErrorKind::Misconfigured));
}

/// C15: a one-commit execution on a store not opened for it is refused before anything runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c15_one_commit_on_a_store_not_opened_for_it_is_refused_and_runs_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let store = SqliteStore::open(dir.path().join("two.db"))
        .await
        .expect("open");
    with_charges(&store).await;
    let idem = Idempotency::with_policy(store.clone(), Policy::default().one_commit(true))
        .expect("policy");
    let req = request(&idem, "k", b"{}");
    let outcome = idem
        .run_in_transaction(&req, |tx, _| charge(tx, "refused"))
        .await;
    let Err(RunError::Idem(error)) = outcome else {
        panic!("ran on a store not opened for one commit: {outcome:?}");
    };
    assert_eq!(store_kind(&error), Some(StoreErrorKind::Misconfigured));
    assert_eq!(charges(&store, "refused").await, 0);
    assert!(store
        .lookup(req.id(), Deadline::default())
        .await
        .expect("lookup")
        .is_none());
}

/// C15: a one-commit fresh key is one write transaction: the reservation is not committed on
/// its own. While the effect runs, a reader of the file sees no record; after the commit it
/// sees the completed one, and nothing was ever visible in progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c15_nothing_of_a_one_commit_execution_is_visible_before_it_commits() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("invisible.db");
    let store = one_commit_store(&path).await;
    let idem = Idempotency::new(store.clone());
    let req = request(&idem, "k", b"{}");
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (engine, owned) = (idem.clone(), req.clone());
    let first = tokio::spawn(async move {
        engine
            .run_in_transaction(&owned.clone().with_one_commit(true), move |tx, _| {
                let response = charge(tx, "invisible")?;
                let _ = started_tx.send(());
                let _ = go_rx.recv_timeout(Duration::from_secs(10));
                Ok::<_, rusqlite::Error>(response)
            })
            .await
    });
    tokio::task::spawn_blocking(move || started_rx.recv_timeout(Duration::from_secs(5)))
        .await
        .expect("wait")
        .expect("the effect started");
    let outside = rusqlite::Connection::open(&path).expect("a connection of its own");
    let seen: i64 = outside
        .query_row("SELECT count(*) FROM idem_records", [], |row| row.get(0))
        .expect("count");
    assert_eq!(seen, 0, "the reservation was committed on its own");
    go_tx.send(()).expect("go");
    assert!(matches!(
        first.await.expect("first"),
        Ok(Outcome::Executed(_))
    ));
    let state: i64 = outside
        .query_row("SELECT state FROM idem_records", [], |row| row.get(0))
        .expect("the completed record");
    assert_eq!(state, 1);
}

/// C15: a store for two commits refused while another held the table for one is not refused
/// for ever: once that store is gone, its next reservation goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c15_a_refused_store_reserves_once_the_table_is_free() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("freed.db");
    let one = one_commit_store(&path).await;
    let two = SqliteStore::open(&path)
        .await
        .expect("open for two commits");
    let idem = Idempotency::new(two.clone());
    let req = request(&idem, "k", b"{}");
    let refused = idem.begin(&req).await;
    assert!(
        matches!(&refused, Err(e) if store_kind(e) == Some(StoreErrorKind::Misconfigured)),
        "{refused:?}"
    );
    drop(one);
    let begun = idem.begin(&req).await;
    assert!(matches!(begun, Ok(Begin::Acquired(_))), "{begun:?}");
}

/// C15: SQLite's table names ignore case: another spelling of the table is the same table and
/// the same lock, refused while the table is held for one commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c15_another_spelling_of_the_table_is_the_same_lock() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("case.db");
    let _one = one_commit_store(&path).await;
    let other = SqliteStore::builder(&path)
        .table("IDEM_RECORDS")
        .open()
        .await
        .expect("open the same table under another spelling");
    let idem = Idempotency::new(other);
    let begun = idem.begin(&request(&idem, "k", b"{}")).await;
    assert!(
        matches!(&begun, Err(e) if store_kind(e) == Some(StoreErrorKind::Misconfigured)),
        "{begun:?}"
    );
}

/// C7, C3, C15: a claim that meets another is answered from the record as committed first. A
/// completed key's retry is its replay, not "in flight", and never a mismatch, even while a
/// one-commit request of the same key (with either body) holds its claim, queued behind
/// another connection's write lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c07_a_completed_key_replays_while_another_request_of_it_holds_its_claim() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("claimed.db");
    let store = one_commit_store(&path).await;
    let idem = Idempotency::new(store.clone());
    let original = request(&idem, "done", b"{\"a\":1}");
    let other_body = request(&idem, "done", b"{\"b\":2}");
    let done = idem
        .run_in_transaction(&original.clone().with_one_commit(true), |tx, _| {
            charge(tx, "done")
        })
        .await;
    assert!(matches!(done, Ok(Outcome::Executed(_))), "{done:?}");
    for claimant in [other_body.clone(), original.clone()] {
        let outside = rusqlite::Connection::open(&path).expect("a connection of its own");
        outside
            .execute_batch("BEGIN IMMEDIATE")
            .expect("hold the write lock");
        let (engine, owned) = (idem.clone(), claimant);
        let queued = tokio::spawn(async move {
            engine
                .run_in_transaction(&owned.clone().with_one_commit(true), |tx, _| {
                    charge(tx, "done")
                })
                .await
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let begun = idem.begin(&original).await;
        let closure = idem
            .run_in_transaction(&original.clone().with_one_commit(true), |tx, _| {
                charge(tx, "done")
            })
            .await;
        outside.execute_batch("ROLLBACK").expect("let go");
        let queued = queued.await.expect("the claimant");
        assert!(
            matches!(begun, Ok(Begin::Answered(Answer::Replay(_)))),
            "{begun:?}"
        );
        assert!(
            matches!(closure, Ok(Outcome::Answered(Answer::Replay(_)))),
            "{closure:?}"
        );
        assert!(
            matches!(
                queued,
                Ok(Outcome::Answered(Answer::Replay(_) | Answer::Mismatch))
            ),
            "{queued:?}"
        );
    }
    assert_eq!(charges(&store, "done").await, 1);
}

/// C5, C15: an engine over a wrapper of a store opened for one commit that does not forward
/// its identity could not share the claims: its reservations are refused, never left to wait
/// for another engine's uncommitted transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c05_an_engine_that_cannot_share_the_claims_refuses_instead_of_waiting() {
    let dir = tempfile::tempdir().expect("dir");
    let store = one_commit_store(&dir.path().join("wrapped.db")).await;
    let wrapped = Elsewhere::keeping_process_gate(Arc::new(store.clone()));
    assert!(wrapped.identity().is_none() && wrapped.capabilities().process_gate);
    let idem = Idempotency::new(wrapped);
    let started = Instant::now();
    let begun = idem.begin(&request(&idem, "k", b"{}")).await;
    assert!(
        matches!(&begun, Err(e) if store_kind(e) == Some(StoreErrorKind::Misconfigured)),
        "{begun:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(500));
}

/// C8: an effect that ends its transaction itself with a COMMIT (a misuse) has committed its
/// writes: with one commit or two, the key is kept with the 500 of an unknown outcome, the
/// caller is told the outcome is in doubt, and the retry replays that answer instead of running
/// the effect again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c08_an_effect_that_commits_by_itself_keeps_the_key() {
    let dir = tempfile::tempdir().expect("dir");
    let store = one_commit_store(&dir.path().join("self_commit.db")).await;
    let two = two_commit_beside(&dir.path().join("self_commit.db")).await;
    for (idem, one_commit) in [
        (Idempotency::new(store.clone()), true),
        (Idempotency::new(two.clone()), false),
    ] {
        let intent = format!("self-{one_commit}");
        let req = request(&idem, &intent, b"{}");
        let effect_intent = intent.clone();
        let first = idem
            .transact(
                &req.clone().with_one_commit(one_commit),
                Box::new(move |tx: &rusqlite::Transaction<'_>, _: &Lease| {
                    let response = charge(tx, &effect_intent)?;
                    tx.execute_batch("COMMIT")?;
                    Ok::<_, rusqlite::Error>(response)
                }),
            )
            .await;
        assert!(matches!(first, Err(RunError::InDoubt(_))), "{first:?}");
        for _ in 0..2 {
            let again_intent = intent.clone();
            let retry = idem
                .transact(
                    &req.clone().with_one_commit(one_commit),
                    Box::new(move |tx: &rusqlite::Transaction<'_>, _: &Lease| {
                        charge(tx, &again_intent)
                    }),
                )
                .await;
            assert!(
                matches!(&retry, Ok(Outcome::Answered(Answer::Replay(r))) if r.status == 500),
                "{one_commit}: {retry:?}"
            );
        }
        assert_eq!(charges(&store, &intent).await, 1, "{one_commit}");
    }
}

/// C6, C7: an effect that rolls its transaction back itself (a helper's reset: `ROLLBACK`,
/// perhaps `BEGIN` again and more writes) and answers 201 has nothing committed: with one
/// commit or two, no completion commits without its writes, nor with what it wrote after its
/// `BEGIN`. Nothing happened: the caller is not told it executed, the key is given back, the
/// retry charges once and only that charge's 201 is replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c06_an_effect_that_rolls_back_by_itself_never_completes() {
    let dir = tempfile::tempdir().expect("dir");
    let store = one_commit_store(&dir.path().join("self_rollback.db")).await;
    let two = two_commit_beside(&dir.path().join("self_rollback.db")).await;
    let resets = [
        "ROLLBACK",
        "ROLLBACK; BEGIN IMMEDIATE",
        "ROLLBACK; BEGIN IMMEDIATE; INSERT INTO charges (intent, cents) VALUES ('after', 1)",
    ];
    for (idem, one_commit) in [
        (Idempotency::new(store.clone()), true),
        (Idempotency::new(two.clone()), false),
    ] {
        for (n, reset) in resets.into_iter().enumerate() {
            let intent = format!("reset-{one_commit}-{n}");
            let req = request(&idem, &intent, b"{}").with_one_commit(one_commit);
            let runs = Arc::new(AtomicUsize::new(0));
            let (effect_intent, first_runs) = (intent.clone(), Arc::clone(&runs));
            let first = idem
                .transact(
                    &req,
                    Box::new(move |tx: &rusqlite::Transaction<'_>, _: &Lease| {
                        first_runs.fetch_add(1, Ordering::SeqCst);
                        let response = charge(tx, &effect_intent)?;
                        tx.execute_batch(reset)?;
                        Ok::<_, rusqlite::Error>(response)
                    }),
                )
                .await;
            let what = format!("{reset:?}, one commit {one_commit}");
            assert!(
                !matches!(first, Ok(Outcome::Executed(_))),
                "{what}: {first:?}"
            );
            assert_eq!(charges(&store, &intent).await, 0, "{what}");
            assert_eq!(charges(&store, "after").await, 0, "{what}");
            for _ in 0..2 {
                let (again_intent, again_runs) = (intent.clone(), Arc::clone(&runs));
                let retry = idem
                    .transact(
                        &req,
                        Box::new(move |tx: &rusqlite::Transaction<'_>, _: &Lease| {
                            again_runs.fetch_add(1, Ordering::SeqCst);
                            charge(tx, &again_intent)
                        }),
                    )
                    .await;
                let status = match &retry {
                    Ok(Outcome::Executed(r)) | Ok(Outcome::Answered(Answer::Replay(r))) => r.status,
                    other => panic!("{what}: the retry got {other:?}"),
                };
                assert_eq!(status, 201, "{what}");
                assert_eq!(
                    charges(&store, &intent).await,
                    1,
                    "{what}: a 201 without its charge"
                );
            }
            // The first run, whose writes vanished, and the one retry that charged.
            assert_eq!(runs.load(Ordering::SeqCst), 2, "{what}");
        }
    }
}

/// C8, C15: an effect's own `ROLLBACK` takes a one-commit reservation with it; what it writes
/// after commits on its own. The key must still be kept with the answer of an unknown outcome
/// (the engine writes the record again under the execution's lease), never left free for a
/// retry that charges again. Two commits alike.
#[tokio::test]
async fn c08_a_rollback_then_a_write_that_commits_keeps_the_key() {
    let dir = tempfile::tempdir().expect("dir");
    let store = one_commit_store(&dir.path().join("rollback_then_write.db")).await;
    let two = two_commit_beside(&dir.path().join("rollback_then_write.db")).await;
    for (idem, one_commit) in [
        (Idempotency::new(store.clone()), true),
        (Idempotency::new(two.clone()), false),
    ] {
        let intent = format!("rollback-then-write-{one_commit}");
        let req = request(&idem, &intent, b"{}").with_one_commit(one_commit);
        let effect_intent = intent.clone();
        let first = idem
            .transact(
                &req,
                Box::new(move |tx: &rusqlite::Transaction<'_>, _: &Lease| {
                    tx.execute_batch("ROLLBACK")?;
                    charge(tx, &effect_intent)
                }),
            )
            .await;
        assert!(
            matches!(first, Err(RunError::InDoubt(_))),
            "one commit {one_commit}: {first:?}"
        );
        let retry_intent = intent.clone();
        let retry = idem
            .transact(
                &req,
                Box::new(move |tx: &rusqlite::Transaction<'_>, _: &Lease| {
                    charge(tx, &retry_intent)
                }),
            )
            .await;
        assert!(
            matches!(retry, Ok(Outcome::Answered(Answer::Replay(ref r))) if r.status == 500),
            "one commit {one_commit}: the retry replays the unknown outcome: {retry:?}"
        );
        assert_eq!(
            charges(&store, &intent).await,
            1,
            "one commit {one_commit}: charged once"
        );
    }
}

/// C5, C15: a store opened by a `file:` URI locks the file SQLite opened, as one opened by its
/// path: beside a store that holds the table for one commit it is refused at its reservation
/// (never waits for that store's open transaction), and a URI store that reserved keeps a
/// store for one commit off the table. Opened by a URI for one commit, a store holds the table
/// as one opened by the path does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c15_a_store_opened_by_a_uri_takes_the_lock_of_its_file() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("uri.db");
    let uri = format!("file:{}?cache=private", path.display());

    let one = one_commit_store(&path).await;
    let by_uri = SqliteStore::open(&uri).await.expect("open by a URI");
    let idem = Idempotency::new(by_uri.clone());
    let started = Instant::now();
    let begun = idem.begin(&request(&idem, "k", b"{}")).await;
    let Err(refused) = begun else {
        panic!("a URI store reserved beside a store held for one commit: {begun:?}");
    };
    assert_eq!(store_kind(&refused), Some(StoreErrorKind::Misconfigured));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "refused at once"
    );
    drop(one);

    let begun = idem.begin(&request(&idem, "k", b"{}")).await;
    assert!(matches!(begun, Ok(Begin::Acquired(_))), "{begun:?}");
    let one = SqliteStore::builder(&path).one_commit(true).open().await;
    assert!(
        one.is_err(),
        "a store opened for one commit beside a URI store that reserves"
    );
    drop((idem, by_uri));

    let one_by_uri = SqliteStore::builder(&uri).one_commit(true).open().await;
    let one_by_uri = one_by_uri.expect("one commit by a URI, the table free");
    let two = SqliteStore::open(&path).await.expect("open by the path");
    let reserved = two
        .reservation(
            &request(&Idempotency::new(two.clone()), "other", b"{}"),
            Duration::from_secs(5),
            Deadline::default(),
        )
        .await;
    assert!(
        matches!(&reserved, Err(e) if store_kind(e) == Some(StoreErrorKind::Misconfigured)),
        "{reserved:?}"
    );
    drop(one_by_uri);
}

/// C15: the lock does not depend on how a path is spelled in bytes: in a directory whose name
/// is not UTF-8 a store opened for one commit holds the table, and another store is refused
/// its reservation. A read-only connection (`mode=ro`) cannot reserve, so it is never opened
/// for one commit (it would keep every writer off the table).
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c15_the_lock_holds_on_a_path_that_is_not_utf8_and_never_for_a_read_only_store() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().expect("dir");
    let odd = dir.path().join(std::ffi::OsStr::from_bytes(b"caf\xe9"));
    std::fs::create_dir(&odd).expect("a directory named in Latin-1");
    let path = odd.join("odd.db");
    let one = one_commit_store(&path).await;
    let two = SqliteStore::open(&path)
        .await
        .expect("open for two commits");
    let idem = Idempotency::new(two.clone());
    let begun = idem.begin(&request(&idem, "k", b"{}")).await;
    assert!(
        matches!(&begun, Err(e) if store_kind(e) == Some(StoreErrorKind::Misconfigured)),
        "a store reserved beside one held for one commit: {begun:?}"
    );
    drop((idem, two, one));

    let plain = dir.path().join("ro.db");
    drop(one_commit_store(&plain).await);
    let read_only = format!("file:{}?mode=ro", plain.display());
    let refused = SqliteStore::builder(&read_only)
        .one_commit(true)
        .open()
        .await;
    assert!(
        matches!(&refused, Err(e) if store_kind(e) == Some(StoreErrorKind::Misconfigured)),
        "a read-only store opened for one commit: {:?}",
        refused.as_ref().map(drop)
    );
    let writer = one_commit_store(&plain).await;
    drop(writer);
}
