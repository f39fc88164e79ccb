//! Records in doubt on PostgreSQL beyond the conformance suite (store rules 6 and 7; schema
//! version 4): a table at version 3 with rows migrates in place and keeps them, a decision is
//! fenced on the mark exactly as read (a changed mark: nothing written, no audit entry), directly
//! and through PgBouncer, and the purge deletes expired audit entries within its bound.

mod common;

use common::{bouncer_url, pg_url, store_on};
use idem_core::store::Deadline;
use idem_core::store::Doubt;
use idem_core::store::{RecordState, Store};
use idem_core::{Failure, FencingToken, Idempotency, Request, StoredResponse};
use idem_ops::reconcile::{Decided, Finding, InDoubt};
use idem_ops::{ListQuery, Operator};
use idem_postgres::sqlx::{self, AssertSqlSafe, Row};
use idem_postgres::{Isolation, PgStore, StatementMode, SCHEMA_VERSION};

/// Runs `sql` on the store's pool (the simple protocol: one message, several statements).
async fn run(store: &PgStore, sql: &str) -> Vec<sqlx::postgres::PgRow> {
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .fetch_all(store.pool())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// The audit trail's table beside the store's: `"schema"."<table>_reconciliations"`.
fn trail_table(store: &PgStore) -> String {
    let records = store.table();
    format!(
        "{}_reconciliations\"",
        records.strip_suffix('"').unwrap_or(&records)
    )
}

/// How many audit entries the trail holds, expired or not.
async fn entries(store: &PgStore) -> i64 {
    let rows = run(
        store,
        &format!("SELECT count(*) FROM {}", trail_table(store)),
    )
    .await;
    rows[0].get(0)
}

fn request(idem: &Idempotency<PgStore>, key: &str) -> Request {
    idem.request("acct_doubt", "POST", "/charges")
        .key(Some(key))
        .body(b"{}")
        .build()
        .expect("request")
}

/// Runs `request` to an unknown outcome and reads the record in doubt it left.
async fn in_doubt(idem: &Idempotency<PgStore>, request: &Request) -> InDoubt {
    let _ = idem
        .run(request, |_ctx| async {
            Err::<StoredResponse, _>(Failure::unknown("the provider timed out").noting("net-1"))
        })
        .await;
    idem_ops::reconcile::in_doubt(idem, request.id())
        .await
        .expect("read")
        .expect("in doubt")
}

/// Puts `mark` in place of the record's mark, as another decider's write would.
async fn set_mark(store: &PgStore, request: &Request, mark: &[u8]) {
    let hex: String = mark.iter().map(|b| format!("{b:02x}")).collect();
    let done = sqlx::raw_sql(AssertSqlSafe(format!(
        "UPDATE {} SET doubt = '\\x{hex}'::bytea WHERE consumer = 'acct_doubt' AND key = '{}'",
        store.table(),
        request.id().key()
    )))
    .execute(store.pool())
    .await
    .expect("update");
    assert_eq!(done.rows_affected(), 1);
}

/// Store rule 7: a decision whose mark changed since it was read (another decider moved it on)
/// is contested, whichever change it makes: the record keeps its answer and its new mark, and
/// the trail gets no entry. With the mark as read it applies, with exactly one entry.
async fn a_decision_is_fenced_on_the_mark_as_read(store: PgStore) {
    let idem = Idempotency::new(store.clone());
    let charge = request(&idem, &format!("fence-{}", FencingToken::generate()));
    let read = in_doubt(&idem, &charge).await;
    let moved_on = Doubt {
        attempts: read.doubt.attempts + 7,
        ..read.doubt.clone()
    };
    set_mark(&store, &charge, &moved_on.encode()).await;
    let findings = [
        Finding::settled(StoredResponse::new(201, "charged")),
        Finding::not_happened(),
        Finding::still_unknown(),
    ];
    for finding in findings {
        let resolved = idem_ops::reconcile::resolve(&idem, &read, finding.clone(), "operator")
            .await
            .expect("resolve");
        assert_eq!(resolved, None, "{finding:?}");
        assert_eq!(entries(&store).await, 0, "no entry for {finding:?}");
        let now = idem_ops::reconcile::in_doubt(&idem, charge.id())
            .await
            .expect("read")
            .expect("still in doubt");
        assert_eq!(now.doubt, moved_on);
        assert_eq!(now.answer.status, 500, "the answer in doubt stays");
    }
    // The mark as read again: the decision applies, with its one entry.
    set_mark(&store, &charge, &read.doubt.encode()).await;
    let resolved = idem_ops::reconcile::resolve(
        &idem,
        &read,
        Finding::settled(StoredResponse::new(201, "charged")),
        "operator",
    )
    .await
    .expect("resolve");
    assert!(
        matches!(resolved, Some(Decided::Settled { .. })),
        "{resolved:?}"
    );
    assert_eq!(entries(&store).await, 1);
    let record = store
        .lookup(charge.id(), Deadline::default())
        .await
        .expect("lookup")
        .expect("settled");
    assert!(
        matches!(&record.state, RecordState::Completed { response, .. } if response.status == 201)
    );
    let again = idem_ops::reconcile::resolve(&idem, &read, Finding::not_happened(), "operator")
        .await
        .expect("resolve");
    assert_eq!(again, None, "no mark left to decide on");
    assert_eq!(entries(&store).await, 1);
}

#[tokio::test]
async fn c06_a_decision_is_fenced_on_the_mark_as_read() {
    let store = store_on(&pg_url(), StatementMode::Prepared, Isolation::ReadCommitted).await;
    a_decision_is_fenced_on_the_mark_as_read(store).await;
}

#[tokio::test]
async fn c06_a_decision_is_fenced_on_the_mark_as_read_through_pgbouncer() {
    let store = store_on(
        &bouncer_url(),
        StatementMode::Simple,
        Isolation::ReadCommitted,
    )
    .await;
    a_decision_is_fenced_on_the_mark_as_read(store).await;
}

/// Store rules 4 and 7: the purge deletes expired audit entries with what its batch leaves after
/// the expired records, never more than the batch, and counts them.
#[tokio::test]
async fn c10_the_purge_deletes_expired_entries_within_its_bound() {
    let store = store_on(&pg_url(), StatementMode::Prepared, Isolation::ReadCommitted).await;
    let idem = Idempotency::new(store.clone());
    for i in 0..3 {
        let charge = request(&idem, &format!("purge-{i}"));
        let case = in_doubt(&idem, &charge).await;
        let resolved =
            idem_ops::reconcile::resolve(&idem, &case, Finding::not_happened(), "operator")
                .await
                .expect("resolve");
        assert_eq!(resolved, Some(Decided::Released));
    }
    assert_eq!(entries(&store).await, 3);
    assert_eq!(
        store
            .purge_expired(10, Deadline::default())
            .await
            .expect("purge"),
        0,
        "kept"
    );
    // Their retention passed (the policy keeps them at least a second).
    run(
        &store,
        &format!(
            "UPDATE {} SET kept_until = clock_timestamp() - interval '1 second'",
            trail_table(&store)
        ),
    )
    .await;
    let first = request(&idem, "purge-0");
    assert!(
        store
            .reconciliations(first.id(), Deadline::default())
            .await
            .expect("trail")
            .is_empty(),
        "an expired entry is not shown"
    );
    assert_eq!(
        store
            .purge_expired(2, Deadline::default())
            .await
            .expect("purge"),
        2,
        "bounded"
    );
    assert_eq!(entries(&store).await, 1);
    assert_eq!(
        store
            .purge_expired(2, Deadline::default())
            .await
            .expect("purge"),
        1
    );
    assert_eq!(entries(&store).await, 0);
}

/// A new schema whose `idem_records` is at schema version 3, as the release before records in
/// doubt left it, with a running reservation, a completed record and an expired one.
async fn version_3_store() -> (PgStore, String) {
    let schema = format!("v3_{}", FencingToken::generate());
    let store = PgStore::builder()
        .schema(&schema)
        .connect(&pg_url())
        .await
        .expect("connect");
    let done = StoredResponse::new(201, "{}").encode().expect("encode");
    let hex = done.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let holder = idem_ops::Holder::this_process().encode();
    let hex_of = |bytes: &[u8]| -> String { bytes.iter().map(|b| format!("{b:02x}")).collect() };
    let fingerprint = hex_of(
        idem_core::Fingerprint::builder()
            .body(b"{}")
            .finish()
            .as_bytes(),
    );
    let tokens: Vec<String> = (0..3)
        .map(|_| hex_of(FencingToken::generate().as_bytes()))
        .collect();
    run(
        &store,
        &format!(
            "CREATE SCHEMA \"{schema}\"; SET LOCAL search_path = \"{schema}\";\n{};\n{}\n{}\n{}\n\
             INSERT INTO idem_schema_migrations (table_name, version) VALUES \
             ('{schema}.idem_records', 1), ('{schema}.idem_records', 2), ('{schema}.idem_records', 3);\n\
             INSERT INTO idem_records (consumer, route, key, fingerprint, token, state, deadline, response, reserved_at, completed_at, holder) VALUES \
             ('acct', 'POST /charges', 'running', '\\x{fingerprint}', '\\x{t0}', 0, '2100-01-01', NULL, '2020-01-01', NULL, '{holder}'), \
             ('acct', 'POST /charges', 'done', '\\x{fingerprint}', '\\x{t1}', 1, '2100-01-01', '\\x{hex}', '2020-01-02', '2020-01-03', '{holder}'), \
             ('acct', 'POST /charges', 'expired', '\\x{fingerprint}', '\\x{t2}', 1, '2000-01-01', '\\x{hex}', '1999-12-31', '1999-12-31', NULL);",
            include_str!("../sql/migrations_table.sql"),
            include_str!("../sql/migrations/0001_create_records.sql"),
            include_str!("../sql/migrations/0002_reservation_time.sql"),
            include_str!("../sql/migrations/0003_completion_time_and_holder.sql"),
            t0 = tokens[0],
            t1 = tokens[1],
            t2 = tokens[2],
        ),
    )
    .await;
    (store, schema)
}

/// How many CHECK constraints the table `qualified` (`"schema"."table"`) has.
async fn checks(store: &PgStore, qualified: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_constraint WHERE conrelid = to_regclass($1) AND contype = 'c'",
    )
    .bind(qualified)
    .fetch_one(store.pool())
    .await
    .expect("constraints")
}

