//! C12 and C13 on SQLite: corrupted rows, hostile configuration, a store that fails.

mod common;

use idem_core::store::Deadline;
use idem_core::{
    Begin, Error, Failure, Idempotency, Policy, Request, RunError, Store, StoreErrorKind,
    StoredResponse,
};
use idem_sqlite::{SqliteIdempotency, SqliteStore, SCHEMA_VERSION};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

fn request(key: &str) -> Request {
    Request::builder("acct_bad", "POST", "/charges")
        .key(Some(key))
        .body(b"{}")
        .build()
        .expect("valid")
}

async fn completed_record(store: &SqliteStore) -> Request {
    let req = request(&idem_core::FencingToken::generate().to_string());
    let idem = Idempotency::new(store.clone());
    let Begin::Acquired(lease) = idem.begin(&req).await.expect("begin") else {
        panic!("fresh");
    };
    idem.complete(lease, StoredResponse::new(201, "ok"))
        .await
        .expect("complete");
    req
}

async fn overwrite(store: &SqliteStore, req: &Request, assignment: &'static str) {
    let id = req.id().clone();
    let changed = store
        .call(move |db| {
            db.execute(
                &format!("UPDATE idem_records SET {assignment} WHERE consumer = ?1 AND route = ?2 AND key = ?3"),
                [id.consumer(), id.route(), id.key()],
            )
        })
        .await
        .expect("call")
        .expect("update");
    assert_eq!(changed, 1);
}

/// The row exactly as stored, quoted by SQLite.
async fn raw_row(store: &SqliteStore, req: &Request) -> String {
    let id = req.id().clone();
    store
        .call(move |db| {
            db.query_row(
                "SELECT quote(fingerprint) || quote(token) || quote(state) || quote(deadline) || quote(response)
                 FROM idem_records WHERE consumer = ?1 AND route = ?2 AND key = ?3",
                [id.consumer(), id.route(), id.key()],
                |r| r.get::<_, String>(0),
            )
        })
        .await
        .expect("call")
        .expect("row")
}

#[tokio::test]
async fn c12_every_corrupted_column_is_a_typed_error_and_nothing_runs() {
    let store = common::store().await;
    for assignment in [
        "response = 'text, not a blob'",
        "response = X'49010000'",
        "response = NULL",
        "token = X'0102'",
        "fingerprint = 'abc'",
        "state = 7",
        "deadline = -5",
        "deadline = 'soon'",
        "state = 0",
    ] {
        let req = completed_record(&store).await;
        overwrite(&store, &req, assignment).await;
        let before = raw_row(&store, &req).await;

        let idem = Idempotency::new(store.clone());
        let ran = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&ran);
        let outcome = idem
            .run(&req, move |_| async move {
                r.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Failure<Error>>(StoredResponse::new(201, "again"))
            })
            .await;
        assert!(
            matches!(outcome, Err(RunError::Idem(Error::CorruptRecord(_)))),
            "{assignment}: {outcome:?}"
        );
        assert_eq!(ran.load(Ordering::SeqCst), 0, "{assignment}");
        assert!(
            matches!(
                store.lookup(req.id(), Deadline::default()).await,
                Err(Error::CorruptRecord(_))
            ),
            "{assignment}"
        );
        let after = raw_row(&store, &req).await;
        assert_eq!(before, after, "{assignment}: the corrupt row was rewritten");
    }
}

#[tokio::test]
async fn c12_over_long_key_and_oversized_body_write_nothing() {
    let store = common::store().await;
    let idem = Idempotency::with_policy(store.clone(), Policy::default().max_body_bytes(64))
        .expect("policy");
    let long_key = "k".repeat(256);
    let err = idem
        .request("acct_bad", "POST", "/charges")
        .key(Some(&long_key))
        .body(b"{}")
        .build()
        .expect_err("long key");
    assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
    let err = idem
        .request("acct_bad", "POST", "/charges")
        .key(Some("big-body"))
        .body(&[b'x'; 65])
        .build()
        .expect_err("big body");
    assert!(matches!(err, Error::BodyTooLarge { .. }), "{err}");
    let rows: i64 = store
        .call(|db| {
            db.query_row(
                "SELECT COUNT(*) FROM idem_records WHERE key IN ('big-body') OR length(key) > 255",
                [],
                |r| r.get(0),
            )
        })
        .await
        .expect("call")
        .expect("count");
    assert_eq!(rows, 0);
}

#[tokio::test]
async fn table_names_that_could_inject_sql_are_refused() {
    let dir = tempfile::tempdir().expect("dir");
    for bad in [
        "",
        "1abc",
        "records; DROP TABLE charges",
        "a b",
        "idem\"x",
        "sqlite_master",
        &"t".repeat(64),
    ] {
        let err = SqliteStore::builder(dir.path().join("t.db"))
            .table(bad)
            .open()
            .await
            .expect_err(bad);
        assert!(matches!(err, Error::InvalidInput { .. }), "{bad}: {err:?}");
    }
    let store = SqliteStore::builder(dir.path().join("t.db"))
        .table("Payments_Idem_2")
        .open()
        .await
        .expect("valid name");
    assert_eq!(store.table(), "Payments_Idem_2");
}

