//! The stored form of a record, read back: every field is checked, and anything that is not
//! what the store writes is `CorruptRecord` (C12), never "absent".

use crate::error::unexpected;
use crate::packed::{self, Packed};
use idem_core::store::Doubt;
use idem_core::store::{Record, RecordState, Reserved};
use idem_core::{
    Error, FencingToken, Fingerprint, IdempotencyKey, RecordId, Request, Scope, StoredResponse,
    Timestamp,
};
use idem_ops::{Listed, ListedState};
use idem_ops::{Noted, Provenance};
use redis::Value;

/// The version of the stored form. Fields added since (`at`, `h`, `ca`, the mark of doubt
/// `dbt` with its check time `dca`, and the read header `rh`) are optional: a record without
/// them is read all the same, and a release that does not know them reads the rest, so the
/// version stays.
pub(crate) const VERSION: &[u8] = b"1";

fn corrupt(why: impl Into<String>) -> Error {
    Error::CorruptRecord(format!("redis record: {}", why.into()))
}

/// The key of a record: `<prefix>:<hex of RecordId::digest>`.
pub(crate) fn key(prefix: &str, id: &RecordId) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut key = String::with_capacity(prefix.len() + 65);
    key.push_str(prefix);
    key.push(':');
    for b in id.digest() {
        key.push(char::from(HEX[usize::from(b >> 4)]));
        key.push(char::from(HEX[usize::from(b & 15)]));
    }
    key
}

/// The triple as stored with the record (NUL cannot occur in any part: consumer and route refuse
/// control characters, keys are visible ASCII).
pub(crate) fn triple(id: &RecordId) -> Vec<u8> {
    [id.consumer(), id.route(), id.key()]
        .join("\0")
        .into_bytes()
}

/// Whether `stored` is the triple of `id` as [`triple`] writes it, without building it.
fn is_triple_of(stored: &[u8], id: &RecordId) -> bool {
    let parts = [id.consumer(), id.route(), id.key()];
    let expected = parts.iter().map(|p| p.len()).sum::<usize>() + 2;
    if stored.len() != expected {
        return false;
    }
    let mut rest = stored;
    for (i, part) in parts.iter().enumerate() {
        let Some(after) = rest.strip_prefix(part.as_bytes()) else {
            return false;
        };
        rest = after;
        if i < 2 {
            let Some(after) = rest.strip_prefix(b"\0") else {
                return false;
            };
            rest = after;
        }
    }
    rest.is_empty()
}

pub(crate) fn bytes(value: &Value, what: &str) -> Result<Vec<u8>, Error> {
    text(value, what).map(<[u8]>::to_vec)
}

/// A string field of a reply, borrowed.
pub(crate) fn text<'a>(value: &'a Value, what: &str) -> Result<&'a [u8], Error> {
    match Packed::of(value) {
        Some(packed) => packed_text(packed, what),
        None => Err(corrupt(format!("{what} is {value:?}"))),
    }
}

/// A string field of a packed reply.
fn packed_text<'a>(value: Packed<'a>, what: &str) -> Result<&'a [u8], Error> {
    match value {
        Packed::Text(bytes) => Ok(bytes),
        other => Err(corrupt(format!("{what} is {other:?}"))),
    }
}

/// A string field of a reply, moved out of it (a stored response is not copied).
fn into_bytes(value: Value, what: &str) -> Result<Vec<u8>, Error> {
    match value {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        other => Err(corrupt(format!("{what} is {other:?}"))),
    }
}

pub(crate) fn integer(value: &Value, what: &str) -> Result<i64, Error> {
    match Packed::of(value) {
        Some(packed) => packed_integer(packed, what),
        None => Err(corrupt(format!("{what} is {value:?}"))),
    }
}

