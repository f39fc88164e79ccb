//! Reading a stored row back into a `Record`: every column is checked, and anything that is not
//! what the store writes is `CorruptRecord` (C12), never "absent".
//!
//! Both statements that read a record (`select_record.sql`, `decide_record.sql`) return
//! fingerprint, token, state, deadline, whether a response is stored, and the response where it
//! was fetched (`decide_record.sql` fetches it only when it can be replayed).

use crate::error::store_error;
use idem_core::store::{Doubt, Reconciliation};
use idem_core::store::{Record, RecordState};
use idem_core::{
    Error, FencingToken, Fingerprint, IdempotencyKey, RecordId, Scope, StoredResponse, Timestamp,
};
use idem_ops::{Listed, ListedState};
use idem_ops::{Noted, Provenance};
use rusqlite::types::ValueRef;
use rusqlite::Row;

/// Decodes a row; a completed record's response is `None` where it was not fetched.
pub(crate) fn decode_head<'r>(row: &'r Row<'_>) -> Result<Record<Option<&'r [u8]>>, Error> {
    let fingerprint = Fingerprint::from_slice(blob(row, 0, "fingerprint")?)?;
    let token = FencingToken::from_slice(blob(row, 1, "token")?)?;
    let deadline = millis_at(integer(row, 3, "deadline")?, "deadline")?;
    let no_response = integer(row, 4, "typeof(response)")? == 1;
    let state = match (integer(row, 2, "state")?, no_response) {
        (0, true) => RecordState::InProgress {
            lease_until: deadline,
        },
        (0, false) => return Err(corrupt("an in-progress row with a response".to_owned())),
        (1, false) => RecordState::Completed {
            response: match value(row, 5)? {
                ValueRef::Blob(bytes) => Some(bytes),
                ValueRef::Null => None,
                other => {
                    return Err(corrupt(format!(
                        "response column holds {:?}",
                        other.data_type()
                    )))
                }
            },
            expires_at: deadline,
        },
        (1, true) => return Err(corrupt("a completed row without a response".to_owned())),
        (state, _) => return Err(corrupt(format!("state {state}"))),
    };
    Ok(Record {
        fingerprint,
        token,
        state,
    })
}

/// Decodes a fetched response; one that should have been fetched and was not is corrupt.
pub(crate) fn decode_response(response: Option<&[u8]>) -> Result<StoredResponse, Error> {
    StoredResponse::decode(
        response.ok_or_else(|| corrupt("the response of a replay was not read".to_owned()))?,
    )
}

/// Decodes the whole row, response included (`select_record.sql`).
pub(crate) fn decode(row: &Row<'_>) -> Result<Record, Error> {
    decode_head(row)?.try_map_response(decode_response)
}

/// Decodes what a store keeps for operators: reserved_at (0 for unknown) at column `reserved`,
/// then completed_at and holder (NULL for unknown) at columns `completed` and `completed + 1`.
/// Each is read on its own and none fails the read (operators read them, no decision does):
/// an unreadable time is unknown, an unreadable holder is [`Noted::Unreadable`]; a completion
/// time is shown only for a completed record (`completed`).
pub(crate) fn decode_provenance(
    row: &Row<'_>,
    reserved: usize,
    completed: usize,
    is_completed: bool,
) -> Provenance {
    let millis = |index: usize| match row.get_ref(index) {
        Ok(ValueRef::Integer(at)) if at > 0 => u64::try_from(at).ok().map(Timestamp::from_millis),
        _ => None,
    };
    let holder = match row.get_ref(completed + 1) {
        Ok(ValueRef::Null) => Noted::Unknown,
        Ok(ValueRef::Text(text)) => Noted::holder(Some(&String::from_utf8_lossy(text))),
        Ok(other) => Noted::unreadable(&format!("a {} value", other.data_type())),
        Err(e) => Noted::unreadable(&e.to_string()),
    };
    Provenance {
        reserved_at: millis(reserved),
        completed_at: millis(completed).filter(|_| is_completed),
        holder,
    }
}

/// Decodes the mark of an answer in doubt at column `index` and its check time at `index + 1`
/// (`select_inspected.sql`), for `inspect`: `None` for a record without a mark; a mark that
/// does not decode, or a check time that is not a time, is [`Error::CorruptRecord`] (a
/// reconciler decides on them).
pub(crate) fn decode_doubt(
    row: &Row<'_>,
    index: usize,
) -> Result<(Option<Doubt>, Option<Timestamp>), Error> {
    let doubt = match value(row, index)? {
        ValueRef::Null => return Ok((None, None)),
        ValueRef::Blob(bytes) => Doubt::decode(bytes)?,
        other => {
            return Err(corrupt(format!(
                "doubt column holds {:?}",
                other.data_type()
            )))
        }
    };
    let check_at = match value(row, index + 1)? {
        ValueRef::Null => None,
        ValueRef::Integer(at) => Some(millis_at(at, "doubt_check_at")?),
        other => {
            return Err(corrupt(format!(
                "doubt_check_at column holds {:?}",
                other.data_type()
            )))
        }
    };
    Ok((Some(doubt), check_at))
}