#[tokio::test]
async fn a_schema_from_a_newer_release_is_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("newer.db");
    let store = SqliteStore::open(&path).await.expect("open");
    store
        .call(move |db| {
            db.execute(
                "INSERT INTO idem_schema_migrations (table_name, version, applied_at) VALUES ('idem_records', ?1, 0)",
                [SCHEMA_VERSION + 1],
            )
        })
        .await
        .expect("call")
        .expect("insert");
    let err = SqliteStore::open(&path).await.expect_err("newer schema");
    assert!(
        matches!(err, Error::SchemaVersion { found, expected, .. } if found == SCHEMA_VERSION + 1 && expected == SCHEMA_VERSION),
        "{err:?}"
    );
    assert!(err.to_string().contains("upgrade this program"), "{err}");
}

#[tokio::test]
async fn c13_a_failing_database_is_an_error_and_the_effect_never_runs() {
    let dir = tempfile::tempdir().expect("dir");
    let err = SqliteStore::open(dir.path().join("missing-dir").join("x.db"))
        .await
        .expect_err("no such directory");
    assert!(matches!(err, Error::Store(_)), "{err:?}");

    let store = SqliteStore::builder(dir.path().join("gone.db"))
        .table("gone")
        .open()
        .await
        .expect("open");
    store
        .call(|db| db.execute_batch("DROP TABLE gone"))
        .await
        .expect("call")
        .expect("drop");
    let idem = Idempotency::new(store);
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let outcome = idem
        .run(&request("k"), |_| async move {
            r.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failure<Error>>(StoredResponse::new(201, ""))
        })
        .await;
    let Err(RunError::Idem(err)) = outcome else {
        panic!("expected a store error, got {outcome:?}");
    };
    assert!(matches!(err, Error::Store(_)), "{err}");
    // A missing table is not a passing failure: it says so, and keeps rusqlite's error.
    let store_err = err.as_store().expect("a store error");
    assert_eq!(store_err.kind(), StoreErrorKind::Misconfigured);
    assert!(!err.is_retryable());
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn many_stores_opening_a_new_file_at_once_all_succeed() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("race.db");
    let opens: Vec<_> = (0..8)
        .map(|_| tokio::spawn(SqliteStore::open(path.clone())))
        .collect();
    for open in opens {
        open.await.expect("task").expect("open");
    }
}

/// C7, C12: a stored response is filtered and checked again before it is replayed: a row
/// written by hand, or under an older policy, can neither leak a cookie nor inject a header.
#[tokio::test]
async fn c07_replayed_bytes_are_filtered_and_checked_again() {
    let store = common::store().await;
    let idem = Idempotency::new(store.clone());
    for (headers, expect_corrupt) in [
        (
            vec![("set-cookie", "sid=secret"), ("content-type", "text/plain")],
            false,
        ),
        (
            vec![("content-type", "text/plain\r\nSet-Cookie: sid=1")],
            true,
        ),
        (
            vec![("Bad Name:", "v"), ("content-type", "text/plain")],
            false,
        ),
    ] {
        let req = completed_record(&store).await;
        let mut raw = StoredResponse::new(200, "ok");
        raw.headers = headers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), v.as_bytes().to_vec()))
            .collect();
        let bytes = raw.encode().expect("encode");
        let id = req.id().clone();
        store
            .try_call(move |db| {
                db.execute(
                    "UPDATE idem_records SET response = ?4 WHERE consumer = ?1 AND route = ?2 AND key = ?3",
                    rusqlite::params![id.consumer(), id.route(), id.key(), bytes],
                )
            })
            .await
            .expect("update");
        let answer = idem.begin(&req).await;
        let closure = idem
            .run_in_transaction(&req, |_, _| {
                Ok::<_, rusqlite::Error>(StoredResponse::new(201, "never"))
            })
            .await;
        if expect_corrupt {
            assert!(matches!(answer, Err(Error::CorruptRecord(_))), "{answer:?}");
            assert!(
                matches!(closure, Err(RunError::Idem(Error::CorruptRecord(_)))),
                "{closure:?}"
            );
        } else {
            let Ok(idem_core::Outcome::Answered(idem_core::Answer::Replay(replayed))) = closure
            else {
                panic!("a replay: {closure:?}");
            };
            assert_eq!(replayed.header("set-cookie"), None);
            let Ok(Begin::Answered(idem_core::Answer::Replay(replayed))) = answer else {
                panic!("a replay: {answer:?}");
            };
            assert_eq!(replayed.header("set-cookie"), None);
            assert_eq!(replayed.header("bad name:"), None);
            assert_eq!(replayed.header("content-type"), Some(&b"text/plain"[..]));
        }
    }
}
