//! The inbox on PostgreSQL under attack: one event delivered many times at once through
//! several stores (several processes' pools) on one table, handlers that write their effect
//! and the acknowledgement in one transaction, some failing, some panicking, under a short
//! lease. Every event's effect commits exactly once, and a 2xx is only ever answered for an
//! event whose effect is committed. The server is `IDEM_PG_URL` (a missing server is a
//! failure, never a skip).
#![cfg(feature = "postgres")]

use idem_core::{FencingToken, Idempotency, Policy};
use idem_inbox::{Ack, Delivery, Inbox, Receipt};
use idem_postgres::sqlx::{self, AssertSqlSafe};
use idem_postgres::{Isolation, PgStore};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const SCHEMA: &str = "idem_test";

fn pg_url() -> String {
    std::env::var("IDEM_PG_URL").expect("IDEM_PG_URL is not set: run `bash scripts/test`")
}

async fn store_on(table: &str) -> PgStore {
    let store = PgStore::builder()
        .schema(SCHEMA)
        .table(table)
        .isolation(Isolation::ReadCommitted)
        .max_connections(6)
        .connect(&pg_url())
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    store
}

/// C4, C6, C8: 8 events x 24 concurrent deliveries through 4 stores on one table, a third of
/// the first attempts failing (before or after writing their effect, rolled back) or
/// panicking: each event's effect is committed once, and every acknowledged delivery's event
/// has its effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c04_pg_concurrent_deliveries_through_several_stores_commit_each_effect_once() {
    let table = format!("t_{}", FencingToken::generate());
    let effects = format!("{SCHEMA}.{table}_effects");
    let mut inboxes = Vec::new();
    for _ in 0..4 {
        let store = store_on(&table).await;
        let policy = Policy::default().lease(Duration::from_millis(400));
        inboxes.push(Inbox::new(
            Idempotency::with_policy(store, policy).expect("policy"),
        ));
    }
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {effects} (event TEXT NOT NULL)"
    )))
    .execute(inboxes[0].idem().store().pool())
    .await
    .expect("effects table");

    let attempts = Arc::new(AtomicUsize::new(0));
    let run_round = |round: usize| {
        let mut tasks = Vec::new();
        for e in 0..8usize {
            for d in 0..24usize {
                let inbox = inboxes[(e + d) % inboxes.len()].clone();
                let effects = effects.clone();
                let attempts = Arc::clone(&attempts);
                tasks.push(tokio::spawn(async move {
                    let id = format!("evt_{e}");
                    let body = format!(r#"{{"id":"{id}","pending_webhooks":{d}}}"#);
                    let delivery = Delivery::trusted("stripe", body.as_bytes());
                    let event = inbox
                        .event_json(&delivery, id.as_bytes(), &["pending_webhooks"])
                        .expect("event");
                    let id2 = id.clone();
                    let receipt = inbox
                        .receive(&event, move |ctx| async move {
                            let n = attempts.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis((n % 7 * 40) as u64)).await;
                            let store = ctx.idem().store().clone();
                            let mut tx = store.pool().begin().await?;
                            sqlx::query(AssertSqlSafe(format!(
                                "INSERT INTO {effects} (event) VALUES ($1)"
                            )))
                            .bind(&id2)
                            .execute(&mut *tx)
                            .await?;
                            if round == 0 && n % 5 == 1 {
                                return Err::<Ack, Box<dyn std::error::Error + Send + Sync>>(
                                    "failed after the effect, rolled back".into(),
                                );
                            }
                            if round == 0 && n % 5 == 2 {
                                panic!("a handler panics mid-transaction");
                            }
                            let completion = ctx.completion();
                            store
                                .complete_in(&mut tx, &completion)
                                .await
                                .map_err(|e| e.to_string())?;
                            tx.commit().await?;
                            Ok(Ack::Written(completion))
                        })
                        .await;
                    (id, receipt)
                }));
            }
        }
        tasks
    };
    let count = |id: String| {
        let effects = effects.clone();
        let pool = inboxes[0].idem().store().pool().clone();
        async move {
            let n: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT count(*) FROM {effects} WHERE event = $1"
            )))
            .bind(id)
            .fetch_one(&pool)
            .await
            .expect("count");
            n
        }
    };
    let mut done = std::collections::HashSet::new();
    for round in 0..40 {
        for task in run_round(round) {
            let (id, receipt) = task.await.expect("join");
            match receipt {
                Ok(receipt) => {
                    if receipt.is_acknowledged() {
                        assert_eq!(count(id.clone()).await, 1, "{id} acknowledged: {receipt:?}");
                        done.insert(id);
                    } else {
                        assert!(
                            matches!(receipt, Receipt::InProgress { .. } | Receipt::Failed(_)),
                            "{id}: {receipt:?}"
                        );
                    }
                }
                Err(error) => assert!(error.is_retryable(), "{id}: {error}"),
            }
        }
        if done.len() == 8 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(done.len(), 8, "every event processed in the end");
    for e in 0..8 {
        assert_eq!(count(format!("evt_{e}")).await, 1, "evt_{e}");
    }
}