/// An integer field of a packed reply: an integer, or a string of one (as the scripts write
/// times).
pub(crate) fn packed_integer(value: Packed<'_>, what: &str) -> Result<i64, Error> {
    match value {
        Packed::Int(n) => Ok(n),
        Packed::Text(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| corrupt(format!("{what} is not a number"))),
        Packed::Nil => Err(corrupt(format!("{what} is missing"))),
    }
}

pub(crate) fn timestamp(ms: i64) -> Result<Timestamp, Error> {
    u64::try_from(ms)
        .map(Timestamp::from_millis)
        .map_err(|_| corrupt(format!("time {ms}")))
}

fn check_version(version: Packed<'_>) -> Result<(), Error> {
    let stored = packed_text(version, "version")?;
    if stored == VERSION {
        return Ok(());
    }
    // VERSION is a decimal number.
    let current: u64 = std::str::from_utf8(VERSION).map_or(1, |v| v.parse().unwrap_or(1));
    match std::str::from_utf8(stored).ok().and_then(|v| v.parse::<u64>().ok()) {
        Some(newer) if newer > current => Err(corrupt(format!(
            "written by a newer version of idem (record version {newer}, this one reads {current}): upgrade this program"
        ))),
        _ => Err(corrupt("unknown version")),
    }
}

