//! The stored form of a record, read back: every field is checked, and anything that is not
//! what the store writes is `CorruptRecord` (C12), never "absent".

use idem_core::store::{Record, RecordState};
use idem_core::{Error, FencingToken, Fingerprint, RecordId, Timestamp};
use redis::Value;

/// The version of the stored form.
pub(crate) const VERSION: &[u8] = b"1";

fn corrupt(why: impl Into<String>) -> Error {
    Error::CorruptRecord(format!("redis record: {}", why.into()))
}

/// The triple as stored with the record (NUL cannot occur in any part: consumer and route refuse
/// control characters, keys are visible ASCII).
pub(crate) fn triple(id: &RecordId) -> Vec<u8> {
    [id.consumer(), id.route(), id.key()]
        .join("\0")
        .into_bytes()
}

pub(crate) fn bytes(value: &Value, what: &str) -> Result<Vec<u8>, Error> {
    match value {
        Value::BulkString(b) => Ok(b.clone()),
        Value::SimpleString(s) => Ok(s.clone().into_bytes()),
        other => Err(corrupt(format!("{what} is {other:?}"))),
    }
}

pub(crate) fn integer(value: &Value, what: &str) -> Result<i64, Error> {
    match value {
        Value::Int(n) => Ok(*n),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| corrupt(format!("{what} is not a number"))),
        other => Err(corrupt(format!("{what} is {other:?}"))),
    }
}

pub(crate) fn timestamp(ms: i64) -> Result<Timestamp, Error> {
    u64::try_from(ms)
        .map(Timestamp::from_millis)
        .map_err(|_| corrupt(format!("deadline {ms}")))
}

/// Decodes `[version, fingerprint, token, state, deadline, triple, response]` for `id`; the
/// response is `None` where it was not fetched.
pub(crate) fn decode(fields: &[Value], id: &RecordId) -> Result<Record<Option<Vec<u8>>>, Error> {
    let [version, fingerprint, token, state, deadline, stored_id, response] = fields else {
        return Err(corrupt(format!("{} fields", fields.len())));
    };
    if bytes(version, "version")? != VERSION {
        return Err(corrupt("unknown version"));
    }
    if bytes(stored_id, "triple")? != triple(id) {
        return Err(corrupt(
            "the record belongs to another (consumer, route, key)",
        ));
    }
    let deadline = timestamp(integer(deadline, "deadline")?)?;
    let response = match response {
        Value::Nil => None,
        other => Some(bytes(other, "response")?),
    };
    let state = match bytes(state, "state")?.as_slice() {
        b"0" => RecordState::InProgress {
            lease_until: deadline,
        },
        b"1" => RecordState::Completed {
            response,
            expires_at: deadline,
        },
        other => return Err(corrupt(format!("state {other:?}"))),
    };
    Ok(Record {
        fingerprint: Fingerprint::from_slice(&bytes(fingerprint, "fingerprint")?)?,
        token: FencingToken::from_slice(&bytes(token, "token")?)?,
        state,
    })
}