/// [`decode_doubt`] for a listing, which never fails on it: a mark that does not decode is
/// [`Noted::Unreadable`], a check time that is not a time is unknown.
fn listed_doubt(row: &Row<'_>, index: usize) -> (Option<Noted<Doubt>>, Option<Timestamp>) {
    let doubt = match row.get_ref(index) {
        Ok(ValueRef::Null) => return (None, None),
        Ok(ValueRef::Blob(bytes)) => match Doubt::decode(bytes) {
            Ok(doubt) => Noted::Known(doubt),
            Err(error) => Noted::Unreadable(error.to_string()),
        },
        Ok(other) => Noted::Unreadable(format!("a {} value", other.data_type())),
        Err(error) => Noted::Unreadable(error.to_string()),
    };
    let check_at = match row.get_ref(index + 1) {
        Ok(ValueRef::Integer(at)) => u64::try_from(at).ok().map(Timestamp::from_millis),
        _ => None,
    };
    (Some(doubt), check_at)
}

/// Decodes a listing row (`list_in_progress.sql`, `list_completed.sql`, `list_key.sql`,
/// `list_in_doubt.sql`): consumer, route, key, reserved_at (0 for unknown), deadline, for a
/// completed record the first bytes of its response (enough for its status), completed_at,
/// holder, state, and the mark of an answer in doubt with its check time (NULL for none).
pub(crate) fn decode_listed(row: &Row<'_>) -> Result<Listed, Error> {
    let text = |index: usize, name: &str| match value(row, index)? {
        ValueRef::Text(bytes) => {
            std::str::from_utf8(bytes).map_err(|_| corrupt(format!("{name} is not UTF-8")))
        }
        other => Err(corrupt(format!(
            "{name} column holds {:?}",
            other.data_type()
        ))),
    };
    let id = RecordId::new(
        Scope::new(text(0, "consumer")?, text(1, "route")?)
            .map_err(|e| corrupt(format!("scope: {e}")))?,
        IdempotencyKey::new(text(2, "key")?).map_err(|e| corrupt(format!("key: {e}")))?,
    );
    let deadline = millis_at(integer(row, 4, "deadline")?, "deadline")?;
    let state = match integer(row, 8, "state")? {
        1 => ListedState::Completed {
            status: StoredResponse::status_of(blob(row, 5, "response")?)?,
            expires_at: deadline,
        },
        0 => ListedState::InProgress {
            lease_until: deadline,
        },
        other => return Err(corrupt(format!("state {other}"))),
    };
    let provenance = decode_provenance(row, 3, 6, matches!(state, ListedState::Completed { .. }));
    let (doubt, check_at) = listed_doubt(row, 9);
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

/// Decodes an audit trail row (`reconciliations_query.sql`): when the decision was applied and
/// the entry's bytes; anything else is [`Error::CorruptRecord`].
pub(crate) fn decode_reconciliation(row: &Row<'_>) -> Result<Reconciliation, Error> {
    let at = millis_at(integer(row, 0, "at")?, "at")?;
    Reconciliation::decode(at, blob(row, 1, "entry")?)
}

fn millis_at(ms: i64, name: &str) -> Result<Timestamp, Error> {
    u64::try_from(ms)
        .map(Timestamp::from_millis)
        .map_err(|_| corrupt(format!("negative {name} {ms}")))
}

fn value<'r>(row: &'r Row<'_>, index: usize) -> Result<ValueRef<'r>, Error> {
    row.get_ref(index).map_err(store_error)
}

fn blob<'r>(row: &'r Row<'_>, index: usize, name: &str) -> Result<&'r [u8], Error> {
    match value(row, index)? {
        ValueRef::Blob(bytes) => Ok(bytes),
        other => Err(corrupt(format!(
            "{name} column holds {:?}",
            other.data_type()
        ))),
    }
}

pub(crate) fn integer(row: &Row<'_>, index: usize, name: &str) -> Result<i64, Error> {
    match value(row, index)? {
        ValueRef::Integer(n) => Ok(n),
        other => Err(corrupt(format!(
            "{name} column holds {:?}",
            other.data_type()
        ))),
    }
}

fn corrupt(why: String) -> Error {
    Error::CorruptRecord(format!("sqlite row: {why}"))
}
