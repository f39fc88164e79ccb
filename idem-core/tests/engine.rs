//! Engine behaviour that no store can show: a store that is down (C13), and tracing.

use idem_core::{
    async_trait, Begin, Error, Idempotency, Lease, Outcome, Record, RecordId, Request, RunError,
    Store, StoredResponse, Timestamp,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A store whose every call fails, like a database that is down.
struct DownStore;

fn down() -> Error {
    Error::unavailable(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        "connection refused",
    ))
}

#[async_trait]
impl Store for DownStore {
    async fn reserve(&self, _: &Request, _: Duration) -> Result<Begin, Error> {
        Err(down())
    }
    async fn complete(&self, _: &Lease, _: &StoredResponse, _: Duration) -> Result<(), Error> {
        Err(down())
    }
    async fn release(&self, _: &Lease) -> Result<(), Error> {
        Err(down())
    }
    async fn renew(&self, _: &Lease, _: Duration) -> Result<Timestamp, Error> {
        Err(down())
    }
    async fn purge_expired(&self, _: usize) -> Result<usize, Error> {
        Err(down())
    }
    async fn lookup(&self, _: &RecordId) -> Result<Option<Record>, Error> {
        Err(down())
    }
}

#[tokio::test]
async fn c13_store_down_is_an_error_and_the_effect_never_runs_unprotected() {
    let idem = Idempotency::new(DownStore);
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some("k"))
        .body(b"{}")
        .build()
        .expect("valid");
    let ran = AtomicUsize::new(0);
    let result = idem
        .run(&request, |_| async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(StoredResponse::new(201, "charged"))
        })
        .await;
    let Err(RunError::Idem(err)) = result else {
        panic!("expected a store error, got {result:?}");
    };
    assert!(matches!(err, Error::StoreUnavailable(_)));
    assert_eq!(err.http_status(), 503);
    assert!(err.is_retryable());
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn c08_handler_error_with_store_down_still_returns_the_handler_error() {
    // begin works, release fails: the caller still learns what the handler said.
    struct FlakyStore(idem_core::MemoryStore);
    #[async_trait]
    impl Store for FlakyStore {
        async fn reserve(&self, r: &Request, l: Duration) -> Result<Begin, Error> {
            self.0.reserve(r, l).await
        }
        async fn complete(&self, l: &Lease, r: &StoredResponse, d: Duration) -> Result<(), Error> {
            self.0.complete(l, r, d).await
        }
        async fn release(&self, _: &Lease) -> Result<(), Error> {
            Err(down())
        }
        async fn renew(&self, l: &Lease, d: Duration) -> Result<Timestamp, Error> {
            self.0.renew(l, d).await
        }
        async fn purge_expired(&self, n: usize) -> Result<usize, Error> {
            self.0.purge_expired(n).await
        }
        async fn lookup(&self, id: &RecordId) -> Result<Option<Record>, Error> {
            self.0.lookup(id).await
        }
    }
    let idem = Idempotency::new(FlakyStore(idem_core::MemoryStore::new()));
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some("k"))
        .body(b"{}")
        .build()
        .expect("valid");
    let result = idem
        .run(&request, |_| async {
            Err::<StoredResponse, _>("declined by bank")
        })
        .await;
    assert!(matches!(result, Err(RunError::Handler("declined by bank"))));
    // The reservation stays until its lease passes: a retry now is in flight, not a second run.
    let retry = idem
        .run(&request, |_| async {
            Ok::<_, &str>(StoredResponse::new(201, ""))
        })
        .await;
    assert!(matches!(retry, Ok(Outcome::InFlight { .. })));
}

#[tokio::test]
async fn invalid_policy_is_rejected() {
    let policy = idem_core::Policy::default().lease(Duration::ZERO);
    assert!(Idempotency::with_policy(idem_core::MemoryStore::new(), policy).is_err());
}

#[tokio::test]
async fn c07_invalid_response_is_not_stored() {
    let idem = Idempotency::new(idem_core::MemoryStore::new());
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some("k"))
        .body(b"{}")
        .build()
        .expect("valid");
    let Begin::Acquired(lease) = idem.begin(&request).await.expect("begin") else {
        panic!("fresh key");
    };
    let err = idem
        .complete(lease.clone(), StoredResponse::new(1000, ""))
        .await
        .expect_err("status 1000");
    assert!(matches!(err, Error::InvalidInput { .. }));
    // Still in progress: the holder can complete properly.
    idem.complete(lease, StoredResponse::new(200, ""))
        .await
        .expect("complete");
}
