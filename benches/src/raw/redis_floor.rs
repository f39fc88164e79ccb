//! The `floor` baseline on Redis: the same outcomes with the fewest commands redis-rs can send,
//! not the store's scripts. How far the library is from the machine.
//!
//! A record is one string value, a small serialized record: its state (`0` in progress, `1`
//! completed), the request's fingerprint (32 bytes), its deadline (8 bytes, milliseconds, big
//! endian) and, once completed, the encoded response (`StoredResponse::encode`). Its TTL is
//! its lifetime, so a value that exists is live.
//!
//! - a fresh key: `SET key <in progress> NX PX <lease>` (the race decided by Redis, C4), then
//!   `SET key <completed> PX <retention>`: two round trips, one command each;
//! - every answer (replay, in flight, mismatch): one `GET`, decided in Rust from the value (the
//!   fingerprint, then the state; a replay's response decoded with `StoredResponse::decode`,
//!   as the library decodes it).
//!
//! What it leaves out, and the library cannot: Lua (no script, no `TIME`), Redis's clock (the
//! deadline and an in-flight answer's time left are this process's clock, not Redis's: C11),
//! the fencing token (the completion overwrites whatever is there: C6), the lost-answer resend,
//! the record's triple and version (C2, C12), a takeover of an expired lease (C9: the value
//! simply vanishes with its TTL), and everything operators read (holder, times). The key and the
//! connection are the raw side's: `<prefix>:<hex of RecordId::digest>` under a prefix of its
//! own, on a `ConnectionManager` opened as `raw` opens it.
//!
//! Redis deletes expired values itself: this side's purge does nothing and returns 0.

use crate::harness::{Op, Path, Side};
use crate::library::{response, Requests, BODY, LEASE, OTHER_BODY};
use idem::redis::redis::aio::ConnectionManager;
use idem::redis::redis::{self, Value};
use idem::store::{FencingToken, RecordId};
use idem::{Policy, Request, StoredResponse};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Hex digits of the key.
const HEX: &[u8; 16] = b"0123456789abcdef";
/// State, fingerprint and deadline: what precedes the response in a value.
const HEAD: usize = 1 + 32 + 8;

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// This process's clock in milliseconds since the epoch.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, millis)
}

/// The value of a record: state, fingerprint, deadline, then the encoded response if any.
fn value(state: u8, request: &Request, deadline: u64, response: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(HEAD + response.len());
    value.push(state);
    value.extend_from_slice(request.fingerprint().as_bytes());
    value.extend_from_slice(&deadline.to_be_bytes());
    value.extend_from_slice(response);
    value
}

/// What a `GET` says, decided by hand.
#[derive(Debug)]
enum Reply {
    /// A completed record of the same fingerprint: its response, decoded.
    Replay(StoredResponse),
    /// An in-progress record of the same fingerprint, with how long its lease still runs.
    InFlight(Duration),
    /// A record of another fingerprint.
    Mismatch,
    /// No record (not on the answer paths).
    Absent,
}

/// Everything one side shares with its operations.
struct Inner {
    conn: ConnectionManager,
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

    /// `SET key <in progress> NX PX lease`: whether this call reserved the key.
    async fn reserve(&self, request: &Request, lease: Duration) -> bool {
        let deadline = now_ms() + millis(lease);
        let reply: Value = redis::cmd("SET")
            .arg(self.key(request.id()))
            .arg(value(b'0', request, deadline, &[]))
            .arg("NX")
            .arg("PX")
            .arg(millis(lease).max(1))
            .query_async(&mut self.conn.clone())
            .await
            .expect("SET NX");
        !matches!(reply, Value::Nil)
    }

    /// `SET key <completed> PX retention`: the response encoded, unfenced.
    async fn complete(&self, request: &Request, response: &StoredResponse) {
        let encoded = response.encode().expect("encode the response");
        let deadline = now_ms() + millis(self.retention);
        let () = redis::cmd("SET")
            .arg(self.key(request.id()))
            .arg(value(b'1', request, deadline, &encoded))
            .arg("PX")
            .arg(millis(self.retention))
            .query_async(&mut self.conn.clone())
            .await
            .expect("SET");
    }