/// The triple stored with a record, parsed back into the id it was written for.
fn parse_triple(stored: &[u8]) -> Result<RecordId, Error> {
    let bad = || corrupt("the triple does not parse");
    let text = std::str::from_utf8(stored).map_err(|_| bad())?;
    let mut parts = text.split('\0');
    let (Some(consumer), Some(route), Some(key), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    Ok(RecordId::new(
        Scope::new(consumer, route).map_err(|_| bad())?,
        IdempotencyKey::new(key).map_err(|_| bad())?,
    ))
}

/// Decodes what a store keeps for operators: when the record was reserved, when its completion
/// landed, and its holder, each `Nil` when the record does not have it (written before the
/// store kept it). Each is read on its own and none fails the read: an unreadable time is
/// unknown, an unreadable holder is [`Noted::Unreadable`].
pub(crate) fn provenance(reserved_at: &Value, completed_at: &Value, holder: &Value) -> Provenance {
    let at = |value: &Value, what: &str| -> Option<Timestamp> {
        match value {
            Value::Nil => None,
            at => integer(at, what).and_then(timestamp).ok(),
        }
    };
    let holder = match holder {
        Value::Nil => Noted::Unknown,
        text => match bytes(text, "holder") {
            Ok(raw) => Noted::holder(Some(&String::from_utf8_lossy(&raw))),
            Err(_) => Noted::unreadable(&format!("{text:?}")),
        },
    };
    Provenance {
        reserved_at: at(reserved_at, "reservation time"),
        completed_at: at(completed_at, "completion time"),
        holder,
    }
}

/// What an operator is shown of `provenance`: a completion time only for a completed record
/// (a reservation by an older release may have left its predecessor's).
pub(crate) fn shown_for(provenance: Provenance, completed: bool) -> Provenance {
    Provenance {
        completed_at: provenance.completed_at.filter(|_| completed),
        ..provenance
    }
}

/// The mark of doubt (`dbt`) and its next check time (`dca`) as `inspect` reads them: both
/// `None` when the record is not in doubt; a mark that does not decode, or a check time that is
/// not a time, is [`Error::CorruptRecord`].
pub(crate) fn doubt(
    mark: &Value,
    check_at: &Value,
) -> Result<(Option<Doubt>, Option<Timestamp>), Error> {
    if *mark == Value::Nil {
        return Ok((None, None));
    }
    let doubt = Doubt::decode(text(mark, "mark of doubt")?)?;
    let check_at = match check_at {
        Value::Nil => None,
        at => Some(timestamp(integer(at, "check time")?)?),
    };
    Ok((Some(doubt), check_at))
}

/// The same for a listing, which never fails on it: a mark that does not decode is
/// [`Noted::Unreadable`], a check time that is not a time is unknown.
fn listed_doubt(mark: &Value, check_at: &Value) -> (Option<Noted<Doubt>>, Option<Timestamp>) {
    let doubt = match mark {
        Value::Nil => return (None, None),
        mark => match text(mark, "mark of doubt").and_then(Doubt::decode) {
            Ok(doubt) => Noted::Known(doubt),
            Err(error) => Noted::Unreadable(error.to_string()),
        },
    };
    let check_at = match check_at {
        Value::Nil => None,
        at => integer(at, "check time").and_then(timestamp).ok(),
    };
    (Some(doubt), check_at)
}

/// Decodes what `lua/list.lua` read at `key` (`[version, state, deadline, triple, reserved at,
/// first bytes of the response, completed at, holder, mark of doubt, check time]`) into what a
/// listing shows, never a body. The stored triple must hash to `key` under `prefix`, as a
/// lookup checks it.
pub(crate) fn listed(fields: &[Value], prefix: &str, at_key: &str) -> Result<Listed, Error> {
    let [version, state, deadline, stored_id, reserved_at, status, completed_at, holder, mark, check_at] =
        fields
    else {
        return Err(corrupt(format!("{} fields", fields.len())));
    };
    check_version(Packed::of(version).unwrap_or(Packed::Nil))?;
    let id = parse_triple(&bytes(stored_id, "triple")?)?;
    if key(prefix, &id) != at_key {
        return Err(corrupt(
            "the record belongs to another (consumer, route, key)",
        ));
    }
    let deadline = timestamp(integer(deadline, "deadline")?)?;
    let provenance = provenance(reserved_at, completed_at, holder);
    // An in-progress record with a response is corrupt here too, as on every read (C12).
    let state = match (bytes(state, "state")?.as_slice(), status) {
        (b"0", Value::Nil) => ListedState::InProgress {
            lease_until: deadline,
        },
        (b"0", _) => return Err(corrupt("an in-progress record with a response")),
        (b"1", status) => ListedState::Completed {
            status: StoredResponse::status_of(&bytes(status, "response")?)?,
            expires_at: deadline,
        },
        (other, _) => return Err(corrupt(format!("state {other:?}"))),
    };
    let (doubt, check_at) = listed_doubt(mark, check_at);
    Ok(Listed {
        id,
        reserved_at: provenance.reserved_at,
        completed_at: provenance
            .completed_at
            .filter(|_| matches!(state, ListedState::Completed { .. })),
        holder: provenance.holder,
        state,
        doubt,
        check_at,
    })
}

/// What the first step of a plain read found (`RedisStore::read`: the replies to `HMGET rh resp`
/// and `TIME`), as a reservation step reports it, its response only for the request's
/// fingerprint or its alternative (C3): the record by its read header (`rh`, see
/// `lua/complete.lua`), or `Lost` for neither a header nor a response: no record, or one the reservation's script reports as it
/// is (not ours, or written in progress by a release or store that writes no header). `None`
/// for a record whose fields the read reads next: a completed one without a header (in doubt,
/// or written by a store that does not read first), or with one in progress beside a response
/// (completed by a release that does not know headers). Redis's now is `TIME`, taken after the
/// record was read: it can only make the record older than it was. The header's values are
/// read where they lie in the reply, never copied.
pub(crate) fn read_header(
    replies: Vec<Value>,
    request: &Request,
) -> Result<Option<Reserved>, Error> {
    let count = replies.len();
    let Ok([Value::Array(fields), time]) = <[Value; 2]>::try_from(replies) else {
        return Err(corrupt(format!("a read answered {count} replies")));
    };
    let count = fields.len();
    let Ok([header, response]) = <[Value; 2]>::try_from(fields) else {
        return Err(corrupt(format!("a read answered {count} fields")));
    };
    match (&header, &response) {
        (Value::Nil, Value::Nil) => return Ok(Some(Reserved::Lost)),
        (Value::Nil, _) => return Ok(None),
        _ => {}
    }
    let now = server_time(&time)?;
    let (stored, count) = packed::unpack::<FIELDS>(&header, "the read header")
        .map_err(|_| corrupt("an unreadable read header"))?;
    if count != FIELDS {
        return Err(corrupt(format!("a read header of {count} values")));
    }
    if packed_text(stored[3], "state")? == b"0" && response != Value::Nil {
        return Ok(None);
    }
    let has_response = response != Value::Nil;
    found(&stored, has_response, response, now, false, request).map(Some)
}

/// How many protocol fields a record has: version, fingerprint, token, state, deadline, triple.
const FIELDS: usize = 6;

/// A record's protocol fields as stored (version, fingerprint, token, state, deadline, triple),
/// borrowed from the reply that carried them.
pub(crate) type Stored<'a> = [Packed<'a>; FIELDS];