/// An inbox over a new table with its trail, `evt_row` processed and its writes landed, and
/// a transaction on another pool holding the event's audit row (an operator's UPDATE, a
/// purge); then 12 duplicates delivered at once, each answered (the receipt and its time).
#[allow(clippy::type_complexity)]
async fn duplicates_while_the_audit_row_is_locked() -> (
    Inbox<PgStore>,
    Arc<idem_inbox::PgAudit>,
    sqlx::Transaction<'static, sqlx::Postgres>,
    Vec<(Result<Receipt, idem_core::Error>, Duration)>,
) {
    let table = format!("t_{}", FencingToken::generate());
    let store = store_on(&table).await;
    let audit = Arc::new(idem_inbox::PgAudit::open(&store).await.expect("audit"));
    let policy = Policy::default().store_timeout(ROW_BUDGET);
    let inbox = Inbox::new(Idempotency::with_policy(store, policy).expect("policy"))
        .with_audit(audit.clone());
    let event = inbox
        .event_json(
            &Delivery::trusted("stripe", br#"{"id":"evt_row"}"#),
            b"evt_row",
            &[],
        )
        .expect("event");
    let first = inbox
        .receive(&event, |_ctx| async { Ok::<_, std::io::Error>(Ack::Done) })
        .await
        .expect("received");
    assert!(matches!(first, Receipt::Processed(_)), "{first:?}");
    inbox.drain_audit().await;

    let other = sqlx::PgPool::connect(&pg_url()).await.expect("other pool");
    let mut locker = other.begin().await.expect("begin");
    sqlx::query(AssertSqlSafe(format!(
        "SELECT 1 FROM {} FOR UPDATE",
        audit.table()
    )))
    .execute(&mut *locker)
    .await
    .expect("row lock");
    let mut tasks = Vec::new();
    for _ in 0..12 {
        let (inbox, event) = (inbox.clone(), event.clone());
        tasks.push(tokio::spawn(async move {
            let started = std::time::Instant::now();
            let r = inbox
                .receive(&event, |_ctx| async { Ok::<_, std::io::Error>(Ack::Done) })
                .await;
            (r, started.elapsed())
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.expect("join"));
    }
    let deliveries: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT deliveries::bigint FROM {}",
        audit.table()
    )))
    .fetch_one(&other)
    .await
    .expect("read beside the lock");
    assert_eq!(deliveries, 1, "the duplicates' writes wait for the lock");
    (inbox, audit, locker, answers)
}

/// The store budget of the locked-audit-row tests.
const ROW_BUDGET: Duration = Duration::from_millis(1500);

/// C5: duplicates of a processed event are answered from a read while another transaction
/// holds the event's audit row: the trail's writes wait for that lock in the background, and
/// land, every delivery counted, once it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c05_pg_duplicates_are_answered_while_the_audit_row_is_locked() {
    use idem_inbox::{Audit, AuditOutcome};
    let (inbox, audit, locker, answers) = duplicates_while_the_audit_row_is_locked().await;
    locker.rollback().await.expect("unlock");
    for (r, took) in &answers {
        assert!(
            matches!(r, Ok(Receipt::Duplicate(_))) && *took < ROW_BUDGET / 3,
            "{r:?} after {took:?}"
        );
    }
    inbox.drain_audit().await;
    let far = idem_core::Timestamp::from_millis(4_102_444_800_000);
    let zero = idem_core::Timestamp::from_millis(0);
    let entries = audit.query("stripe", zero, far, 10).await.expect("query");
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].deliveries, 13, "{entries:?}");
    assert_eq!(entries[0].outcome, AuditOutcome::Processed);
}
