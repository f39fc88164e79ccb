//! The library's side, written once over any store: the engine's `begin` for every path, and a
//! store's own effect-and-completion for a fresh key.

use crate::harness::{Op, Path, Side};
use idem::store::Deadline;
use idem::store::Store;
use idem::{Answer, Begin, Idempotency, Lease, Policy, Request, StoredResponse};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The request body of every path (a mismatch sends [`OTHER_BODY`]).
pub const BODY: &[u8] = br#"{"cents":2500}"#;
/// Another request under the same key.
pub const OTHER_BODY: &[u8] = br#"{"cents":9900}"#;
/// The lease of the benches: long, so an in-flight key stays in flight.
pub const LEASE: Duration = Duration::from_secs(3600);

/// What a fresh key does after its reservation: the effect and the completion. On SQL stores a
/// business insert and the completion in one transaction; elsewhere the completion alone.
#[async_trait::async_trait]
pub trait Effect<S>: Send + Sync + 'static {
    /// Runs the effect and completes `lease` with `response`.
    async fn run(&self, idem: &Idempotency<S>, lease: Lease, response: StoredResponse);
}

/// No business effect: `Idempotency::complete` (memory, Redis).
#[derive(Debug, Clone, Copy)]
pub struct CompleteOnly;

#[async_trait::async_trait]
impl<S: Store + 'static> Effect<S> for CompleteOnly {
    async fn run(&self, idem: &Idempotency<S>, lease: Lease, response: StoredResponse) {
        idem.complete(lease, response).await.expect("complete");
    }
}

/// The library over one store: the engine with the bench's policy, the store's effect, and a
/// consumer of its own so several sides share a server without meeting.
pub struct Library<S> {
    idem: Idempotency<S>,
    /// An engine whose leases last a millisecond, to seed expired records.
    expiring: Idempotency<S>,
    effect: Arc<dyn Effect<S>>,
    consumer: String,
    next: Arc<AtomicU64>,
    /// The side's name: `library`, or another setting of the same store's.
    name: &'static str,
}

impl<S: Store + Clone + 'static> Library<S> {
    /// The same side under another `name` (the store in another setting).
    pub fn named(self, name: &'static str) -> Self {
        Self { name, ..self }
    }

    /// The same side with a [`ReplayCache`](idem::ReplayCache) that holds every key a bench
    /// seeds (64 MiB, 1 M answers), named `name`.
    pub fn cached(self, store: S, name: &'static str) -> Self {
        let policy = Policy::default().lease(LEASE).purge_batch(1_000_000);
        let idem = Idempotency::builder(store)
            .policy(policy)
            .replay_cache(idem::ReplayCache::new(1_000_000, 64 << 20))
            .build()
            .expect("policy");
        Self { idem, name, ..self }
    }

    /// The library over `store`, with `effect` for fresh keys.
    pub fn new(store: S, effect: impl Effect<S>) -> Self {
        Self {
            idem: engine(store.clone(), LEASE),
            expiring: engine(store, Duration::from_millis(1)),
            effect: Arc::new(effect),
            consumer: new_consumer(),
            next: Arc::new(AtomicU64::new(0)),
            name: "library",
        }
    }

    /// The engine.
    pub fn idem(&self) -> &Idempotency<S> {
        &self.idem
    }

    /// The consumer this side's keys belong to.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }
}

/// The engine of the benches over `store`: leases of `lease`, purges in one batch.
pub fn engine<S: Store>(store: S, lease: Duration) -> Idempotency<S> {
    let policy = Policy::default().lease(lease).purge_batch(1_000_000);
    Idempotency::with_policy(store, policy).expect("policy")
}

/// A consumer of its own, so several sides share a server without meeting.
pub fn new_consumer() -> String {
    format!("bench_{}", idem::store::FencingToken::generate())
}

/// A request of `consumer` for `key` with `body`, as the benches send it.
pub fn request<S: Store>(idem: &Idempotency<S>, consumer: &str, key: &str, body: &[u8]) -> Request {
    idem.request(consumer, "POST", "/v1/charges")
        .key(Some(key))
        .body(body)
        .build()
        .expect("a valid request")
}

/// The requests a hand-written side sends: a consumer of its own, keys numbered from one
/// counter, each request built as the library builds it (scope and fingerprint).
#[derive(Clone)]
pub struct Requests {
    engine: Idempotency<idem::MemoryStore>,
    consumer: Arc<str>,
    next: Arc<AtomicU64>,
}

