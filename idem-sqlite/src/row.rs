//! Reading a stored row back into a `Record`: every column is checked, and anything that is not
//! what the store writes is `CorruptRecord` (C12), never "absent".
//!
//! The response is the last column and is read only when it is needed (a replay, a lookup): a
//! mismatch or an in-flight answer never loads a large stored body.

use crate::error::store_error;
use idem_core::store::{Record, RecordState};
use idem_core::{Error, FencingToken, Fingerprint, StoredResponse, Timestamp};
use rusqlite::types::ValueRef;
use rusqlite::Row;

/// The response column of a completed row, not read yet.
#[derive(Clone, Copy)]
pub(crate) struct LazyResponse<'r, 's>(&'r Row<'s>);

impl LazyResponse<'_, '_> {
    /// Reads and decodes the stored response.
    pub(crate) fn decode(self) -> Result<StoredResponse, Error> {
        match value(self.0, 4)? {
            ValueRef::Blob(bytes) => StoredResponse::decode(bytes),
            other => Err(corrupt(format!(
                "response column holds {:?}",
                other.data_type()
            ))),
        }
    }
}

/// Decodes the columns of `select_record.sql` (fingerprint, token, state, deadline, response),
/// leaving a completed row's response unread.
pub(crate) fn decode_head<'r, 's>(row: &'r Row<'s>) -> Result<Record<LazyResponse<'r, 's>>, Error> {
    let fingerprint = Fingerprint::from_slice(blob(row, 0, "fingerprint")?)?;
    let token = FencingToken::from_slice(blob(row, 1, "token")?)?;
    let deadline = integer(row, 3, "deadline")?;
    let deadline = u64::try_from(deadline)
        .map(Timestamp::from_millis)
        .map_err(|_| corrupt(format!("negative deadline {deadline}")))?;
    let state = match integer(row, 2, "state")? {
        0 => match value(row, 4)? {
            ValueRef::Null => RecordState::InProgress {
                lease_until: deadline,
            },
            _ => return Err(corrupt("an in-progress row with a response".to_owned())),
        },
        1 => RecordState::Completed {
            response: LazyResponse(row),
            expires_at: deadline,
        },
        state => return Err(corrupt(format!("state {state}"))),
    };
    Ok(Record {
        fingerprint,
        token,
        state,
    })
}

/// Decodes the whole row, response included.
pub(crate) fn decode(row: &Row<'_>) -> Result<Record, Error> {
    decode_head(row)?.try_map_response(LazyResponse::decode)
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

fn integer(row: &Row<'_>, index: usize, name: &str) -> Result<i64, Error> {
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
