//! The effect of the other senders' events (Standard Webhooks, GitHub, Shopify): one row in
//! `received_events` per processed event, written in ONE SQLite transaction with the inbox's
//! acknowledgement. The table has no unique constraint on purpose: a second execution of one
//! event would show as a second row, so its row count is the number of times events ran. A
//! Standard Webhooks `charge.succeeded` also marks its charge paid (`charges.rs`) in the same
//! transaction.

use crate::charges::{self, PaidCharge};
use crate::shop::BoxError;
use idem::sqlite::rusqlite::{params, TransactionBehavior};
use idem::sqlite::SqliteStore;
use idem::Completion;
use std::time::{SystemTime, UNIX_EPOCH};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS received_events (
    source TEXT NOT NULL,
    event_id TEXT NOT NULL,
    event_type TEXT,
    received INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS received_events_by_source ON received_events (source, event_id);";

/// Creates the table (what exists is kept).
pub(crate) async fn open(store: &SqliteStore) -> Result<(), BoxError> {
    store.try_call(|db| db.execute_batch(SCHEMA)).await?;
    Ok(())
}

/// An event to record.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    /// The inbox's source (`github`, `shopify`, `standard-webhooks`).
    pub source: &'static str,
    /// The sender's event id.
    pub event_id: String,
    /// Its type, when the sender names one.
    pub event_type: Option<String>,
    /// The charge it reports paid (a Standard Webhooks `charge.succeeded`).
    pub paid: Option<PaidCharge>,
}

/// Records `event` (and marks its charge paid, if it reports one) and writes the inbox's
/// acknowledgement (`completion`, with `complete_in`) in one transaction: all commit, or none.
pub(crate) async fn record(
    store: &SqliteStore,
    completion: Completion,
    event: Received,
) -> Result<(), BoxError> {
    let writer = store.clone();
    store
        .call(move |db| -> Result<(), BoxError> {
            let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = unix_now();
            tx.execute(
                "INSERT INTO received_events (source, event_id, event_type, received) VALUES (?1, ?2, ?3, ?4)",
                params![event.source, event.event_id, event.event_type, now],
            )?;
            if let Some(paid) = &event.paid {
                charges::mark_paid(&tx, paid, &event.event_id, now)?;
            }
            writer.complete_in(&tx, &completion)?; // LeaseLost: roll back
            tx.commit()?;
            Ok(())
        })
        .await?
}

/// How many rows `source` has, and how many distinct event ids among them (test hooks).
pub(crate) async fn counts(store: &SqliteStore, source: String) -> Result<(i64, i64), BoxError> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || -> Result<(i64, i64), BoxError> {
        let db = store.connect()?;
        Ok(db.query_row(
            "SELECT count(*), count(DISTINCT event_id) FROM received_events WHERE source = ?1",
            [&source],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )?)
    })
    .await?
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}
