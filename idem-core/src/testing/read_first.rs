//! The read before the reservation ([`Capabilities::read_first`](crate::store::Capabilities)):
//! what a store's [`read`](Store::read) reports, and the races between it and the write after.

use super::{policy, request, unique_consumer, Harness, LEASE, SHORT_RETENTION};
use crate::store::{Acquire, Claim, Deadline, RecordState, Reservation, Reserved, Steps, StoreExt};
use crate::{Answer, Begin, Error, Idempotency, Request, Store, StoredResponse};
use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;

/// A reservation's steps, reading first, where another request of the same key reserves
/// right after the read: the record the read reported has changed when the next step runs.
struct ChangedAfterRead<'s, S> {
    store: &'s S,
    other: Option<&'s Request>,
    /// What the other request's reservation got.
    taken: Option<Begin>,
}

#[async_trait]
impl<S: Store> Steps for ChangedAfterRead<'_, S> {
    fn reads_first(&self) -> bool {
        true
    }
    async fn read(&mut self, claim: &Claim<'_>) -> Result<Reserved, Error> {
        let found = self
            .store
            .read(claim.request(), Deadline::default())
            .await?;
        if let Some(other) = self.other.take() {
            let taken = self.store.reservation(other, LEASE, Deadline::default());
            self.taken = Some(taken.await?);
        }
        Ok(found)
    }
    async fn reserve(&mut self, claim: &Claim<'_>) -> Result<Reserved, Error> {
        self.store.reserve(claim, Deadline::default()).await
    }
    async fn replace(&mut self, claim: &Claim<'_>, acquire: Acquire) -> Result<Reserved, Error> {
        self.store
            .replace(claim, acquire, Deadline::default())
            .await
    }
}

/// Reserves `req` reading first while `other` (the same key) reserves right after the read;
/// returns this reservation's answer and the other's.
async fn race<S: Store>(store: &S, req: &Request, other: &Request) -> (Begin, Begin) {
    let mut steps = ChangedAfterRead {
        store,
        other: Some(other),
        taken: None,
    };
    let ours = Reservation::new(req, LEASE)
        .run(&mut steps)
        .await
        .expect("the reservation");
    (ours, steps.taken.expect("the other reservation ran"))
}

fn in_flight(begin: &Begin) -> bool {
    matches!(begin, Begin::Answered(Answer::InFlight { .. }))
}

