//! A decision about a record in doubt whose store applied it, lost the answer and tried again
//! (a pooled connection found dead after the commit) is reported as applied, not contested: the
//! decision recognises its own entry in the audit trail (docs/state-machine.md, "Records in
//! doubt"). A decision someone else made first is still contested.

use idem_core::store::Deadline;
use idem_core::store::{async_trait, Acquire, Claim, Completion, Record, Reserved, Resolution};
use idem_core::{
    Error, Failure, Idempotency, Lease, MemoryStore, RecordId, Store, StoredResponse, Timestamp,
};
use idem_ops::reconcile::{in_doubt, resolve, Decided, Finding, Reconciliation};
use idem_ops::{Inspected, ListQuery, Operator, Page, Stats};
use std::time::Duration;

/// The memory store, whose `resolve` runs twice and answers the second run: the answer of the
/// first, which applied, was lost.
struct LosesResolveAnswers(MemoryStore);

#[async_trait]
impl Store for LosesResolveAnswers {
    async fn reserve(&self, claim: &Claim<'_>, deadline: Deadline) -> Result<Reserved, Error> {
        self.0.reserve(claim, deadline).await
    }
    async fn replace(
        &self,
        claim: &Claim<'_>,
        acquire: Acquire,
        deadline: Deadline,
    ) -> Result<Reserved, Error> {
        self.0.replace(claim, acquire, deadline).await
    }
    async fn complete(&self, c: &Completion, deadline: Deadline) -> Result<(), Error> {
        self.0.complete(c, deadline).await
    }
    async fn release(&self, l: &Lease, deadline: Deadline) -> Result<(), Error> {
        self.0.release(l, deadline).await
    }
    async fn renew(&self, l: &Lease, d: Duration, deadline: Deadline) -> Result<Timestamp, Error> {
        self.0.renew(l, d, deadline).await
    }
    async fn purge_expired(&self, n: usize, deadline: Deadline) -> Result<usize, Error> {
        self.0.purge_expired(n, deadline).await
    }
    async fn resolve(&self, r: &Resolution, deadline: Deadline) -> Result<bool, Error> {
        let _lost = self.0.resolve(r, deadline).await?;
        self.0.resolve(r, deadline).await
    }
    async fn lookup(&self, id: &RecordId, deadline: Deadline) -> Result<Option<Record>, Error> {
        self.0.lookup(id, deadline).await
    }
}

#[async_trait]
impl Operator for LosesResolveAnswers {
    async fn inspect(&self, id: &RecordId, deadline: Deadline) -> Result<Option<Inspected>, Error> {
        self.0.inspect(id, deadline).await
    }
    async fn list(&self, query: &ListQuery, deadline: Deadline) -> Result<Page, Error> {
        self.0.list(query, deadline).await
    }
    async fn stats(&self, deadline: Deadline) -> Result<Stats, Error> {
        self.0.stats(deadline).await
    }
    async fn reconciliations(
        &self,
        id: &RecordId,
        deadline: Deadline,
    ) -> Result<Vec<Reconciliation>, Error> {
        self.0.reconciliations(id, deadline).await
    }
}

#[tokio::test]
async fn c08_a_decision_whose_answer_was_lost_is_reported_applied() {
    let idem = Idempotency::new(LosesResolveAnswers(MemoryStore::new()));
    let request = idem
        .request("acct_1", "POST", "/charges")
        .key(Some("k1"))
        .body(b"{}")
        .build()
        .expect("request");
    let _ = idem
        .run(&request, |_ctx| async {
            Err::<StoredResponse, _>(Failure::unknown("network timed out"))
        })
        .await;
    let case = in_doubt(&idem, request.id())
        .await
        .expect("read")
        .expect("in doubt");
    let settled = Finding::settled(StoredResponse::new(201, "charged"));
    let resolved = resolve(&idem, &case, settled, "reconciler")
        .await
        .expect("resolve");
    assert!(
        resolved == Some(Decided::Settled { status: 201 }),
        "its own decision, applied: {resolved:?}"
    );
    // Someone else's decision came first: the same stale read is contested now.
    let late = resolve(&idem, &case, Finding::not_happened(), "another")
        .await
        .expect("resolve");
    assert_eq!(late, None);
    assert_eq!(
        idem.store()
            .reconciliations(request.id(), Deadline::default())
            .await
            .expect("trail")
            .len(),
        1
    );
}