/// The record of a plain read or a reservation: its protocol fields, whether it holds a
/// response, and its response where it was fetched, kept only for the request's fingerprint or
/// its alternative (C3).
pub(crate) fn found(
    stored: &Stored<'_>,
    has_response: bool,
    response: Value,
    now: Timestamp,
    in_doubt: bool,
    request: &Request,
) -> Result<Reserved, Error> {
    // The request's own fingerprint or its alternative (C3): a completed record of either is
    // replayed as found, with no read of its own under the alternative.
    let same = Fingerprint::from_slice(packed_text(stored[1], "fingerprint")?)
        .is_ok_and(|stored| request.accepts(&stored));
    let response = match response {
        Value::Nil => None,
        _ if !same => None,
        other => Some(into_bytes(other, "response")?),
    };
    Ok(Reserved::Found {
        record: of(stored, has_response, response, request.id())?,
        now,
        in_doubt,
    })
}

/// Redis's `TIME` (seconds, microseconds) in milliseconds, as the scripts compute `now`.
pub(crate) fn server_time(reply: &Value) -> Result<Timestamp, Error> {
    let Value::Array(parts) = reply else {
        return Err(unexpected("TIME", reply));
    };
    let (Some(seconds), Some(micros), 2) = (parts.first(), parts.get(1), parts.len()) else {
        return Err(unexpected("TIME", reply));
    };
    let (seconds, micros) = (
        integer(seconds, "seconds")?,
        integer(micros, "microseconds")?,
    );
    let ms = seconds
        .checked_mul(1_000)
        .and_then(|ms| ms.checked_add(micros / 1_000));
    timestamp(ms.ok_or_else(|| unexpected("TIME", reply))?)
}

/// The record the second step of a plain read found (`RedisStore::read`, for a record without a
/// read header: the replies to `HMGET v fp tok st dl id dbt resp` and `TIME`) as a reservation
/// step reports it, its response only for the request's fingerprint or its alternative (C3);
/// `Lost` for no record, and for one that is not ours: the reservation's script reports those.
pub(crate) fn read(replies: Vec<Value>, request: &Request) -> Result<Reserved, Error> {
    let count = replies.len();
    let Ok([Value::Array(fields), time]) = <[Value; 2]>::try_from(replies) else {
        return Err(corrupt(format!("a read answered {count} replies")));
    };
    let count = fields.len();
    let Ok([version, fingerprint, token, state, deadline, triple, doubt, response]) =
        <[Value; 8]>::try_from(fields)
    else {
        return Err(corrupt(format!("a read answered {count} fields")));
    };
    if version == Value::Nil {
        return Ok(Reserved::Lost);
    }
    let now = server_time(&time)?;
    let stored = stored_of([&version, &fingerprint, &token, &state, &deadline, &triple])?;
    let has_response = response != Value::Nil;
    let in_doubt = doubt != Value::Nil;
    found(&stored, has_response, response, now, in_doubt, request)
}

