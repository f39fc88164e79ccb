//! The money path: the SQL stores' `run_in_transaction`, the reservation, one business insert
//! and the completion in one call, written once over any store that has it; each store's
//! closure is in [`stores`](crate::stores). Measured in the concurrency table on fresh keys and
//! replays, against the same hand-written baselines as the paths through `begin`.

use crate::harness::{Op, Path};
use crate::library::{engine, new_consumer, request, BODY, LEASE};
use idem::store::Store;
use idem::{Answer, Idempotency, Outcome, Request};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The paths measured through `run_in_transaction`.
pub const PATHS: [Path; 2] = [Path::Fresh, Path::Replay];

/// The paths measured with one commit (C15, one-commit `run_in_transaction`): a fresh key; a replay
/// is the same read as with two.
pub const ONE_COMMIT_PATHS: [Path; 1] = [Path::Fresh];

/// The name of `path` through `run_in_transaction` in tables and results: `tx_fresh_key`,
/// `tx_replay`; with one commit `tx1_fresh_key`.
pub fn path_name(path: Path, one_commit: bool) -> String {
    if one_commit {
        format!("tx1_{}", path.name())
    } else {
        format!("tx_{}", path.name())
    }
}

/// A store whose engine runs an effect and its completion in one transaction.
#[async_trait::async_trait]
pub trait Charge: Store + Clone + 'static {
    /// `run_in_transaction` for `request` (`with_one_commit(true)`),
    /// its effect one business insert answered with a response of `size` bytes
    /// ([`response`](crate::library::response)).
    async fn charge(
        idem: &Idempotency<Self>,
        request: &Request,
        size: usize,
        one_commit: bool,
    ) -> Outcome;
}

/// The library's side of the money path on one store, whatever the store.
#[async_trait::async_trait]
pub trait Transacting: Send + Sync + 'static {
    /// The operation for `path` (one of [`PATHS`]), whose stored response body has `size`
    /// bytes, after setting up what it needs (a completed key for a replay).
    async fn op(&self, path: Path, size: usize) -> Op;
}

/// The engine over one store, with the benches' policy and a consumer of its own.
pub struct InTransaction<S> {
    idem: Idempotency<S>,
    consumer: String,
    next: Arc<AtomicU64>,
    one_commit: bool,
}

impl<S: Charge> InTransaction<S> {
    /// The money path over `store`, in one commit per fresh key if `one_commit`, else two.
    pub fn new(store: S, one_commit: bool) -> Self {
        Self {
            idem: engine(store, LEASE),
            consumer: new_consumer(),
            next: Arc::new(AtomicU64::new(0)),
            one_commit,
        }
    }
}

#[async_trait::async_trait]
impl<S: Charge> Transacting for InTransaction<S> {
    async fn op(&self, path: Path, size: usize) -> Op {
        let idem = self.idem.clone();
        let consumer = self.consumer.clone();
        let one_commit = self.one_commit;
        match path {
            Path::Fresh => {
                let next = Arc::clone(&self.next);
                Arc::new(move || {
                    let (idem, consumer) = (idem.clone(), consumer.clone());
                    let key = format!("fresh-{}", next.fetch_add(1, Ordering::Relaxed));
                    Box::pin(async move {
                        let request = request(&idem, &consumer, &key, BODY);
                        match S::charge(&idem, &request, size, one_commit).await {
                            Outcome::Executed(stored) => {
                                black_box(stored);
                            }
                            other => panic!("a fresh key was not executed: {other:?}"),
                        }
                    })
                })
            }
            Path::Replay => {
                let key = format!("done-{}", self.next.fetch_add(1, Ordering::Relaxed));
                let asked = Arc::new(request(&idem, &consumer, &key, BODY));
                let first = S::charge(&idem, &asked, size, one_commit).await;
                assert!(
                    matches!(first, Outcome::Executed(_)),
                    "a new key was answered"
                );
                Arc::new(move || {
                    let (idem, asked) = (idem.clone(), Arc::clone(&asked));
                    Box::pin(async move {
                        match S::charge(&idem, &asked, size, one_commit).await {
                            Outcome::Answered(Answer::Replay(stored)) => {
                                black_box(stored);
                            }
                            other => panic!("unexpected answer: {other:?}"),
                        }
                    })
                })
            }
            other => panic!("run_in_transaction is not measured on {}", other.name()),
        }
    }
}