impl Requests {
    /// Requests of a new consumer named after `prefix`.
    pub fn new(prefix: &str) -> Self {
        Self {
            engine: Idempotency::new(idem::MemoryStore::new()),
            consumer: format!("{prefix}_{}", idem::store::FencingToken::generate()).into(),
            next: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The request for `key` with `body`.
    pub fn request(&self, key: &str, body: &[u8]) -> Request {
        request(&self.engine, &self.consumer, key, body)
    }

    /// A request for a key never sent before.
    pub fn fresh(&self) -> Request {
        self.request(&format!("fresh-{}", self.numbers(1)), BODY)
    }

    /// The first of `n` numbers no other call returns.
    pub fn numbers(&self, n: u64) -> u64 {
        self.next.fetch_add(n, Ordering::Relaxed)
    }

    /// The next number `numbers` will return.
    pub fn peek(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }
}

/// A JSON response whose body has `size` bytes.
pub fn response(size: usize) -> StoredResponse {
    let mut body = br#"{"id":"ch_1","pad":""#.to_vec();
    body.resize(size.saturating_sub(2).max(body.len()), b'x');
    body.extend_from_slice(br#""}"#);
    StoredResponse::new(201, body).with_header("content-type", "application/json")
}

#[async_trait::async_trait]
impl<S: Store + Clone + 'static> Side for Library<S> {
    fn name(&self) -> &'static str {
        self.name
    }

    async fn op(&self, path: Path, size: usize) -> Op {
        let idem = self.idem.clone();
        let consumer = self.consumer.clone();
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        match path {
            Path::Fresh => {
                let effect = Arc::clone(&self.effect);
                let next = Arc::clone(&self.next);
                Arc::new(move || {
                    let (idem, consumer, effect) =
                        (idem.clone(), consumer.clone(), Arc::clone(&effect));
                    let key = format!("fresh-{}", next.fetch_add(1, Ordering::Relaxed));
                    Box::pin(async move {
                        let request = request(&idem, &consumer, &key, BODY);
                        match idem.begin(&request).await.expect("begin") {
                            Begin::Acquired(lease) => effect.run(&idem, lease, response(100)).await,
                            Begin::Answered(answer) => {
                                panic!("a fresh key was answered: {answer:?}")
                            }
                        }
                    })
                })
            }
            Path::Replay | Path::Mismatch => {
                let key = format!("done-{n}");
                let first = request(&idem, &consumer, &key, BODY);
                let Begin::Acquired(lease) = idem.begin(&first).await.expect("begin") else {
                    panic!("a new key was answered")
                };
                self.effect.run(&idem, lease, response(size)).await;
                let (asked, mismatch) = match path {
                    Path::Replay => (first, false),
                    _ => (request(&idem, &consumer, &key, OTHER_BODY), true),
                };
                let asked = Arc::new(asked);
                Arc::new(move || {
                    let (idem, asked) = (idem.clone(), Arc::clone(&asked));
                    Box::pin(async move {
                        match idem.begin(&asked).await.expect("begin") {
                            Begin::Answered(Answer::Replay(r)) if !mismatch => {
                                std::hint::black_box(r);
                            }
                            Begin::Answered(Answer::Mismatch) if mismatch => {}
                            other => panic!("unexpected answer: {other:?}"),
                        }
                    })
                })
            }
            Path::InFlight => {
                let key = format!("running-{n}");
                let asked = Arc::new(request(&idem, &consumer, &key, BODY));
                let Begin::Acquired(_lease) = idem.begin(&asked).await.expect("begin") else {
                    panic!("a new key was answered")
                };
                Arc::new(move || {
                    let (idem, asked) = (idem.clone(), Arc::clone(&asked));
                    Box::pin(async move {
                        match idem.begin(&asked).await.expect("begin") {
                            Begin::Answered(Answer::InFlight { .. }) => {}
                            other => panic!("unexpected answer: {other:?}"),
                        }
                    })
                })
            }
        }
    }

    async fn seed_expired(&self, n: usize) {
        let base = self.next.fetch_add(n as u64, Ordering::Relaxed);
        for i in 0..n as u64 {
            let request = request(
                &self.expiring,
                &self.consumer,
                &format!("expired-{}", base + i),
                BODY,
            );
            let _ = self.expiring.begin(&request).await.expect("begin");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    async fn purge(&self, n: usize) -> usize {
        self.expiring
            .store()
            .purge_expired(n, Deadline::default())
            .await
            .expect("purge")
    }
}
