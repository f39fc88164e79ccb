//! Redis by hand with redis-rs: the store's own Lua scripts (`idem-redis/lua/reserve.lua`,
//! `complete.lua`), run with EVALSHA (the body sent again after a NOSCRIPT) on a
//! `ConnectionManager` opened the way the store opens one, with the store's arguments (those
//! of a store that reads first, its default: the scripts keep each record's read header), and
//! nothing else in between. A duplicate is answered as the store answers one while answers
//! dominate: `HMGET` of the read header and the response, then `TIME`, in one pipeline.
//!
//! Why this is the fair comparison: the commands on the wire and the round trips are the
//! store's. The key is the store's layout (`<prefix>:<hex of RecordId::digest>`) under a prefix
//! of this side's own, so it never meets the library's keys; each script gets the ARGV the
//! store sends (fingerprint, token, lease, grace and the `(consumer, route, key)` triple for the
//! reservation; token, encoded response and retention for the completion), and a duplicate is
//! checked by hand from the read: the header's version and triple, the deadline after
//! Redis's now, the fingerprint, the state and whether a response is stored (they agree), and
//! for a replay the stored response decoded with `StoredResponse::decode`. The requests (scope,
//! key, fingerprint) are built by the engine over a `MemoryStore`, so the same bytes reach the
//! server.
//!
//! What is left out is exactly the library: the engine's `begin` and `complete`, the `Store`
//! trait's boxed futures, the reply's decoding into a `Record` (every field copied and checked),
//! the core's `decide`, the `Completion` preparation (header filter, validation). A takeover of
//! an expired record (`replace.lua`) is never on the measured paths (the lease is an hour), so
//! this side does not implement it: it panics if one comes up.
//!
//! Redis deletes expired records itself (a TTL on every record; the store's expiry is
//! `Capabilities::server_ttl` and its `purge_expired` returns 0): this side's purge does nothing and
//! returns 0 too.

use crate::harness::{Op, Path, Side};
use crate::library::{response, Requests, BODY, LEASE, OTHER_BODY};
use idem::redis::redis::aio::ConnectionManager;
use idem::redis::redis::{self, Script, Value};
use idem::store::{FencingToken, RecordId};
use idem::{Policy, Request, StoredResponse};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

/// The store's grace (`RedisStore::builder`'s default): an in-progress record stays this long
/// after its lease.
const GRACE: Duration = Duration::from_secs(60);
/// The version of the store's record layout.
const VERSION: &[u8] = b"1";
/// Hex digits of the key.
const HEX: &[u8; 16] = b"0123456789abcdef";

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The triple as the store writes it with the record (its parts cannot hold NUL).
fn triple(id: &RecordId) -> Vec<u8> {
    [id.consumer(), id.route(), id.key()]
        .join("\0")
        .into_bytes()
}

/// The values `reserve.lua` packs by `cmsgpack` into one string, read by `rmpv`.
fn unpack(mut packed: &[u8]) -> Vec<rmpv::Value> {
    let mut values = Vec::with_capacity(11);
    while !packed.is_empty() {
        values.push(rmpv::decode::read_value(&mut packed).expect("MessagePack"));
    }
    values
}

/// A string value's bytes; `None` for `false` (a field the record lacks).
fn bytes(value: &rmpv::Value) -> Option<&[u8]> {
    match value {
        rmpv::Value::String(s) => Some(s.as_bytes()),
        rmpv::Value::Boolean(false) => None,
        other => panic!("a string or false, not {other}"),
    }
}

/// A number: an integer value, or a hash field's decimal string.
fn number(value: &rmpv::Value) -> i64 {
    match value {
        rmpv::Value::Integer(n) => n.as_i64().expect("an i64"),
        other => bytes(other)
            .and_then(|b| std::str::from_utf8(b).ok())
            .and_then(|s| s.parse().ok())
            .expect("a number"),
    }
}

/// A field of the reply as a number (Lua numbers come back as integers, hash fields as strings).
fn integer(value: &Value) -> i64 {
    match value {
        Value::Int(n) => *n,
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .expect("a number"),
        other => panic!("a number field, not {other:?}"),
    }
}

/// What the reservation's reply says, checked by hand.
#[derive(Debug)]
enum Reply {
    /// A fresh reservation: the key is ours.
    Inserted,
    /// A live completed record of the same fingerprint: its response, decoded.
    Replay(StoredResponse),
    /// A live in-progress record of the same fingerprint, with how long its lease still runs.
    InFlight(Duration),
    /// A live record of another fingerprint.
    Mismatch,
    /// A record whose deadline has passed (a takeover or a start over: not on the paths).
    Expired,
}

/// The read's `HMGET`: the packed read header and the response (nil in progress).
type ReadHeader = (Vec<u8>, Option<Vec<u8>>);

