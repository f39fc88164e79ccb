//! Reading a stored row back into a `Record`: every column is checked, and anything that is not
//! what the store writes is `CorruptRecord` (C12), never "absent".

use idem_core::{Error, FencingToken, Fingerprint, Record, RecordState, StoredResponse, Timestamp};
use rusqlite::types::ValueRef;
use rusqlite::Row;

/// Decodes the columns of `select_record.sql`: fingerprint, token, state, deadline, response.
pub(crate) fn decode(row: &Row<'_>) -> Result<Record, Error> {
    let fingerprint = Fingerprint::from_slice(blob(row, 0, "fingerprint")?)?;
    let token = FencingToken::from_slice(blob(row, 1, "token")?)?;
    let deadline = integer(row, 3, "deadline")?;
    let deadline = u64::try_from(deadline)
        .map(Timestamp::from_millis)
        .map_err(|_| corrupt(format!("negative deadline {deadline}")))?;
    let state = match (integer(row, 2, "state")?, value(row, 4)?) {
        (0, ValueRef::Null) => RecordState::InProgress {
            lease_until: deadline,
        },
        (1, ValueRef::Blob(bytes)) => RecordState::Completed {
            response: StoredResponse::decode(bytes)?,
            expires_at: deadline,
        },
        (0, _) => return Err(corrupt("an in-progress row with a response".to_owned())),
        (1, other) => {
            return Err(corrupt(format!(
                "response column holds {:?}",
                other.data_type()
            )))
        }
        (state, _) => return Err(corrupt(format!("state {state}"))),
    };
    Ok(Record {
        fingerprint,
        token,
        state,
    })
}

fn value<'r>(row: &'r Row<'_>, index: usize) -> Result<ValueRef<'r>, Error> {
    row.get_ref(index).map_err(Error::unavailable)
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
