//! SQLite rolls a transaction back by itself on some errors (an `ON CONFLICT ROLLBACK`
//! constraint, `INSERT OR ROLLBACK`, a trigger's `RAISE(ROLLBACK, ..)`, a full disk) while the
//! effect goes on and answers (C6, C8, C16): the completion must then not commit on its own.
//! The transaction rolled back, nothing happened, the key is given back.

mod common;

use common::db_path;
use idem_core::store::Deadline;
use idem_core::{Answer, Begin, FencingToken, Idempotency, Outcome, Policy, Store, StoredResponse};
use idem_core::{Event, EventKind, Observer};
use idem_sqlite::{SqliteIdempotency, SqliteStore};
use std::sync::{Arc, Mutex};

/// The kinds of the engine's events, store calls left out.
#[derive(Default)]
struct Kinds(Mutex<Vec<EventKind>>);

impl Observer for Kinds {
    fn observe(&self, event: &Event<'_>) {
        if event.kind() != EventKind::StoreCall {
            self.0.lock().expect("not poisoned").push(event.kind());
        }
    }
}

#[tokio::test]
async fn c06_a_transaction_sqlite_rolled_back_under_the_effect_never_completes_the_record() {
    let table = format!("t_{}", FencingToken::generate());
    let store = SqliteStore::builder(db_path())
        .table(&table)
        .open()
        .await
        .expect("open");
    let (users, audit) = (format!("{table}_users"), format!("{table}_audit"));
    {
        let (users, audit) = (users.clone(), audit.clone());
        store
            .try_call(move |db| {
                db.execute_batch(&format!(
                    "CREATE TABLE {users} (email TEXT UNIQUE ON CONFLICT ROLLBACK);
                     CREATE TABLE {audit} (what TEXT NOT NULL);
                     INSERT INTO {users} (email) VALUES ('taken@example.com');"
                ))
            })
            .await
            .expect("business tables");
    }
    let kinds = Arc::new(Kinds::default());
    let idem = Idempotency::builder(store)
        .policy(Policy::default())
        .observer(Arc::clone(&kinds))
        .build()
        .expect("policy");
    let request = idem
        .request("acct", "POST", "/users")
        .key(Some("signup-1"))
        .body(br#"{"email":"taken@example.com"}"#)
        .build()
        .expect("request");

    let (u, a) = (users.clone(), audit.clone());
    let first = idem
        .run_in_transaction(&request, move |tx, _lease| {
            tx.execute(
                &format!("INSERT INTO {a} (what) VALUES ('signup attempted')"),
                [],
            )?;
            match tx.execute(
                &format!("INSERT INTO {u} (email) VALUES ('taken@example.com')"),
                [],
            ) {
                Ok(_) => Ok(StoredResponse::new(201, "created")),
                // A business answer for a taken address (C8: any status is stored).
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if e.code == rusqlite::ErrorCode::ConstraintViolation =>
                {
                    Ok(StoredResponse::new(409, "email taken"))
                }
                Err(other) => Err(other),
            }
        })
        .await;

    let audit_rows: i64 = {
        let audit = audit.clone();
        idem.store()
            .try_call(move |db| {
                db.query_row(&format!("SELECT COUNT(*) FROM {audit}"), [], |r| r.get(0))
            })
            .await
            .expect("count")
    };
    let events = kinds.0.lock().expect("not poisoned").clone();
    let record = idem
        .store()
        .lookup(request.id(), Deadline::default())
        .await
        .expect("lookup");
    let completed = record.as_ref().is_some_and(|r| !r.is_in_progress());
    let retry = idem.begin(&request).await.expect("begin");
    eprintln!(
        "first = {first:?}\naudit rows = {audit_rows}\nrecord completed = {completed}\nretry = {retry:?}\nevents of the first call = {events:?}"
    );

    // C6: the record completed while the effect's own write (the audit row) vanished.
    assert!(
        !(completed && audit_rows == 0),
        "the completion committed on its own, without the effect's transaction"
    );
    // The caller's answer is what a retry replays.
    if let Begin::Answered(Answer::Replay(replayed)) = &retry {
        assert!(
            matches!(&first, Ok(Outcome::Executed(sent)) if sent == replayed),
            "the caller got {first:?} but a retry replays {replayed:?}"
        );
    }
}