/// What a record found for `request` answers at Redis's `now`, checked by hand: its `header`
/// (version, fingerprint, token, state, deadline, triple), whether it stores a response, and
/// the response where it came with the record.
fn decide(
    request: &Request,
    now: i64,
    header: &[rmpv::Value; 6],
    has_response: i64,
    response: Option<Vec<u8>>,
) -> Reply {
    let [version, stored, _token, state, deadline, stored_id] = header;
    assert_eq!(bytes(version), Some(VERSION), "the store's record layout");
    assert_eq!(
        bytes(stored_id),
        Some(triple(request.id()).as_slice()),
        "the record of this triple"
    );
    let deadline = number(deadline);
    if deadline <= now {
        return Reply::Expired;
    }
    if bytes(stored) != Some(request.fingerprint().as_bytes().as_slice()) {
        return Reply::Mismatch;
    }
    // State and stored response agree, or the record is corrupt (as the store checks).
    let state = bytes(state);
    match (state, has_response) {
        (Some(b"0"), 0) | (Some(b"1"), 1) => {}
        other => panic!("a corrupt record: state and stored response {other:?}"),
    }
    match (state, response) {
        (Some(b"0"), _) => Reply::InFlight(Duration::from_millis(
            u64::try_from(deadline - now).unwrap_or(0),
        )),
        (Some(b"1"), Some(body)) => {
            Reply::Replay(StoredResponse::decode(&body).expect("decode the stored response"))
        }
        other => panic!("a completed record of the same fingerprint: {other:?}"),
    }
}

/// Everything one side shares with its operations.
struct Inner {
    conn: ConnectionManager,
    reserve: Script,
    complete: Script,
    prefix: String,
    retention: Duration,
}

impl Inner {
    /// The record's key: the prefix and the hex of the digest of the triple.
    fn key(&self, id: &RecordId) -> String {
        let mut key = String::with_capacity(self.prefix.len() + 65);
        key.push_str(&self.prefix);
        key.push(':');
        for b in id.digest() {
            key.push(char::from(HEX[usize::from(b >> 4)]));
            key.push(char::from(HEX[usize::from(b & 15)]));
        }
        key
    }

    /// `reserve.lua`, one round trip; the reply read by hand.
    async fn reserve(
        &self,
        request: &Request,
        token: &FencingToken,
        lease: Duration,
        grace: Duration,
    ) -> Reply {
        let id = request.id();
        let fingerprint = request.fingerprint().as_bytes().as_slice();
        let mut invocation = self.reserve.prepare_invoke();
        invocation
            .key(self.key(id))
            .arg(fingerprint)
            .arg(token.as_bytes().as_slice())
            .arg(millis(lease))
            .arg(millis(grace))
            .arg(triple(id))
            .arg(idem::store::Holder::this_process().encode())
            .arg("1")
            .arg(fingerprint);
        let (packed, response): (Vec<u8>, Option<Vec<u8>>) = invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .expect("reserve.lua");
        let values = unpack(&packed);
        if bytes(&values[0]) == Some(b"inserted".as_slice()) {
            return Reply::Inserted;
        }
        let Ok([_, now, version, stored, _token, state, deadline, stored_id, has_response, _doubt]) =
            <[rmpv::Value; 10]>::try_from(values)
        else {
            panic!("reserve.lua returned another number of fields")
        };
        let header = [
            version,
            stored,
            rmpv::Value::Nil,
            state,
            deadline,
            stored_id,
        ];
        decide(
            request,
            number(&now),
            &header,
            number(&has_response),
            response,
        )
    }

    /// The store's read, one round trip: `HMGET` of the read header and the response, then
    /// `TIME`, in one pipeline; the reply read by hand.
    async fn read(&self, request: &Request) -> Reply {
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET")
            .arg(self.key(request.id()))
            .arg("rh")
            .arg("resp")
            .cmd("TIME");
        let (fields, time): (ReadHeader, (i64, i64)) = pipe
            .query_async(&mut self.conn.clone())
            .await
            .expect("HMGET and TIME");
        let ((header, response), (seconds, micros)) = (fields, time);
        let Ok(header) = <[rmpv::Value; 6]>::try_from(unpack(&header)) else {
            panic!("a read header of another number of fields")
        };
        let now = seconds * 1000 + micros / 1000;
        let stored = i64::from(response.is_some());
        decide(request, now, &header, stored, response)
    }

    /// `complete.lua`, one round trip: the response encoded, fenced on the token.
    async fn complete(&self, request: &Request, token: &FencingToken, response: &StoredResponse) {
        let encoded = response.encode().expect("encode the response");
        let mut invocation = self.complete.prepare_invoke();
        invocation
            .key(self.key(request.id()))
            .arg(token.as_bytes().as_slice())
            .arg(encoded.as_slice())
            .arg(millis(self.retention))
            .arg("")
            .arg("1");
        let done: Value = invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .expect("complete.lua");
        assert_eq!(integer(&done), 1, "the completion is fenced on the token");
    }
}

/// Redis by hand, under a key prefix of its own.
pub struct RawRedis {
    inner: Arc<Inner>,
    requests: Requests,
}