/// The protocol fields of a plain reply, each a string, an integer or nil.
fn stored_of<'a>(values: [&'a Value; FIELDS]) -> Result<Stored<'a>, Error> {
    let mut stored = [Packed::Nil; FIELDS];
    for (slot, value) in stored.iter_mut().zip(values) {
        *slot = Packed::of(value).ok_or_else(|| corrupt(format!("a field is {value:?}")))?;
    }
    Ok(stored)
}

/// Decodes what `lua/lookup.lua` answers, `[version, fingerprint, token, state, deadline,
/// triple, stored, response]`, for `id` (see [`of`]), the response moved out of the reply.
pub(crate) fn decode(fields: Vec<Value>, id: &RecordId) -> Result<Record<Option<Vec<u8>>>, Error> {
    let count = fields.len();
    let Ok([version, fingerprint, token, state, deadline, triple, stored, response]) =
        <[Value; 8]>::try_from(fields)
    else {
        return Err(corrupt(format!("{count} fields")));
    };
    let fields = stored_of([&version, &fingerprint, &token, &state, &deadline, &triple])?;
    let has_response = stores_response(integer(&stored, "whether a response is stored")?)?;
    let response = match response {
        Value::Nil => None,
        other => Some(into_bytes(other, "response")?),
    };
    of(&fields, has_response, response, id)
}

/// Whether a record holds a response, as a script answers it (1 or 0).
pub(crate) fn stores_response(flag: i64) -> Result<bool, Error> {
    match flag {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(corrupt(format!("whether a response is stored is {other}"))),
    }
}

