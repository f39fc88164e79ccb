//! The effect of a Standard Webhooks `charge.succeeded` (what the payments server emits through
//! its outbox, Stripe's shape: the charge under `data.object`): the charge is marked paid in
//! `paid_charges`, in the transaction that writes the event's row and the inbox's
//! acknowledgement (`events::record`). A charge's row counts the times it was processed
//! (`processed`), so a second processing of one event, or a second event for one charge, shows
//! as 2.

use crate::shop::BoxError;
use idem::sqlite::rusqlite::{params, Transaction};
use idem::sqlite::SqliteStore;
use serde_json::Value;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS paid_charges (
    charge_id TEXT PRIMARY KEY,
    -- The event (its webhook-id) that first marked it paid, and its type.
    event_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    -- How many times an event marked it paid: 1 unless something was processed twice.
    processed INTEGER NOT NULL,
    paid_at INTEGER NOT NULL
);";

/// The event type that marks a charge paid.
pub(crate) const CHARGE_SUCCEEDED: &str = "charge.succeeded";

/// Creates the table (what exists is kept).
pub(crate) async fn open(store: &SqliteStore) -> Result<(), BoxError> {
    store.try_call(|db| db.execute_batch(SCHEMA)).await?;
    Ok(())
}

/// A charge a verified event says succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PaidCharge {
    /// `data.object.id` (`ch_...`).
    pub charge_id: String,
    /// The event's `type`.
    pub event_type: String,
}

impl PaidCharge {
    /// The charge a verified body reports paid: a JSON event whose `type` is
    /// `charge.succeeded` with a string `data.object.id`; anything else marks nothing.
    pub(crate) fn from_body(body: &[u8]) -> Option<Self> {
        let event: Value = serde_json::from_slice(body).ok()?;
        let event_type = event.get("type")?.as_str()?;
        if event_type != CHARGE_SUCCEEDED {
            return None;
        }
        let charge_id = event.get("data")?.get("object")?.get("id")?.as_str()?;
        (!charge_id.is_empty()).then(|| PaidCharge {
            charge_id: charge_id.to_owned(),
            event_type: event_type.to_owned(),
        })
    }
}

/// Marks `paid` paid by `event_id` in `tx`: its row, or one more processing on it.
pub(crate) fn mark_paid(
    tx: &Transaction<'_>,
    paid: &PaidCharge,
    event_id: &str,
    now: i64,
) -> Result<(), BoxError> {
    tx.execute(
        "INSERT INTO paid_charges (charge_id, event_id, event_type, processed, paid_at)
         VALUES (?1, ?2, ?3, 1, ?4)
         ON CONFLICT (charge_id) DO UPDATE SET processed = processed + 1",
        params![paid.charge_id, event_id, paid.event_type, now],
    )?;
    Ok(())
}

/// Every paid charge: its id, the event that marked it, its type and how many times it was
/// processed, by charge id (test hooks).
pub(crate) async fn list(
    store: &SqliteStore,
) -> Result<Vec<(String, String, String, i64)>, BoxError> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || -> Result<_, BoxError> {
        let db = store.connect()?;
        let mut statement = db.prepare(
            "SELECT charge_id, event_id, event_type, processed FROM paid_charges ORDER BY charge_id",
        )?;
        let rows = statement.query_map([], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    })
    .await?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charge_succeeded_names_its_charge_other_bodies_nothing() {
        let paid = PaidCharge::from_body(
            br#"{"id":"evt_1","type":"charge.succeeded","data":{"object":{"id":"ch_1"}}}"#,
        );
        assert_eq!(
            paid,
            Some(PaidCharge {
                charge_id: "ch_1".into(),
                event_type: "charge.succeeded".into()
            })
        );
        for body in [
            &br#"{"type":"charge.failed","data":{"object":{"id":"ch_1"}}}"#[..],
            br#"{"type":"charge.succeeded","data":{"object":{"id":7}}}"#,
            br#"{"type":"charge.succeeded","data":{}}"#,
            br#"{"type":"charge.succeeded","data":{"object":{"id":""}}}"#,
            b"not json",
        ] {
            assert_eq!(PaidCharge::from_body(body), None);
        }
    }
}