impl RawRedis {
    /// A side on the Redis at `url`: one connection manager, opened as `RedisStore::connect`
    /// opens its own (redis-rs's defaults: the store's builder applies its response timeout to
    /// a cluster connection only).
    pub async fn connect(url: &str) -> Self {
        let client = redis::Client::open(url).expect("a Redis URL");
        let conn = client
            .get_connection_manager()
            .await
            .expect("connect to Redis");
        Self {
            inner: Arc::new(Inner {
                conn,
                reserve: Script::new(
                    &[
                        include_str!("../../../idem-redis/lua/new_record.lua"),
                        include_str!("../../../idem-redis/lua/reserve.lua"),
                    ]
                    .concat(),
                ),
                complete: Script::new(include_str!("../../../idem-redis/lua/complete.lua")),
                prefix: format!("raw_{}", FencingToken::generate()),
                retention: Policy::default().retention,
            }),
            requests: Requests::new("raw"),
        }
    }

    fn request(&self, key: &str, body: &[u8]) -> Request {
        self.requests.request(key, body)
    }
}

#[async_trait::async_trait]
impl Side for RawRedis {
    fn name(&self) -> &'static str {
        "raw"
    }

    async fn op(&self, path: Path, size: usize) -> Op {
        let inner = Arc::clone(&self.inner);
        let n = self.requests.numbers(1);
        match path {
            Path::Fresh => {
                let requests = self.requests.clone();
                Arc::new(move || {
                    let inner = Arc::clone(&inner);
                    let request = requests.fresh();
                    Box::pin(async move {
                        // The store's phases: the reservation, then the completion (no
                        // business effect: Redis is never in the effect's transaction), one
                        // round trip each.
                        let token = FencingToken::generate();
                        let reply = inner.reserve(&request, &token, LEASE, GRACE).await;
                        assert!(
                            matches!(reply, Reply::Inserted),
                            "a fresh key is reserved: {reply:?}"
                        );
                        inner.complete(&request, &token, &response(100)).await;
                    })
                })
            }
            Path::Replay | Path::InFlight | Path::Mismatch => {
                let key = format!("asked-{n}");
                let first = self.request(&key, BODY);
                let token = FencingToken::generate();
                let reply = inner.reserve(&first, &token, LEASE, GRACE).await;
                assert!(
                    matches!(reply, Reply::Inserted),
                    "a new key is reserved: {reply:?}"
                );
                if path != Path::InFlight {
                    inner.complete(&first, &token, &response(size)).await;
                }
                let asked = match path {
                    Path::Mismatch => self.request(&key, OTHER_BODY),
                    _ => first,
                };
                let asked = Arc::new(asked);
                Arc::new(move || {
                    let (inner, asked) = (Arc::clone(&inner), Arc::clone(&asked));
                    Box::pin(async move {
                        // A duplicate: the read, answered from its replies.
                        match (path, inner.read(&asked).await) {
                            (Path::Replay, Reply::Replay(stored)) => {
                                black_box(stored);
                            }
                            (Path::InFlight, Reply::InFlight(retry_after)) => {
                                black_box(retry_after);
                            }
                            (Path::Mismatch, Reply::Mismatch) => {}
                            (path, other) => panic!("{path:?} answered {other:?}"),
                        }
                    })
                })
            }
        }
    }

    /// Reservations with a 1 ms lease and no grace: Redis drops them by their TTL a
    /// millisecond later.
    async fn seed_expired(&self, n: usize) {
        let base = self.requests.numbers(n as u64);
        for i in 0..n as u64 {
            let request = self.request(&format!("expired-{}", base + i), BODY);
            let token = FencingToken::generate();
            self.inner
                .reserve(&request, &token, Duration::from_millis(1), Duration::ZERO)
                .await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    /// Nothing to purge: Redis expires records by their TTL (the store's expiry is
    /// `Capabilities::server_ttl`, its `purge_expired` returns 0).
    async fn purge(&self, _n: usize) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each path a few hundred times, alone and from concurrent callers; seeded records gone by
    /// their TTL; on the server of `IDEM_REDIS_URL` (`scripts/services.sh`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_path_answers_as_expected() {
        let url = std::env::var("IDEM_REDIS_URL")
            .expect("IDEM_REDIS_URL is not set: start the servers with scripts/services.sh (or run scripts/test)");
        let side = RawRedis::connect(&url).await;
        assert_eq!(side.name(), "raw");
        crate::exercise::every_path(&side).await;
        let base = side.requests.peek();
        side.seed_expired(20).await;
        assert_eq!(side.purge(1000).await, 0, "Redis expires records itself");
        let mut conn = side.inner.conn.clone();
        for i in 0..20 {
            let request = side.request(&format!("expired-{}", base + i), BODY);
            let exists: bool = redis::cmd("EXISTS")
                .arg(side.inner.key(request.id()))
                .query_async(&mut conn)
                .await
                .expect("EXISTS");
            assert!(!exists, "a seeded record is gone by its TTL");
        }
    }
}