/// Whether the index `name` of `schema` exists and is valid.
async fn index_is_valid(store: &PgStore, schema: &str, name: &str) -> Option<bool> {
    sqlx::query_scalar("SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1)")
        .bind(format!("\"{schema}\".\"{name}\""))
        .fetch_optional(store.pool())
        .await
        .expect("index")
}

/// Schema version 4 on a table of version 3 with rows: the columns, the in-doubt index and the
/// audit trail are added, every row is kept as it was and none is in doubt; then the table
/// works for records in doubt, and a second migrate changes nothing. Versions 5 and 6 on the way:
/// no index on a column the completion changes, no CHECK on `state`.
#[tokio::test]
async fn a_version_3_table_with_rows_migrates_to_version_4_and_keeps_them() {
    let (store, schema) = version_3_store().await;
    let id = |key: &str| {
        idem_core::RecordId::new(
            idem_core::Scope::new("acct", "POST /charges").expect("scope"),
            idem_core::IdempotencyKey::new(key).expect("key"),
        )
    };
    let before: Vec<_> = {
        let mut records = Vec::new();
        for key in ["running", "done", "expired"] {
            records.push(
                store
                    .lookup(&id(key), Deadline::default())
                    .await
                    .expect("lookup"),
            );
        }
        records
    };
    assert!(before.iter().all(Option::is_some), "{before:?}");
    let table = format!("\"{schema}\".idem_records");
    // A constraint of the operator's own on the column, named like ours but for its prefix.
    run(
        &store,
        &format!("ALTER TABLE {table} ADD CONSTRAINT app_state_check CHECK (state >= 0)"),
    )
    .await;
    assert_eq!(
        checks(&store, &table).await,
        2,
        "version 1's CHECK on state, and the operator's"
    );

    store
        .migrate()
        .await
        .expect("migrates version 3 to the latest");
    let version: i64 = run(
        &store,
        &format!(
            "SELECT max(version) FROM \"{schema}\".idem_schema_migrations WHERE table_name = '{schema}.idem_records'"
        ),
    )
    .await[0]
        .get(0);
    assert_eq!((version, SCHEMA_VERSION), (6, 6));
    // Version 6: not its CHECK on state (every INSERT and UPDATE would parse it again); the
    // operator's stays.
    assert_eq!(checks(&store, &table).await, 1);
    let kept: String = run(
        &store,
        &format!("SELECT conname::text FROM pg_constraint WHERE conrelid = '{table}'::regclass AND contype = 'c'"),
    )
    .await[0]
        .get(0);
    assert_eq!(kept, "app_state_check");
    // Version 5: the indexes on columns the completion changes are gone.
    for index in ["idem_records_deadline", "idem_records_in_progress"] {
        assert_eq!(
            index_is_valid(&store, &schema, index).await,
            None,
            "{index}"
        );
    }
    for index in [
        "idem_records_in_doubt",
        "idem_records_reserved",
        "idem_records_key",
        "idem_records_trail_record",
        "idem_records_trail_kept",
    ] {
        assert_eq!(
            index_is_valid(&store, &schema, index).await,
            Some(true),
            "{index}"
        );
    }
    for (key, was) in ["running", "done", "expired"].iter().zip(&before) {
        let now = store
            .lookup(&id(key), Deadline::default())
            .await
            .expect("lookup");
        assert_eq!(&now, was, "{key} kept as it was");
        let inspected = store
            .inspect(&id(key), Deadline::default())
            .await
            .expect("inspect")
            .expect("kept");
        assert_eq!((inspected.doubt, inspected.check_at), (None, None), "{key}");
        assert!(inspected.provenance.reserved_at.is_some(), "{key}");
    }
    let marked = run(
        &store,
        &format!(
            "SELECT count(*) FROM \"{schema}\".idem_records WHERE doubt IS NOT NULL OR doubt_check_at IS NOT NULL"
        ),
    )
    .await;
    assert_eq!(marked[0].get::<i64, _>(0), 0);
    let stats = store.stats(Deadline::default()).await.expect("stats");
    assert_eq!(
        (
            stats.in_progress,
            stats.completed,
            stats.expired,
            stats.in_doubt
        ),
        (1, 1, 1, 0)
    );
    assert!(store
        .list(&ListQuery::in_doubt(), Deadline::default())
        .await
        .expect("list")
        .records
        .is_empty());
    let listed = store
        .list(
            &ListQuery::completed("acct").expect("consumer"),
            Deadline::default(),
        )
        .await
        .expect("list");
    assert_eq!(listed.records.len(), 1);
    assert_eq!(
        (&listed.records[0].doubt, listed.records[0].check_at),
        (&None, None)
    );
    assert_eq!(entries(&store).await, 0, "an empty trail");

    // The migrated table keeps records in doubt and decides on them.
    let idem = Idempotency::new(store.clone());
    let charge = idem
        .request("acct", "POST", "/charges")
        .key(Some("after-the-upgrade"))
        .body(b"{}")
        .build()
        .expect("request");
    let case = in_doubt(&idem, &charge).await;
    let listed = store
        .list(&ListQuery::in_doubt(), Deadline::default())
        .await
        .expect("list");
    assert_eq!(listed.records.len(), 1);
    assert_eq!(listed.records[0].check_at, case.check_at);
    assert_eq!(
        store
            .stats(Deadline::default())
            .await
            .expect("stats")
            .in_doubt,
        1
    );
    let resolved = idem_ops::reconcile::resolve(&idem, &case, Finding::not_happened(), "operator")
        .await
        .expect("resolve");
    assert_eq!(resolved, Some(Decided::Released));
    assert_eq!(
        store
            .reconciliations(charge.id(), Deadline::default())
            .await
            .expect("trail")
            .len(),
        1
    );

    store.migrate().await.expect("again");
    for (key, was) in ["running", "done", "expired"].iter().zip(&before) {
        assert_eq!(
            &store
                .lookup(&id(key), Deadline::default())
                .await
                .expect("lookup"),
            was,
            "{key}"
        );
    }
}

/// The audit trail's name is derived from the store's table, in its schema, and leaves room for
/// itself: a table name of 47 bytes is the longest.
#[tokio::test]
async fn the_trail_follows_the_table_name() {
    let table = format!("t{}", "x".repeat(46));
    let store = PgStore::builder()
        .schema(common::SCHEMA)
        .table(&table)
        .max_connections(2)
        .connect(&pg_url())
        .await
        .expect("47 bytes fit");
    store.migrate().await.expect("migrate");
    assert_eq!(entries(&store).await, 0);
    let qualified = format!("\"{}\".\"{table}\"", common::SCHEMA);
    assert_eq!(
        checks(&store, &qualified).await,
        0,
        "version 6 under any name"
    );
    let refused = PgStore::builder()
        .table(&format!("{table}x"))
        .connect(&pg_url())
        .await
        .expect_err("48 bytes do not");
    assert!(refused.to_string().contains("too long"), "{refused}");
}
