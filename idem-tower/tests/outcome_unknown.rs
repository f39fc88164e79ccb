//! A handler that marks its response `OutcomeUnknown` (its upstream call timed out after it was
//! sent) has it stored in doubt (C8; docs/state-machine.md, "Records in doubt"): every retry
//! replays it and nothing runs again, the note it attached reaches the reconciler, and once the
//! record is settled the retry gets the real answer; released, the retry executes once.
#![cfg(feature = "axum")]

mod support;

use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use idem_core::store::Deadline;
use idem_core::{Idempotency, MemoryStore, StoredResponse};
use idem_ops::reconcile::{Decided, Finding};
use idem_ops::{ListQuery, Operator};
use idem_tower::{IdempotencyLayer, OutcomeUnknown};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use support::{build_request, fixed_account, send_in_time};

/// `/charge` times out at its provider on its first execution of a key (marking the answer
/// in doubt with the provider's key), and charges on any later one; executions are counted.
fn app(idem: &Idempotency<Arc<MemoryStore>>, executed: &Arc<AtomicUsize>) -> Router {
    let executed = Arc::clone(executed);
    Router::new()
        .route(
            "/charge",
            post(move || {
                let executed = Arc::clone(&executed);
                async move {
                    let n = executed.fetch_add(1, Ordering::SeqCst) + 1;
                    if n == 1 {
                        return (
                            StatusCode::BAD_GATEWAY,
                            OutcomeUnknown::noting("provider key pk_1"),
                            "the provider did not answer",
                        )
                            .into_response();
                    }
                    (StatusCode::CREATED, format!("charge {n}")).into_response()
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(idem.clone(), fixed_account))
}

use axum::response::IntoResponse;

fn charge(key: &str) -> axum::http::Request<axum::body::Body> {
    build_request(
        "POST",
        "/charge",
        &[("content-type", "application/json")],
        Some(key),
        "{}",
    )
}

#[tokio::test]
async fn c08_an_outcome_unknown_response_is_stored_in_doubt_and_settled_by_the_reconciler() {
    let store = Arc::new(MemoryStore::new());
    let idem = Idempotency::new(Arc::clone(&store));
    let executed = Arc::new(AtomicUsize::new(0));
    let app = app(&idem, &executed);

    let first = send_in_time(&app, charge("k-doubt")).await;
    assert_eq!(first.status, StatusCode::BAD_GATEWAY, "{first:?}");
    let retry = send_in_time(&app, charge("k-doubt")).await;
    assert_eq!(
        (retry.status, retry.body.as_str()),
        (StatusCode::BAD_GATEWAY, "the provider did not answer")
    );
    assert_eq!(
        retry
            .headers
            .get("idempotent-replayed")
            .map(|v| v.as_bytes()),
        Some(&b"true"[..])
    );
    assert_eq!(executed.load(Ordering::SeqCst), 1, "nothing ran again");

    let listed = store
        .list(&ListQuery::in_doubt(), Deadline::default())
        .await
        .expect("list");
    assert_eq!(listed.records.len(), 1, "{listed:?}");
    let case = idem_ops::reconcile::in_doubt(&idem, &listed.records[0].id)
        .await
        .expect("read")
        .expect("in doubt");
    assert_eq!(case.doubt.note, "provider key pk_1");
    assert_eq!(case.answer.status, 502);
    let settled = Finding::settled(StoredResponse::new(201, "charge pk_1"));
    let resolved = idem_ops::reconcile::resolve(&idem, &case, settled, "reconciler")
        .await
        .expect("resolve");
    assert!(
        matches!(resolved, Some(Decided::Settled { .. })),
        "{resolved:?}"
    );

    let after = send_in_time(&app, charge("k-doubt")).await;
    assert_eq!(
        (after.status, after.body.as_str()),
        (StatusCode::CREATED, "charge pk_1")
    );
    assert_eq!(
        executed.load(Ordering::SeqCst),
        1,
        "the real answer is replayed"
    );
}

#[tokio::test]
async fn c08_a_released_record_in_doubt_executes_once_on_the_retry() {
    let store = Arc::new(MemoryStore::new());
    let idem = Idempotency::new(Arc::clone(&store));
    let executed = Arc::new(AtomicUsize::new(0));
    let app = app(&idem, &executed);

    let first = send_in_time(&app, charge("k-never")).await;
    assert_eq!(first.status, StatusCode::BAD_GATEWAY);
    let listed = store
        .list(&ListQuery::in_doubt(), Deadline::default())
        .await
        .expect("list");
    let case = idem_ops::reconcile::in_doubt(&idem, &listed.records[0].id)
        .await
        .expect("read")
        .expect("in doubt");
    let released = idem_ops::reconcile::resolve(&idem, &case, Finding::not_happened(), "operator")
        .await
        .expect("resolve");
    assert_eq!(released, Some(Decided::Released));

    let (a, b) = tokio::join!(
        send_in_time(&app, charge("k-never")),
        send_in_time(&app, charge("k-never"))
    );
    assert_eq!(
        executed.load(Ordering::SeqCst),
        2,
        "one more execution: {a:?} {b:?}"
    );
    let again = send_in_time(&app, charge("k-never")).await;
    assert_eq!(
        (again.status, again.body.as_str()),
        (StatusCode::CREATED, "charge 2")
    );
}
