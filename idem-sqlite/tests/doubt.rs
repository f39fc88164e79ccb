//! Records in doubt on SQLite beyond the conformance suite (store rules 6 and 7, Operator rule
//! 4; docs/state-machine.md, "Records in doubt"): a decision is fenced on the mark it read and
//! leaves no audit row when it loses, the purge deletes expired audit rows within its limit, an
//! unreadable mark takes no listing down, and the in-doubt statements read their indexes.

use idem_core::store::Deadline;
use idem_core::store::Store;
use idem_core::store::{Doubt, DoubtCause};
use idem_core::testing::{request, unique_consumer};
use idem_core::{
    Error, Failure, Idempotency, ManualClock, Outcome, Policy, Request, StoredResponse, Timestamp,
};
use idem_ops::reconcile::{Decided, Finding, InDoubt};
use idem_ops::Noted;
use idem_ops::{ListQuery, Operator};
use idem_sqlite::rusqlite::{params, Connection};
use idem_sqlite::SqliteStore;
use std::path::Path;
use std::time::Duration;

/// Runs `request` to an unknown outcome: its record keeps the key with an answer in doubt (C8).
async fn into_doubt(idem: &Idempotency<SqliteStore>, request: &Request) {
    let result = idem
        .run(request, |_ctx| async {
            Err::<StoredResponse, _>(Failure::unknown("the provider timed out").noting("auth 1"))
        })
        .await;
    assert!(result.is_err(), "an unknown outcome: {result:?}");
}

async fn case(idem: &Idempotency<SqliteStore>, request: &Request) -> InDoubt {
    idem_ops::reconcile::in_doubt(idem, request.id())
        .await
        .expect("read")
        .expect("the record is in doubt")
}

/// How many audit rows the file holds for the default table, read behind the store's back.
fn audit_rows(path: &Path) -> i64 {
    Connection::open(path)
        .expect("open")
        .query_row(
            "SELECT count(*) FROM idem_records_reconciliations",
            [],
            |r| r.get(0),
        )
        .expect("the audit table")
}

/// Store rule 7: a decision applies only while the record carries exactly the mark it was
/// read with; one that lost (another decider changed the mark, or it was edited) writes
/// nothing, no audit row either, and the record stays as the winner left it.
#[tokio::test]
async fn c06_a_decision_on_a_mark_that_changed_writes_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("fenced.db");
    let store = SqliteStore::open(&path).await.expect("open");
    let idem = Idempotency::new(store.clone());
    let charge = request(&unique_consumer("fenced"), "k", b"{}");
    into_doubt(&idem, &charge).await;
    let stale = case(&idem, &charge).await;
    let read = case(&idem, &charge).await;

    let deferred =
        idem_ops::reconcile::resolve(&idem, &read, Finding::still_unknown(), "reconciler a")
            .await
            .expect("resolve");
    assert!(
        matches!(deferred, Some(Decided::StillUnknown { attempt: 1, .. })),
        "{deferred:?}"
    );
    assert_eq!(audit_rows(&path), 1);

    // The mark changed since `stale` was read: its decision loses, whatever it decided.
    for finding in [
        Finding::settled(StoredResponse::new(201, "late")),
        Finding::not_happened(),
        Finding::still_unknown(),
    ] {
        let lost = idem_ops::reconcile::resolve(&idem, &stale, finding, "reconciler b")
            .await
            .expect("resolve");
        assert_eq!(lost, None);
    }
    assert_eq!(audit_rows(&path), 1, "a lost decision left an audit row");
    let now = case(&idem, &charge).await;
    assert_eq!((now.doubt.attempts, now.answer.status), (1, 500));

    // A mark edited behind the reader's back (another release, a hand edit): no decision read
    // before the edit applies.
    let before_edit = now;
    let edited = Doubt {
        token: before_edit.token,
        ..Doubt::new(DoubtCause::Failure, "edited")
    }
    .encode();
    Connection::open(&path)
        .expect("open")
        .execute("UPDATE idem_records SET doubt = ?1", params![edited])
        .expect("hand edit");
    let lost =
        idem_ops::reconcile::resolve(&idem, &before_edit, Finding::not_happened(), "operator")
            .await
            .expect("resolve");
    assert_eq!(lost, None);
    assert!(store
        .lookup(charge.id(), Deadline::default())
        .await
        .expect("lookup")
        .is_some());
    assert_eq!(audit_rows(&path), 1);
    let trail = store
        .reconciliations(charge.id(), Deadline::default())
        .await
        .expect("trail");
    assert_eq!(trail.len(), 1, "{trail:?}");
    assert_eq!(trail[0].by, "reconciler a");

    // Read again, the edited mark is what a decision is fenced on.
    let fresh = case(&idem, &charge).await;
    assert_eq!(fresh.doubt.note, "edited");
    let released = idem_ops::reconcile::resolve(&idem, &fresh, Finding::not_happened(), "operator")
        .await
        .expect("resolve");
    assert_eq!(released, Some(Decided::Released));
    assert!(store
        .lookup(charge.id(), Deadline::default())
        .await
        .expect("lookup")
        .is_none());
    assert_eq!(audit_rows(&path), 2);
}

