//! Reading a stored row back into a `Record`: every column is checked, and anything that is not
//! what the store writes is `CorruptRecord` (C12), never "absent".

use crate::error::store_error;
use idem_core::store::{Doubt, Reconciliation};
use idem_core::store::{Record, RecordState};
use idem_core::{
    Error, FencingToken, Fingerprint, IdempotencyKey, RecordId, Scope, StoredResponse, Timestamp,
};
use idem_ops::{Listed, ListedState};
use idem_ops::{Noted, Provenance};
use sqlx::postgres::PgRow;
use sqlx::Row;

/// PostgreSQL's epoch, 2000-01-01, in milliseconds after the Unix epoch.
const POSTGRES_EPOCH_MS: i64 = 946_684_800_000;

/// The instant in column `name`, which the statement sends as `timestamptz_send(t)`: the
/// timestamp's 8-byte binary form (microseconds since 2000-01-01, big endian), whichever
/// protocol carried it, so the server converts nothing. In milliseconds since the Unix epoch,
/// rounded down; `None` for SQL `NULL` and for an infinite timestamp. Anything but 8 bytes is
/// [`Error::CorruptRecord`].
pub(crate) fn instant(row: &PgRow, name: &str) -> Result<Option<i64>, Error> {
    let Some(sent) = row
        .try_get::<Option<Vec<u8>>, _>(name)
        .map_err(corrupt_or_store)?
    else {
        return Ok(None);
    };
    <[u8; 8]>::try_from(sent.as_slice())
        .map(|bytes| unix_millis(i64::from_be_bytes(bytes)))
        .map_err(|_| corrupt(format!("{name} is {} bytes, not a timestamp", sent.len())))
}

/// The finite instant in column `name` ([`instant`]); `NULL` or infinity is
/// [`Error::CorruptRecord`]: every instant a decision reads is finite.
pub(crate) fn required_instant(row: &PgRow, name: &str) -> Result<i64, Error> {
    instant(row, name)?.ok_or_else(|| corrupt(format!("no finite {name}")))
}

/// PostgreSQL's microseconds since 2000-01-01 as milliseconds since the Unix epoch, rounded
/// down; `None` for `infinity` and `-infinity` (`i64::MAX`, `i64::MIN`).
fn unix_millis(micros: i64) -> Option<i64> {
    match micros {
        i64::MAX | i64::MIN => None,
        micros => Some(micros.div_euclid(1000) + POSTGRES_EPOCH_MS),
    }
}

/// Reads fingerprint, token, state, deadline_at and response (by name). The response is `None`
/// where the statement did not fetch it (another fingerprint, or in progress).
pub(crate) fn decode(row: &PgRow) -> Result<Record<Option<Vec<u8>>>, Error> {
    let fingerprint: Vec<u8> = row.try_get("fingerprint").map_err(corrupt_or_store)?;
    let token: Vec<u8> = row.try_get("token").map_err(corrupt_or_store)?;
    let state: i16 = row.try_get("state").map_err(corrupt_or_store)?;
    let deadline = required_instant(row, "deadline_at")?;
    let response: Option<Vec<u8>> = row.try_get("response").map_err(corrupt_or_store)?;
    let deadline = u64::try_from(deadline)
        .map(Timestamp::from_millis)
        .map_err(|_| corrupt(format!("deadline {deadline} before 1970")))?;
    let state = match state {
        0 if response.is_none() => RecordState::InProgress {
            lease_until: deadline,
        },
        0 => return Err(corrupt("an in-progress row with a response".to_owned())),
        1 => RecordState::Completed {
            response,
            expires_at: deadline,
        },
        other => return Err(corrupt(format!("state {other}"))),
    };
    Ok(Record {
        fingerprint: Fingerprint::from_slice(&fingerprint)?,
        token: FencingToken::from_slice(&token)?,
        state,
    })
}

/// A completed record's response, which the statement fetched.
pub(crate) fn fetched(response: Option<Vec<u8>>) -> Result<Vec<u8>, Error> {
    response.ok_or_else(|| corrupt("a completed row without a response".to_owned()))
}

/// Reads what a store keeps for operators, by name: reserved_ms (0 for unknown), completed_ms
/// and holder (NULL for unknown). Each is read on its own and none fails the read (operators
/// read them, no decision does): an unreadable time is unknown, an unreadable holder is
/// [`Noted::Unreadable`]; a completion time is shown only for a completed record.
pub(crate) fn decode_provenance(row: &PgRow, is_completed: bool) -> Provenance {
    let millis = |name: &str| -> Option<Timestamp> {
        let ms: Option<i64> = row.try_get(name).ok().flatten();
        ms.filter(|ms| *ms > 0)
            .and_then(|ms| u64::try_from(ms).ok())
            .map(Timestamp::from_millis)
    };
    let holder = match row.try_get::<Option<String>, _>("holder") {
        Ok(text) => Noted::holder(text.as_deref()),
        Err(e) => Noted::unreadable(&e.to_string()),
    };
    Provenance {
        reserved_at: millis("reserved_ms"),
        completed_at: millis("completed_ms").filter(|_| is_completed),
        holder,
    }
}

