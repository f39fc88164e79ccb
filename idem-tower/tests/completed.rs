//! `Completed` responses the layer must not trust (C6, C7).
#![cfg(feature = "axum")]

mod support;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use idem_core::store::Deadline;
use idem_core::{Completion, Idempotency, MemoryStore, Store, StoredResponse};
use idem_tower::{Completed, IdempotencyLayer, Reservation};
use std::sync::{Arc, Mutex};
use support::{build_request, fixed_account, send_in_time};

fn req(key: &str) -> Request<Body> {
    build_request("POST", "/v1/charges", &[], Some(key), "{}")
}

/// The handler writes one completion (a decline) and returns another one of the same lease
/// (a success). The layer sends what is stored, the 402, to the first client as to every retry.
#[tokio::test]
async fn c07_a_completed_reply_sends_the_stored_response() {
    let app: Router = Router::new()
        .route(
            "/v1/charges",
            post(|reservation: Reservation<MemoryStore>| async move {
                let stored = reservation.completion(StoredResponse::new(402, "declined"));
                reservation
                    .idem()
                    .store()
                    .complete(&stored, Deadline::default())
                    .await
                    .expect("complete");
                let other = reservation.completion(StoredResponse::new(201, "charged"));
                Completed(other).into_response()
            }),
        )
        .route_layer(IdempotencyLayer::new(
            Idempotency::new(MemoryStore::new()),
            fixed_account,
        ));
    let live = send_in_time(&app, req("k")).await;
    let replay = send_in_time(&app, req("k")).await;
    assert_eq!(replay.status, StatusCode::PAYMENT_REQUIRED, "{replay:?}");
    assert_eq!(
        (live.status, live.body.as_str()),
        (replay.status, replay.body.as_str()),
        "the live answer must be what is stored (what every retry gets)"
    );
}

/// A handler that returns the completion of *another* request (stashed from an earlier one):
/// a stored 500, never that request's success.
#[tokio::test]
async fn c06_a_completion_from_another_request_is_a_stored_500() {
    let stash: Arc<Mutex<Option<Completion>>> = Arc::new(Mutex::new(None));
    let s = Arc::clone(&stash);
    let app: Router = Router::new()
        .route(
            "/v1/charges",
            post(move |reservation: Reservation<MemoryStore>| {
                let s = Arc::clone(&s);
                async move {
                    let previous = s.lock().expect("lock").take();
                    match previous {
                        None => {
                            let c = reservation.completion(StoredResponse::new(201, "mine"));
                            reservation
                                .idem()
                                .store()
                                .complete(&c, Deadline::default())
                                .await
                                .expect("complete");
                            *s.lock().expect("lock") = Some(c.clone());
                            Completed(c).into_response()
                        }
                        Some(other) => Completed(other).into_response(),
                    }
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(
            Idempotency::new(MemoryStore::new()),
            fixed_account,
        ));
    let a = send_in_time(&app, req("k-a")).await;
    assert_eq!(a.status, StatusCode::CREATED);
    let b = send_in_time(&app, req("k-b")).await;
    assert_eq!(b.status, StatusCode::INTERNAL_SERVER_ERROR, "{b:?}");
    let b2 = send_in_time(&app, req("k-b")).await;
    assert_eq!(b2.status, StatusCode::INTERNAL_SERVER_ERROR, "{b2:?}");
    assert!(b2.headers.get("idempotent-replayed").is_some());
}