/// C16 (store rule 8): `read` reports the record as `reserve` does, its response only for the
/// request's fingerprint, an expired record as it is, and writes nothing; no record is `Lost`.
pub async fn c16_a_read_reports_the_record_and_writes_nothing<H: Harness>(harness: &H) {
    let store = Arc::new(harness.store().await);
    // A lease long enough that the in-progress record read stays live on a stalled machine
    // (the suite runs from two processes at once on one SQLite file); expiry is checked on the
    // retention below.
    let policy = policy()
        .lease(Duration::from_secs(30))
        .retention(SHORT_RETENTION);
    let idem = Idempotency::with_policy(Arc::clone(&store), policy).expect("a valid policy");
    let req = request(&unique_consumer("c16r"), "k", b"{}");
    let read = |req: Request| {
        let store = Arc::clone(&store);
        async move { store.read(&req, Deadline::default()).await.expect("read") }
    };
    assert_eq!(read(req.clone()).await, Reserved::Lost, "no record");
    assert!(store
        .lookup(req.id(), Deadline::default())
        .await
        .expect("lookup")
        .is_none());
    let Begin::Acquired(lease) = idem.begin(&req).await.expect("begin") else {
        panic!("a fresh key is acquired")
    };
    // The store's clock before and after the read, as a reservation step reports it.
    let reserved_now = || async {
        let claim = Reservation::new(&req, LEASE);
        match store.reserve(claim.claim(), Deadline::default()).await {
            Ok(Reserved::Found { now, .. }) => now,
            other => panic!("the record is found: {other:?}"),
        }
    };
    let before = reserved_now().await;
    let found = read(req.clone()).await;
    let after = reserved_now().await;
    let capabilities = store.capabilities();
    let reads = match found {
        Reserved::Found { record, now, .. } => {
            assert_eq!(record.token, lease.token());
            assert_eq!(record.fingerprint, *req.fingerprint());
            assert!(record.is_live(now) && record.is_in_progress());
            assert!(
                before <= now && now <= after,
                "the store's now (C11): {before:?} {now:?} {after:?}"
            );
            true
        }
        other => {
            let asked = capabilities.read_first || capabilities.process_gate;
            assert!(!asked, "a store asked to read reads: {other:?}");
            false
        }
    };
    let untouched = store.lookup(req.id(), Deadline::default()).await;
    let untouched = untouched.expect("lookup").map(|r| r.token);
    assert_eq!(untouched, Some(lease.token()), "a read writes nothing");
    let response = StoredResponse::new(201, "charged");
    // Before the completion's write: its retention runs from a later moment.
    let completing = std::time::Instant::now();
    idem.complete(lease, response.clone())
        .await
        .expect("complete");
    if !reads {
        return;
    }
    match read(req.clone()).await {
        Reserved::Found { record, now, .. } => match record.state {
            RecordState::Completed {
                response: Some(bytes),
                expires_at,
            } => {
                // Live, unless the machine stalled past the short retention since.
                if completing.elapsed() < SHORT_RETENTION {
                    assert!(expires_at > now, "live");
                }
                assert_eq!(StoredResponse::decode(&bytes).expect("decodes"), response);
            }
            other => panic!("completed, with the response: {other:?}"),
        },
        other => panic!("the completed record: {other:?}"),
    }
    let other_body = request(req.id().consumer(), "k", b"{\"other\":1}");
    match read(other_body).await {
        Reserved::Found { record, .. } => assert!(matches!(
            record.state,
            RecordState::Completed { response: None, .. }
        )),
        other => panic!("the record, without the response: {other:?}"),
    }
    tokio::time::sleep(SHORT_RETENTION + Duration::from_millis(100)).await;
    match read(req.clone()).await {
        Reserved::Found { record, now, .. } => assert!(!record.is_live(now), "reported as it is"),
        // A store whose server deletes expired records by itself (C10).
        Reserved::Lost => assert!(store.capabilities().server_ttl),
        other => panic!("an expired record: {other:?}"),
    }
}

/// C4, C9, C10 (read first): a record that changes between the read and the write after it is
/// decided again, never acquired twice. No record when read, then reserved by another request:
/// in flight. An orphan when read, then taken over by another: in flight. A record past its
/// retention when read, then started over by another: in flight.
pub async fn c04_a_record_changed_after_the_read_is_decided_again<H: Harness>(harness: &H) {
    let store = Arc::new(harness.store().await);
    let consumer = unique_consumer("c04r");

    let req = request(&consumer, "absent", b"{}");
    let (ours, theirs) = race(&*store, &req, &req.clone()).await;
    assert!(matches!(theirs, Begin::Acquired(_)), "{theirs:?}");
    assert!(in_flight(&ours), "reserved since the read: {ours:?}");

    let req = request(&consumer, "orphan", b"{}");
    let Begin::Acquired(orphan) = store
        .reservation(&req, LEASE, Deadline::default())
        .await
        .expect("reserve")
    else {
        panic!("a fresh key is acquired")
    };
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    let (ours, theirs) = race(&*store, &req, &req.clone()).await;
    match theirs {
        Begin::Acquired(lease) => assert_eq!(lease.acquired(), Acquire::take_over(orphan.token())),
        other => panic!("the other takes the orphan over: {other:?}"),
    }
    assert!(in_flight(&ours), "taken over since the read: {ours:?}");

    let idem = Idempotency::with_policy(Arc::clone(&store), policy().retention(SHORT_RETENTION))
        .expect("a valid policy");
    let req = request(&consumer, "retained", b"{}");
    let Begin::Acquired(lease) = idem.begin(&req).await.expect("begin") else {
        panic!("a fresh key is acquired")
    };
    idem.complete(lease, StoredResponse::new(201, "old"))
        .await
        .expect("complete");
    tokio::time::sleep(SHORT_RETENTION + Duration::from_millis(100)).await;
    let (ours, theirs) = race(&*store, &req, &req.clone()).await;
    assert!(matches!(theirs, Begin::Acquired(_)), "{theirs:?}");
    assert!(in_flight(&ours), "started over since the read: {ours:?}");
}