    /// `GET key`, decided here.
    async fn ask(&self, request: &Request) -> Reply {
        let stored: Option<Vec<u8>> = redis::cmd("GET")
            .arg(self.key(request.id()))
            .query_async(&mut self.conn.clone())
            .await
            .expect("GET");
        let Some(stored) = stored else {
            return Reply::Absent;
        };
        assert!(stored.len() >= HEAD, "a value of this side");
        if &stored[1..33] != request.fingerprint().as_bytes().as_slice() {
            return Reply::Mismatch;
        }
        let mut deadline = [0; 8];
        deadline.copy_from_slice(&stored[33..HEAD]);
        match stored[0] {
            b'0' => Reply::InFlight(Duration::from_millis(
                u64::from_be_bytes(deadline).saturating_sub(now_ms()),
            )),
            b'1' => Reply::Replay(
                StoredResponse::decode(&stored[HEAD..]).expect("decode the stored response"),
            ),
            other => panic!("state {other}"),
        }
    }
}

/// Redis with the fewest commands, under a key prefix of its own.
pub struct FloorRedis {
    inner: Arc<Inner>,
    requests: Requests,
}

impl FloorRedis {
    /// A side on the Redis at `url`: one connection manager, opened as the `raw` side opens its
    /// own.
    pub async fn connect(url: &str) -> Self {
        let client = redis::Client::open(url).expect("a Redis URL");
        let conn = client
            .get_connection_manager()
            .await
            .expect("connect to Redis");
        Self {
            inner: Arc::new(Inner {
                conn,
                prefix: format!("floor_{}", FencingToken::generate()),
                retention: Policy::default().retention,
            }),
            requests: Requests::new("floor"),
        }
    }

    fn request(&self, key: &str, body: &[u8]) -> Request {
        self.requests.request(key, body)
    }
}

#[async_trait::async_trait]
impl Side for FloorRedis {
    fn name(&self) -> &'static str {
        "floor"
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
                        assert!(
                            inner.reserve(&request, LEASE).await,
                            "a fresh key is reserved"
                        );
                        inner.complete(&request, &response(100)).await;
                    })
                })
            }
            Path::Replay | Path::InFlight | Path::Mismatch => {
                let key = format!("asked-{n}");
                let first = self.request(&key, BODY);
                assert!(inner.reserve(&first, LEASE).await, "a new key is reserved");
                if path != Path::InFlight {
                    inner.complete(&first, &response(size)).await;
                }
                let asked = match path {
                    Path::Mismatch => self.request(&key, OTHER_BODY),
                    _ => first,
                };
                let asked = Arc::new(asked);
                Arc::new(move || {
                    let (inner, asked) = (Arc::clone(&inner), Arc::clone(&asked));
                    Box::pin(async move {
                        match (path, inner.ask(&asked).await) {
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

    /// Reservations with a 1 ms TTL: Redis drops them a millisecond later.
    async fn seed_expired(&self, n: usize) {
        let base = self.requests.numbers(n as u64);
        for i in 0..n as u64 {
            let request = self.request(&format!("expired-{}", base + i), BODY);
            self.inner.reserve(&request, Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    /// Nothing to purge: Redis expires values by their TTL.
    async fn purge(&self, _n: usize) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each path a few hundred times, alone and from concurrent callers; a second reservation
    /// of a held key refused; seeded records gone by their TTL; on the server of
    /// `IDEM_REDIS_URL` (`scripts/services.sh`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_path_answers_as_expected() {
        let url = std::env::var("IDEM_REDIS_URL")
            .expect("IDEM_REDIS_URL is not set: start the servers with scripts/services.sh (or run scripts/test)");
        let side = FloorRedis::connect(&url).await;
        assert_eq!(side.name(), "floor");
        crate::exercise::every_path(&side).await;
        let held = side.request("held", BODY);
        assert!(side.inner.reserve(&held, LEASE).await, "the first reserves");
        assert!(
            !side.inner.reserve(&held, LEASE).await,
            "SET NX refuses a second reservation of a held key"
        );
        let base = side.requests.peek();
        side.seed_expired(20).await;
        assert_eq!(side.purge(1000).await, 0, "Redis expires records itself");
        for i in 0..20 {
            let request = side.request(&format!("expired-{}", base + i), BODY);
            assert!(
                matches!(side.inner.ask(&request).await, Reply::Absent),
                "a seeded record is gone by its TTL"
            );
        }
    }
}