/// Reads the mark of an answer in doubt and its check time, by name (`doubt`,
/// `doubt_check_ms`), for `inspect`: `None` for a record without a mark; a mark that does not
/// decode, or a check time that is not a time, is [`Error::CorruptRecord`] (a reconciler
/// decides on them).
pub(crate) fn decode_doubt(row: &PgRow) -> Result<(Option<Doubt>, Option<Timestamp>), Error> {
    let doubt: Option<Vec<u8>> = row.try_get("doubt").map_err(corrupt_or_store)?;
    let Some(doubt) = doubt else {
        return Ok((None, None));
    };
    let doubt = Doubt::decode(&doubt)?;
    let check_ms: Option<i64> = row.try_get("doubt_check_ms").map_err(corrupt_or_store)?;
    let check_at = check_ms
        .map(|ms| {
            u64::try_from(ms)
                .map(Timestamp::from_millis)
                .map_err(|_| corrupt(format!("doubt_check_at {ms} before 1970")))
        })
        .transpose()?;
    Ok((Some(doubt), check_at))
}

/// [`decode_doubt`] for a listing, which never fails on it: a mark that does not decode is
/// [`Noted::Unreadable`], a check time that is not a time is unknown.
fn listed_doubt(row: &PgRow) -> (Option<Noted<Doubt>>, Option<Timestamp>) {
    let doubt = match row.try_get::<Option<Vec<u8>>, _>("doubt") {
        Ok(None) => return (None, None),
        Ok(Some(bytes)) => match Doubt::decode(&bytes) {
            Ok(doubt) => Noted::Known(doubt),
            Err(error) => Noted::Unreadable(error.to_string()),
        },
        Err(error) => Noted::Unreadable(error.to_string()),
    };
    let check_ms: Option<i64> = row.try_get("doubt_check_ms").ok().flatten();
    let check_at = check_ms
        .and_then(|ms| u64::try_from(ms).ok())
        .map(Timestamp::from_millis);
    (Some(doubt), check_at)
}

/// Reads an audit trail row (`reconciliations_query.sql`): when the decision was applied
/// (`at_ms`) and the entry's bytes; anything else is [`Error::CorruptRecord`].
pub(crate) fn decode_reconciliation(row: &PgRow) -> Result<Reconciliation, Error> {
    let at: i64 = row.try_get("at_ms").map_err(corrupt_or_store)?;
    let at = u64::try_from(at)
        .map(Timestamp::from_millis)
        .map_err(|_| corrupt(format!("reconciliation at {at} before 1970")))?;
    let entry: Vec<u8> = row.try_get("entry").map_err(corrupt_or_store)?;
    Reconciliation::decode(at, &entry)
}

/// Reads a listing row (`list_in_progress.sql`, `list_completed.sql`, `list_key.sql`,
/// `list_in_doubt.sql`): consumer, route, key, state, deadline_ms, status_prefix (the first
/// bytes of a completed record's response), the provenance columns, and the mark of an answer in
/// doubt with its check time (NULL for none).
pub(crate) fn decode_listed(row: &PgRow) -> Result<Listed, Error> {
    let text =
        |name: &str| -> Result<String, Error> { row.try_get(name).map_err(corrupt_or_store) };
    let (consumer, route, key) = (text("consumer")?, text("route")?, text("key")?);
    let id = RecordId::new(
        Scope::new(&consumer, &route).map_err(|e| corrupt(format!("scope: {e}")))?,
        IdempotencyKey::new(&key).map_err(|e| corrupt(format!("key: {e}")))?,
    );
    let millis = |name: &str| -> Result<Timestamp, Error> {
        let ms: Option<i64> = row.try_get(name).map_err(corrupt_or_store)?;
        ms.and_then(|ms| u64::try_from(ms).ok())
            .map(Timestamp::from_millis)
            .ok_or_else(|| corrupt(format!("{name} {ms:?}")))
    };
    let deadline = millis("deadline_ms")?;
    let prefix: Option<Vec<u8>> = row.try_get("status_prefix").map_err(corrupt_or_store)?;
    let state: i16 = row.try_get("state").map_err(corrupt_or_store)?;
    let state = match (state, prefix) {
        (1, Some(prefix)) => ListedState::Completed {
            status: StoredResponse::status_of(&prefix)?,
            expires_at: deadline,
        },
        (1, None) => return Err(corrupt("a completed row without a response".to_owned())),
        (0, _) => ListedState::InProgress {
            lease_until: deadline,
        },
        (other, _) => return Err(corrupt(format!("state {other}"))),
    };
    let provenance = decode_provenance(row, matches!(state, ListedState::Completed { .. }));
    let (doubt, check_at) = listed_doubt(row);
    Ok(Listed {
        id,
        reserved_at: provenance.reserved_at,
        completed_at: provenance.completed_at,
        holder: provenance.holder,
        state,
        doubt,
        check_at,
    })
}

fn corrupt_or_store(error: sqlx::Error) -> Error {
    match error {
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
            corrupt(format!("column does not decode: {error}"))
        }
        other => store_error(other),
    }
}

fn corrupt(why: String) -> Error {
    Error::CorruptRecord(format!("postgres row: {why}"))
}

#[cfg(test)]
mod tests {
    use super::unix_millis;

    #[test]
    fn c11_instants_are_rounded_down_to_the_millisecond() {
        assert_eq!(unix_millis(0), Some(946_684_800_000), "2000-01-01");
        assert_eq!(unix_millis(999), Some(946_684_800_000));
        assert_eq!(unix_millis(1_000), Some(946_684_800_001));
        assert_eq!(
            unix_millis(-1),
            Some(946_684_799_999),
            "before 2000, down too"
        );
        assert_eq!(unix_millis(-946_684_800_000_000), Some(0), "the Unix epoch");
        assert_eq!(unix_millis(i64::MAX), None, "infinity");
        assert_eq!(unix_millis(i64::MIN), None, "-infinity");
    }
}