/// Store rules 4 and 7: the purge deletes expired audit rows as well as expired records, at
/// most `limit` rows in all per call, records first; an expired entry is no longer in the
/// trail even before the purge deletes it.
#[tokio::test]
async fn the_purge_deletes_expired_audit_rows_within_its_limit() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("purge.db");
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let store = SqliteStore::builder(&path)
        .clock(clock.clone())
        .open()
        .await
        .expect("open");
    let keep = Policy::default().audit_retention(Duration::from_secs(1));
    let idem = Idempotency::with_policy(store.clone(), keep).expect("policy");
    let consumer = unique_consumer("purge");
    let doubtful: Vec<Request> = (0..3)
        .map(|i| request(&consumer, &format!("doubt-{i}"), b"{}"))
        .collect();
    for charge in &doubtful {
        into_doubt(&idem, charge).await;
        let read = case(&idem, charge).await;
        let resolved =
            idem_ops::reconcile::resolve(&idem, &read, Finding::still_unknown(), "reconciler")
                .await
                .expect("resolve");
        assert!(
            matches!(resolved, Some(Decided::StillUnknown { .. })),
            "{resolved:?}"
        );
    }
    // One plain record whose retention passes with the entries.
    let short = Policy::default().retention(Duration::from_secs(1));
    let brief = Idempotency::with_policy(store.clone(), short).expect("policy");
    let plain = brief
        .run(&request(&consumer, "plain", b"{}"), |_ctx| async {
            Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "ok"))
        })
        .await
        .expect("run");
    assert!(matches!(plain, Outcome::Executed(_)), "{plain:?}");
    assert_eq!(audit_rows(&path), 3);
    assert_eq!(
        store
            .purge_expired(10, Deadline::default())
            .await
            .expect("purge"),
        0
    );

    clock.advance(Duration::from_secs(2));
    assert!(
        store
            .reconciliations(doubtful[0].id(), Deadline::default())
            .await
            .expect("trail")
            .is_empty(),
        "an expired entry is not in the trail"
    );
    assert_eq!(
        store
            .purge_expired(2, Deadline::default())
            .await
            .expect("purge"),
        2,
        "the record and one entry"
    );
    assert_eq!(audit_rows(&path), 2);
    assert_eq!(
        store
            .purge_expired(10, Deadline::default())
            .await
            .expect("purge"),
        2
    );
    assert_eq!(audit_rows(&path), 0);
    assert_eq!(
        store
            .purge_expired(10, Deadline::default())
            .await
            .expect("purge"),
        0
    );
    assert_eq!(
        store
            .stats(Deadline::default())
            .await
            .expect("stats")
            .in_doubt,
        3,
        "the records in doubt stay"
    );
}