/// The record of `stored` for `id`: `has_response` says whether it holds a response,
/// `response` is that response where it was fetched (`None` where it was not). As in the SQL
/// stores, a record whose state and response disagree (in progress with a response, completed
/// without one) is corrupt, whether or not the response was fetched: never an in-flight
/// answer, a mismatch, or a record to take over (C12).
pub(crate) fn of(
    stored: &Stored<'_>,
    has_response: bool,
    response: Option<Vec<u8>>,
    id: &RecordId,
) -> Result<Record<Option<Vec<u8>>>, Error> {
    let [version, fingerprint, token, state, deadline, triple] = *stored;
    check_version(version)?;
    if !is_triple_of(packed_text(triple, "triple")?, id) {
        return Err(corrupt(
            "the record belongs to another (consumer, route, key)",
        ));
    }
    let deadline = timestamp(packed_integer(deadline, "deadline")?)?;
    if response.is_some() && !has_response {
        return Err(corrupt("a response read that is not stored"));
    }
    let state = match (packed_text(state, "state")?, has_response) {
        (b"0", false) => RecordState::InProgress {
            lease_until: deadline,
        },
        (b"0", true) => return Err(corrupt("an in-progress record with a response")),
        (b"1", true) => RecordState::Completed {
            response,
            expires_at: deadline,
        },
        (b"1", false) => return Err(corrupt("a completed record without a response")),
        (other, _) => return Err(corrupt(format!("state {other:?}"))),
    };
    Ok(Record {
        fingerprint: Fingerprint::from_slice(packed_text(fingerprint, "fingerprint")?)?,
        token: FencingToken::from_slice(packed_text(token, "token")?)?,
        state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(consumer: &str, route: &str, key: &str) -> RecordId {
        RecordId::new(
            Scope::new(consumer, route).expect("a valid scope"),
            IdempotencyKey::new(key).expect("a valid key"),
        )
    }

    #[test]
    fn c02_the_stored_triple_is_checked_against_its_own_id_only() {
        let mine = id("acct_1", "POST /v1/charges", "k-1");
        assert!(is_triple_of(&triple(&mine), &mine));
        for other in [
            id("acct_1", "POST /v1/charges", "k-2"),
            id("acct_2", "POST /v1/charges", "k-1"),
            id("acct_1", "POST /v1/refunds", "k-1"),
            id("acct_1", "POST /v1/charges", "k-1x"),
        ] {
            assert!(!is_triple_of(&triple(&other), &mine), "{other:?}");
            assert!(!is_triple_of(&triple(&mine), &other), "{other:?}");
        }
        let stored = triple(&mine);
        let spaced: Vec<u8> = stored
            .iter()
            .map(|&b| if b == 0 { b' ' } else { b })
            .collect();
        for bad in [
            stored[..stored.len() - 1].to_vec(),
            [stored.as_slice(), b"\0"].concat(),
            spaced,
            Vec::new(),
        ] {
            assert!(!is_triple_of(&bad, &mine), "{bad:?}");
        }
    }

    #[test]
    fn c12_a_mark_of_doubt_is_read_strictly_by_inspect_and_never_fails_a_listing() {
        use idem_core::store::DoubtCause;
        let mark = Doubt::new(DoubtCause::Panicked, "note");
        let stored = Value::BulkString(mark.encode());
        let at = Value::BulkString(b"1700000000000".to_vec());
        let when = Some(Timestamp::from_millis(1_700_000_000_000));
        assert_eq!(
            doubt(&stored, &at).expect("reads"),
            (Some(mark.clone()), when)
        );
        assert_eq!(listed_doubt(&stored, &at), (Some(Noted::Known(mark)), when));
        assert_eq!(doubt(&Value::Nil, &at).expect("reads"), (None, None));
        assert_eq!(listed_doubt(&Value::Nil, &at), (None, None));

        let garbage = Value::BulkString(b"D\x01".to_vec());
        let odd_time = Value::BulkString(b"soon".to_vec());
        for (mark, check_at) in [(&garbage, &at), (&stored, &odd_time)] {
            assert!(
                matches!(doubt(mark, check_at), Err(Error::CorruptRecord(_))),
                "{mark:?} {check_at:?}"
            );
        }
        assert!(matches!(
            listed_doubt(&garbage, &at),
            (Some(Noted::Unreadable(_)), Some(_))
        ));
        assert!(matches!(
            listed_doubt(&stored, &odd_time),
            (Some(Noted::Known(_)), None)
        ));
    }

    /// `s` as cmsgpack writes a string (str8: every value here is shorter than 256 bytes).
    fn packed_str(s: &[u8]) -> Vec<u8> {
        let mut out = vec![0xd9, u8::try_from(s.len()).expect("short")];
        out.extend_from_slice(s);
        out
    }

    fn header(request: &Request, token: &FencingToken, state: &[u8], deadline: &[u8]) -> Value {
        let fields: [&[u8]; 6] = [
            VERSION,
            request.fingerprint().as_bytes(),
            token.as_bytes(),
            state,
            deadline,
            &triple(request.id()),
        ];
        Value::BulkString(fields.iter().flat_map(|f| packed_str(f)).collect())
    }

    fn time(seconds: &str, micros: &str) -> Value {
        Value::Array(vec![
            Value::BulkString(seconds.as_bytes().to_vec()),
            Value::BulkString(micros.as_bytes().to_vec()),
        ])
    }

    fn request(key: &str, body: &[u8]) -> Request {
        Request::builder("acct_1", "POST", "/v1/charges")
            .key(Some(key))
            .body(body)
            .build()
            .expect("a valid request")
    }

    /// The first read's replies: `HMGET rh resp` and `TIME`.
    fn replies(header: Value, response: Value, clock: Value) -> Vec<Value> {
        vec![Value::Array(vec![header, response]), clock]
    }

    #[test]
    fn c11_a_read_takes_the_header_and_redis_time() {
        let (req, other) = (request("k-1", b"{}"), request("k-1", b"{\"other\":1}"));
        let token = FencingToken::generate();
        let found = |header: Value, response: Value, request: &Request| {
            let clock = time("1700000000", "123456");
            read_header(replies(header, response, clock), request)
        };
        let completed = header(&req, &token, b"1", b"1700000060000");
        let body = Value::BulkString(b"stored".to_vec());
        match found(completed.clone(), body.clone(), &req) {
            Ok(Some(Reserved::Found {
                record,
                now,
                in_doubt: false,
            })) => {
                assert_eq!(now, Timestamp::from_millis(1_700_000_000_123));
                assert_eq!(record.token, token);
                assert_eq!(
                    record.state,
                    RecordState::Completed {
                        response: Some(b"stored".to_vec()),
                        expires_at: Timestamp::from_millis(1_700_000_060_000),
                    }
                );
            }
            other => panic!("{other:?}"),
        }
        // The same request under its alternative fingerprint (the record's): its response.
        let renamed = request("k-1", b"{ }").with_alternative_fingerprint(*req.fingerprint());
        assert!(matches!(
            found(completed.clone(), body.clone(), &renamed),
            Ok(Some(Reserved::Found { record, .. }))
                if record.state == RecordState::Completed {
                    response: Some(b"stored".to_vec()),
                    expires_at: Timestamp::from_millis(1_700_000_060_000),
                }
        ));
        // Another body: the record, never its response (C3).
        assert!(matches!(
            found(completed.clone(), body.clone(), &other),
            Ok(Some(Reserved::Found { record, .. }))
                if record.state == RecordState::Completed {
                    response: None,
                    expires_at: Timestamp::from_millis(1_700_000_060_000),
                }
        ));
        // In progress: the lease, without a response.
        let in_progress = header(&req, &token, b"0", b"1700000000400");
        assert!(matches!(
            found(in_progress.clone(), Value::Nil, &req),
            Ok(Some(Reserved::Found { record, .. }))
                if record.state == RecordState::InProgress {
                    lease_until: Timestamp::from_millis(1_700_000_000_400),
                }
        ));
        // A response without a header (in doubt, or completed by a store that writes none), or
        // a header in progress beside a response (completed by a release that does not know
        // headers): the fields are read next. Neither: the reservation's script reports it.
        for (header, response) in [(Value::Nil, body.clone()), (in_progress, body.clone())] {
            let got = found(header, response, &req);
            assert!(matches!(got, Ok(None)), "{got:?}");
        }
        let got = found(Value::Nil, Value::Nil, &req);
        assert!(matches!(got, Ok(Some(Reserved::Lost))), "{got:?}");
        // Completed without a response, another key's header, a header cut short: corrupt,
        // never an answer (C12).
        let elsewhere = request("k-2", b"{}");
        let Value::BulkString(mut short) = completed.clone() else {
            unreachable!()
        };
        short.truncate(short.len() - 3);
        for (header, response) in [
            (completed.clone(), Value::Nil),
            (
                header(&elsewhere, &token, b"1", b"1700000060000"),
                body.clone(),
            ),
            (Value::BulkString(short), body.clone()),
        ] {
            let got = found(header, response, &req);
            assert!(matches!(got, Err(Error::CorruptRecord(_))), "{got:?}");
        }
        // A clock that is not Redis's: an error, never a time.
        for clock in [
            time("-1", "0"),
            time("99999999999999999", "0"),
            time("x", "0"),
        ] {
            let replies = replies(completed.clone(), body.clone(), clock);
            assert!(read_header(replies, &req).is_err());
        }
    }

    #[test]
    fn c12_a_record_of_a_newer_version_says_so_and_another_is_unknown() {
        let newer = check_version(Packed::Text(b"2"));
        assert!(
            matches!(&newer, Err(Error::CorruptRecord(why)) if why.contains("newer version")),
            "{newer:?}"
        );
        let odd = check_version(Packed::Text(b"x"));
        assert!(
            matches!(&odd, Err(Error::CorruptRecord(why)) if why.contains("unknown version")),
            "{odd:?}"
        );
        assert!(check_version(Packed::Text(VERSION)).is_ok());
    }
}
