//! `lua/reserve.lua` by itself, on the single Redis: what each path of the one read returns.
//! The store's own behaviour is proven by the conformance suite; these pin the script's reply,
//! which the store decodes (`src/record.rs`), on the paths the suite cannot reach from outside:
//! a reservation sent again with its own token after a lost answer reports the record it wrote
//! and writes nothing (the engine recognises it, C4, C16), and which replies carry the stored
//! response (only a replay's, C7, under the request's fingerprint or its alternative, C3) while every reply says whether one is stored (C12). The
//! reply's values are one MessagePack string beside the response (`src/packed.rs`), read here
//! by another reader (`rmpv`).

mod common;

use common::redis_url;
use idem_core::FencingToken;
use idem_redis::redis::{self, aio::MultiplexedConnection, Script, Value};

const LEASE_MS: i64 = 3_600_000;
const GRACE_MS: i64 = 60_000;
const TRIPLE: &[u8] = b"consumer\0POST /v1/charges\0k";
const HOLDER: &str = "test-holder";

async fn conn() -> MultiplexedConnection {
    redis::Client::open(redis_url())
        .expect("a Redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

/// A key no other test uses.
fn fresh_key() -> String {
    format!("reserve_script:{}", FencingToken::generate())
}

/// The values of a reply packed by `cmsgpack`, read by `rmpv`: a string as a bulk string, an
/// integer as an integer, `false` as nil.
fn fields(packed: &[u8]) -> Vec<Value> {
    let mut rest = packed;
    let mut fields = Vec::new();
    while !rest.is_empty() {
        fields.push(
            match rmpv::decode::read_value(&mut rest).expect("MessagePack") {
                rmpv::Value::String(s) => Value::BulkString(s.into_bytes()),
                rmpv::Value::Binary(b) => Value::BulkString(b),
                rmpv::Value::Integer(n) => Value::Int(n.as_i64().expect("an i64")),
                rmpv::Value::Boolean(false) | rmpv::Value::Nil => Value::Nil,
                other => panic!("the script packs no {other:?}"),
            },
        );
    }
    fields
}

/// `reserve.lua` on `key` with `fingerprint` and `token`; the reply's fields.
async fn reserve(
    conn: &mut MultiplexedConnection,
    key: &str,
    fingerprint: &[u8],
    token: &FencingToken,
) -> Vec<Value> {
    reserve_as(conn, key, fingerprint, fingerprint, token).await
}

/// [`reserve`] for a request whose alternative fingerprint is `alternative` (C3).
async fn reserve_as(
    conn: &mut MultiplexedConnection,
    key: &str,
    fingerprint: &[u8],
    alternative: &[u8],
    token: &FencingToken,
) -> Vec<Value> {
    let script = Script::new(
        &[
            include_str!("../lua/new_record.lua"),
            include_str!("../lua/reserve.lua"),
        ]
        .concat(),
    );
    let mut invocation = script.prepare_invoke();
    invocation
        .key(key)
        .arg(fingerprint)
        .arg(token.as_bytes().as_slice())
        .arg(LEASE_MS)
        .arg(GRACE_MS)
        .arg(TRIPLE)
        .arg(HOLDER)
        .arg("0")
        .arg(alternative);
    // `{packed values, response}`: the response goes back among the values, before the doubt.
    let reply = invocation.invoke_async(conn).await.expect("reserve.lua");
    let Value::Array(parts) = reply else {
        panic!("reserve.lua returned {reply:?}")
    };
    let Ok([Value::BulkString(packed), response]) = <[Value; 2]>::try_from(parts) else {
        panic!("reserve.lua returned another shape")
    };
    let mut fields = fields(&packed);
    if text(&fields[0]) == b"existing" {
        let doubt = fields.pop().expect("the doubt");
        fields.extend([response, doubt]);
    } else {
        assert_eq!(response, Value::Nil, "a new record sends no response");
    }
    fields
}

/// `complete.lua` on `key` with `token` and `response`: whether it landed.
async fn complete(
    conn: &mut MultiplexedConnection,
    key: &str,
    token: &FencingToken,
    response: &[u8],
) -> bool {
    let script = Script::new(include_str!("../lua/complete.lua"));
    let mut invocation = script.prepare_invoke();
    invocation
        .key(key)
        .arg(token.as_bytes().as_slice())
        .arg(response)
        .arg(LEASE_MS);
    let landed: i64 = invocation.invoke_async(conn).await.expect("complete.lua");
    landed == 1
}

fn text(value: &Value) -> &[u8] {
    match value {
        Value::BulkString(b) => b,
        Value::SimpleString(s) => s.as_bytes(),
        other => panic!("a string, not {other:?}"),
    }
}

fn int(value: &Value) -> i64 {
    match value {
        Value::Int(n) => *n,
        other => panic!("an integer, not {other:?}"),
    }
}

#[tokio::test]
async fn c04_a_reservation_sent_again_with_its_own_token_reports_its_record() {
    let mut conn = conn().await;
    let key = fresh_key();
    let token = FencingToken::generate();
    let first = reserve(&mut conn, &key, b"fp-a", &token).await;
    assert_eq!(text(&first[0]), b"inserted");
    let deadline = int(&first[2]);
    assert_eq!(
        deadline,
        int(&first[1]) + LEASE_MS,
        "the deadline is Redis's now plus the lease (C11)"
    );
    // The script reports the record as it is (the engine recognises its own token): nothing
    // is written again, the deadline is unchanged.
    let again = reserve(&mut conn, &key, b"fp-a", &token).await;
    assert_eq!(text(&again[0]), b"existing", "{again:?}");
    assert_eq!(text(&again[4]), token.as_bytes().as_slice());
    assert_eq!(
        text(&again[6]),
        deadline.to_string().as_bytes(),
        "the same reservation, its deadline unchanged"
    );
    let other = reserve(&mut conn, &key, b"fp-a", &FencingToken::generate()).await;
    assert_eq!(text(&other[0]), b"existing", "another token is a duplicate");
    assert_eq!(text(&other[4]), token.as_bytes().as_slice());
}

#[tokio::test]
async fn c12_an_own_token_on_a_record_holding_a_response_is_not_the_callers() {
    let mut conn = conn().await;
    let key = fresh_key();
    let token = FencingToken::generate();
    reserve(&mut conn, &key, b"fp-a", &token).await;
    let added: i64 = redis::cmd("HSET")
        .arg(&key)
        .arg("resp")
        .arg("x")
        .query_async(&mut conn)
        .await
        .expect("HSET");
    assert_eq!(added, 1);
    let again = reserve(&mut conn, &key, b"fp-a", &token).await;
    assert_eq!(text(&again[0]), b"existing", "{again:?}");
    assert_eq!(
        (text(&again[5]), int(&again[8])),
        (b"0".as_slice(), 1),
        "in progress and a response stored: the reader finds it corrupt"
    );
}

#[tokio::test]
async fn c07_only_a_replay_carries_the_response_and_every_reply_says_whether_one_is_stored() {
    let mut conn = conn().await;
    let key = fresh_key();
    let token = FencingToken::generate();
    reserve(&mut conn, &key, b"fp-a", &token).await;
    let in_flight = reserve(&mut conn, &key, b"fp-a", &FencingToken::generate()).await;
    assert_eq!(in_flight.len(), 11, "{in_flight:?}");
    assert_eq!(
        (text(&in_flight[5]), int(&in_flight[8]), &in_flight[9]),
        (b"0".as_slice(), 0, &Value::Nil),
        "in flight: no response stored, none sent"
    );
    // Any bytes travel in a packed string, a MessagePack marker among them.
    let stored = b"\xc2\xa3-\x00\r\n\xff the stored response";
    assert!(complete(&mut conn, &key, &token, stored).await);
    let replay = reserve(&mut conn, &key, b"fp-a", &FencingToken::generate()).await;
    assert_eq!(
        (text(&replay[5]), int(&replay[8]), text(&replay[9])),
        (b"1".as_slice(), 1, stored.as_slice()),
        "a replay: the response, read with the record"
    );
    assert_eq!(replay.len(), 11, "{replay:?}");
    let mismatch = reserve(&mut conn, &key, b"fp-b", &FencingToken::generate()).await;
    assert_eq!(
        (text(&mismatch[3]), int(&mismatch[8]), &mismatch[9]),
        (b"fp-a".as_slice(), 1, &Value::Nil),
        "a mismatch: stored, not sent"
    );
    let renamed = reserve_as(&mut conn, &key, b"fp-b", b"fp-a", &FencingToken::generate()).await;
    assert_eq!(
        (text(&renamed[3]), text(&renamed[9])),
        (b"fp-a".as_slice(), stored.as_slice()),
        "C3: the request under its alternative fingerprint: its response, from this one step"
    );
    let third = reserve_as(&mut conn, &key, b"fp-b", b"fp-c", &FencingToken::generate()).await;
    assert_eq!(third[9], Value::Nil, "another body's alternative: not sent");
    assert_eq!(
        text(&mismatch[7]),
        TRIPLE,
        "the triple travels for the check"
    );
    assert_eq!(int(&replay[10]), 0, "not in doubt");
    let _: i64 = redis::cmd("HSET")
        .arg(&key)
        .arg("dbt")
        .arg("a mark")
        .query_async(&mut conn)
        .await
        .expect("HSET");
    let doubtful = reserve(&mut conn, &key, b"fp-a", &FencingToken::generate()).await;
    assert_eq!(
        int(&doubtful[10]),
        1,
        "store rule 6: the mark travels with the record"
    );
}