/// C12: a mark of doubt that does not decode is a typed error to `inspect` (a reconciler
/// decides on it) and an unreadable note in a listing, which goes on; a reconciliation pass
/// counts it failed and decides the others.
#[tokio::test]
async fn c12_an_unreadable_mark_is_corrupt_to_inspect_and_takes_no_listing_down() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("corrupt.db");
    let store = SqliteStore::open(&path).await.expect("open");
    let idem = Idempotency::new(store.clone());
    let consumer = unique_consumer("corrupt");
    let (bad, good) = (
        request(&consumer, "bad", b"{}"),
        request(&consumer, "good", b"{}"),
    );
    into_doubt(&idem, &bad).await;
    into_doubt(&idem, &good).await;
    Connection::open(&path)
        .expect("open")
        .execute(
            "UPDATE idem_records SET doubt = X'4401FF' WHERE key = 'bad'",
            [],
        )
        .expect("hand edit");

    let err = store
        .inspect(bad.id(), Deadline::default())
        .await
        .expect_err("corrupt");
    assert!(matches!(err, Error::CorruptRecord(_)), "{err:?}");
    let page = store
        .list(&ListQuery::in_doubt().limit(10), Deadline::default())
        .await
        .expect("a listing despite the mark");
    assert_eq!(page.records.len(), 2, "{page:?}");
    for record in &page.records {
        match (record.id.key(), &record.doubt) {
            ("bad", Some(Noted::Unreadable(_))) | ("good", Some(Noted::Known(_))) => {}
            _ => panic!("{record:?}"),
        }
    }
    let report =
        idem_ops::reconcile_now(&idem, &|_case: InDoubt| async { Finding::not_happened() })
            .await
            .expect("pass");
    assert_eq!((report.released, report.failed), (1, 1), "{report:?}");
}

/// The statements of records in doubt read their indexes: the in-doubt listing its partial
/// index in its order (no sort), a record's trail and the purge of the trail theirs.
#[tokio::test]
async fn the_in_doubt_statements_read_their_indexes() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("plan.db");
    SqliteStore::open(&path).await.expect("open");
    let db = Connection::open(&path).expect("open");
    let plan = |statement: &str, params: &[&dyn idem_sqlite::rusqlite::ToSql]| -> String {
        db.prepare(&format!("EXPLAIN QUERY PLAN {statement}"))
            .expect("explain")
            .query_map(params, |row| row.get::<_, String>(3))
            .expect("plan")
            .collect::<Result<Vec<_>, _>>()
            .expect("rows")
            .join("; ")
    };
    for due in [0, 1] {
        let listing = plan(
            include_str!("../sql/list_in_doubt.sql"),
            params![0, due, -1, "", "", "", 10],
        );
        assert!(listing.contains("idem_records_in_doubt"), "{listing}");
        assert!(
            !listing.contains("TEMP B-TREE"),
            "a listing sorts: {listing}"
        );
    }
    let trail = plan(
        include_str!("../sql/reconciliations_query.sql"),
        params!["c", "r", "k", 0, 100],
    );
    assert!(
        trail.contains("idem_records_reconciliations_record"),
        "{trail}"
    );
    let purge = plan(
        include_str!("../sql/reconciliations_purge.sql"),
        params![0, 10],
    );
    assert!(
        purge.contains("idem_records_reconciliations_kept"),
        "{purge}"
    );
    for statement in [
        include_str!("../sql/resolve_settle.sql"),
        include_str!("../sql/resolve_defer.sql"),
    ] {
        let fenced = plan(statement, params!["c", "r", "k", b"t", 0, b"d", b"x", 1]);
        assert!(
            fenced.contains("sqlite_autoindex_idem_records_1"),
            "{fenced}"
        );
    }
}
