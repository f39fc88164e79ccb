//! The transactional scenarios: a SQL store writes the completion in the transaction of the
//! business effect, so both commit or vanish together (C6). Run through
//! [`TransactionalHarness`] by every SQL store.

use super::{policy, request, unique_consumer, TransactionalHarness, LEASE};
use crate::store::Deadline;
use crate::store::{Lease, Store};
use crate::{Answer, Begin, Error, Idempotency, Request, StoredResponse};
use std::sync::Arc;
use std::time::Duration;

async fn setup<H: TransactionalHarness>(
    harness: &H,
) -> (Arc<H::Store>, Idempotency<Arc<H::Store>>) {
    let store = Arc::new(harness.store().await);
    let idem = Idempotency::with_policy(Arc::clone(&store), policy()).expect("policy");
    (store, idem)
}

async fn acquire<S: Store + 'static>(idem: &Idempotency<Arc<S>>, request: &Request) -> Lease {
    match idem.begin(request).await.expect("begin") {
        Begin::Acquired(lease) => lease,
        other => panic!("expected to acquire, got {other:?}"),
    }
}

fn charged(n: &str) -> StoredResponse {
    StoredResponse::new(201, format!("{{\"charge\":\"{n}\"}}"))
        .with_header("content-type", "application/json")
}

/// C6: the business row and the completion commit together; the retry replays and no second
/// row is written.
pub async fn tx_c06_effect_and_completion_commit_together<H: TransactionalHarness>(harness: &H) {
    let (store, idem) = setup(harness).await;
    let intent = unique_consumer("tx-commit");
    let req = request(&intent, "k", b"{\"cents\":500}");
    let lease = acquire(&idem, &req).await;
    let completion = idem.completion(&lease, charged("ch_1"));
    harness
        .effect_then_complete(&store, &intent, completion, true)
        .await
        .expect("commit");
    assert_eq!(harness.business_rows(&store, &intent).await, 1);
    assert_eq!(
        idem.begin(&req).await.expect("begin"),
        Begin::Answered(Answer::Replay(charged("ch_1")))
    );
    assert_eq!(harness.business_rows(&store, &intent).await, 1);
}

/// C6: a rolled-back transaction leaves neither the business row nor the completion: the
/// record is still the holder's, in flight, and the holder can still commit.
pub async fn tx_c06_rollback_leaves_neither_effect_nor_completion<H: TransactionalHarness>(
    harness: &H,
) {
    let (store, idem) = setup(harness).await;
    let intent = unique_consumer("tx-rollback");
    let req = request(&intent, "k", b"{\"cents\":700}");
    let lease = acquire(&idem, &req).await;
    harness
        .effect_then_complete(
            &store,
            &intent,
            idem.completion(&lease, charged("x")),
            false,
        )
        .await
        .expect("complete_in inside the rolled-back transaction");
    assert_eq!(harness.business_rows(&store, &intent).await, 0);
    let record = store
        .lookup(req.id(), Deadline::default())
        .await
        .expect("lookup")
        .expect("record");
    assert!(record.is_in_progress());
    assert_eq!(record.token, lease.token());
    assert!(matches!(
        idem.begin(&req).await.expect("begin"),
        Begin::Answered(Answer::InFlight { .. })
    ));
    harness
        .effect_then_complete(&store, &intent, idem.completion(&lease, charged("y")), true)
        .await
        .expect("commit");
    assert_eq!(harness.business_rows(&store, &intent).await, 1);
}

/// C6, C9: a holder whose lease was taken over gets `LeaseLost` from `complete_in`; its
/// transaction rolls back and its business row with it; the new holder's commits: one row.
pub async fn tx_c06_lease_lost_rolls_the_effect_back<H: TransactionalHarness>(harness: &H) {
    let (store, idem) = setup(harness).await;
    let intent = unique_consumer("tx-lost");
    let req = request(&intent, "k", b"{\"cents\":900}");
    let stale = acquire(&idem, &req).await;
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    let fresh = acquire(&idem, &req).await;
    let err = harness
        .effect_then_complete(
            &store,
            &intent,
            idem.completion(&stale, charged("stale")),
            true,
        )
        .await
        .expect_err("fenced out");
    assert!(matches!(err, Error::LeaseLost), "{err:?}");
    assert_eq!(harness.business_rows(&store, &intent).await, 0);
    harness
        .effect_then_complete(
            &store,
            &intent,
            idem.completion(&fresh, charged("fresh")),
            true,
        )
        .await
        .expect("commit");
    assert_eq!(harness.business_rows(&store, &intent).await, 1);
    assert_eq!(
        idem.begin(&req).await.expect("begin"),
        Begin::Answered(Answer::Replay(charged("fresh")))
    );
}

/// C4, C6: 32 tasks run the same request at once, each committing its business row and the
/// completion in one transaction when it acquires: exactly one row, 10 rounds.
pub async fn tx_c04_concurrent_same_key_one_business_row<H: TransactionalHarness>(harness: &H) {
    const TASKS: usize = 32;
    let (store, idem) = setup(harness).await;
    let harness = Arc::new(harness);
    for round in 0..10 {
        let intent = Arc::new(unique_consumer(&format!("tx-conc-{round}")));
        let req = Arc::new(request(&intent, "k", b"{\"cents\":1}"));
        let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
        let mut executed = 0;
        let mut tasks = Vec::new();
        for _ in 0..TASKS {
            let (idem, req, barrier) = (idem.clone(), Arc::clone(&req), Arc::clone(&barrier));
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                idem.begin(&req).await.expect("begin")
            }));
        }
        for task in tasks {
            if let Begin::Acquired(lease) = task.await.expect("task") {
                harness
                    .effect_then_complete(
                        &store,
                        &intent,
                        idem.completion(&lease, charged("c")),
                        true,
                    )
                    .await
                    .expect("commit");
                executed += 1;
            }
        }
        assert_eq!(executed, 1, "round {round}");
        assert_eq!(
            harness.business_rows(&store, &intent).await,
            1,
            "round {round}"
        );
    }
}

/// C7: what a SQL store writes in the caller's transaction is the engine's filtered completion:
/// no cookie, date or credential is stored or replayed.
pub async fn tx_c07_completion_in_transaction_is_filtered<H: TransactionalHarness>(harness: &H) {
    let (store, idem) = setup(harness).await;
    let intent = unique_consumer("tx-filter");
    let req = request(&intent, "k", b"{}");
    let lease = acquire(&idem, &req).await;
    let response = charged("ch_7")
        .with_header("set-cookie", "session=secret")
        .with_header("authorization", "Bearer t")
        .with_header("date", "Mon, 30 Nov 2026 10:00:00 GMT");
    harness
        .effect_then_complete(&store, &intent, idem.completion(&lease, response), true)
        .await
        .expect("commit");
    assert_eq!(
        idem.begin(&req).await.expect("begin"),
        Begin::Answered(Answer::Replay(charged("ch_7")))
    );
}
