//! C3: a request with an alternative fingerprint (idem-tower gives a JSON request its raw
//! form's) meets a record stored under the alternative, through `run_in_transaction`, with
//! the writer busy (a reader answers, C5) or idle, in two commits and in one (C15): in flight,
//! replayed, or taken over under the request's own fingerprint; never executed under the
//! alternative.

mod common;

use idem_core::store::{Deadline, Reservation, Reserved};
use idem_core::{Answer, FencingToken, Idempotency, Outcome, Request, Store, StoredResponse};
use idem_sqlite::{SqliteIdempotency, SqliteStore};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What the record under the alternative is when the request arrives.
#[derive(Clone, Copy, Debug)]
enum Found {
    /// Reserved, its lease live.
    InFlight,
    /// Completed, with its response.
    Completed,
    /// Reserved, its lease passed.
    Expired,
}

fn request(key: &str, body: &[u8], one_commit: bool) -> Request {
    Request::builder("acct_alt", "POST", "/charges")
        .key(Some(key))
        .body(body)
        .build()
        .expect("a valid request")
        .with_one_commit(one_commit)
}

/// Holds the writer for `held` with an execution on a key of its own.
fn busy_writer(idem: &Idempotency<SqliteStore>, held: Duration) -> tokio::task::JoinHandle<()> {
    let idem = idem.clone();
    let other = request(
        &format!("busy-{}", FencingToken::generate()),
        b"busy",
        false,
    );
    tokio::spawn(async move {
        let _ = idem
            .run_in_transaction(&other, move |_tx, _| {
                std::thread::sleep(held);
                Ok::<_, String>(StoredResponse::new(200, "busy"))
            })
            .await;
    })
}

async fn case(found: Found, one_commit: bool, busy: bool) {
    let store = SqliteStore::builder(common::db_path())
        .table(&format!("alt_{}", FencingToken::generate()))
        .readers(2)
        .one_commit(one_commit)
        .open()
        .await
        .expect("open");
    let idem = Idempotency::new(store.clone());
    let key = format!("k-{}", FencingToken::generate());
    let old = request(&key, b"raw", one_commit);
    let new =
        request(&key, b"canonical", one_commit).with_alternative_fingerprint(*old.fingerprint());
    let case = format!("{found:?}, one commit {one_commit}, writer busy {busy}");
    match found {
        Found::Completed => {
            let first = idem
                .run_in_transaction(&old, |_tx, _| {
                    Ok::<_, String>(StoredResponse::new(202, "the first"))
                })
                .await
                .expect("the first");
            assert!(matches!(first, Outcome::Executed(_)), "{case}");
        }
        Found::InFlight | Found::Expired => {
            let lease = match found {
                Found::Expired => Duration::from_millis(50),
                _ => Duration::from_secs(60),
            };
            let reservation = Reservation::new(&old, lease);
            let got = store
                .reserve(reservation.claim(), Deadline::default())
                .await;
            assert!(
                matches!(got, Ok(Reserved::Written { .. })),
                "{case}: {got:?}"
            );
            tokio::time::sleep(Duration::from_millis(120)).await;
        }
    }
    let writer = busy.then(|| busy_writer(&idem, Duration::from_millis(400)));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let outcome = idem
        .run_in_transaction(&new, move |_tx, _| {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(StoredResponse::new(201, "the second"))
        })
        .await
        .expect("run");
    if let Some(writer) = writer {
        writer.await.expect("the busy writer");
    }
    let record = store
        .lookup(new.id(), Deadline::default())
        .await
        .expect("lookup")
        .expect("a record");
    match found {
        Found::InFlight => {
            assert!(
                matches!(outcome, Outcome::Answered(Answer::InFlight { retry_after }) if retry_after > Duration::from_secs(50)),
                "{case}: {outcome:?}"
            );
            assert_eq!(runs.load(Ordering::SeqCst), 0, "{case}");
        }
        Found::Completed => {
            assert!(
                matches!(&outcome, Outcome::Answered(Answer::Replay(r)) if r.status == 202 && r.body == b"the first"),
                "{case}: {outcome:?}"
            );
            assert_eq!(runs.load(Ordering::SeqCst), 0, "{case}");
        }
        Found::Expired => {
            assert!(
                matches!(outcome, Outcome::Executed(_)),
                "{case}: {outcome:?}"
            );
            assert_eq!(runs.load(Ordering::SeqCst), 1, "{case}");
            assert_eq!(
                record.fingerprint,
                *new.fingerprint(),
                "{case}: taken over under the request's own fingerprint"
            );
        }
    }
    // A third body is another request under either fingerprint: 422, nothing run.
    let third = request(&key, b"third", one_commit);
    if !matches!(found, Found::Expired) {
        let outcome = idem
            .run_in_transaction(&third, |_tx, _| {
                Ok::<_, String>(StoredResponse::new(201, "never"))
            })
            .await
            .expect("run");
        assert!(
            matches!(outcome, Outcome::Answered(Answer::Mismatch)),
            "{case}: {outcome:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c03_a_record_under_the_alternative_is_answered_or_taken_over_never_run_under_it() {
    for found in [Found::InFlight, Found::Completed, Found::Expired] {
        for (one_commit, busy) in [(false, true), (false, false), (true, true), (true, false)] {
            case(found, one_commit, busy).await;
        }
    }
}
