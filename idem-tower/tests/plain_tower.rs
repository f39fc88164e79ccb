//! The layer around a plain tower service (hyper's `service_fn` shape), without axum.

mod support;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_core::{Idempotency, MemoryStore};
use idem_tower::{IdempotencyLayer, RequestBody};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use support::{fixed_account, header, send};
use tower::Layer;

fn order() -> Request<Full<Bytes>> {
    Request::post("/v1/orders?x=1")
        .header("idempotency-key", "order-1")
        .body(Full::new(Bytes::from_static(b"{\"sku\":42}")))
        .expect("a request")
}

#[tokio::test]
async fn c07_a_plain_tower_service_is_protected_and_replayed() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let inner = tower::service_fn(move |request: Request<RequestBody>| {
        let calls = Arc::clone(&counted);
        async move {
            let body = request
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            let mut response = Response::new(Full::new(Bytes::from(format!(
                "call {n}: {} bytes",
                body.len()
            ))));
            *response.status_mut() = StatusCode::CREATED;
            Ok::<_, Infallible>(response)
        }
    });
    let layer = IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), fixed_account);
    let service = layer.layer(inner);
    let first = send(&service, order()).await;
    assert_eq!(
        (
            first.status,
            first.headers.get("idempotent-replayed"),
            first.body.as_str()
        ),
        (StatusCode::CREATED, None, "call 1: 10 bytes")
    );
    let again = send(&service, order()).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(header(&again, "idempotent-replayed"), Some("true"));
    assert_eq!(again.body, first.body);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // A GET passes through with its body stream untouched.
    let get = Request::get("/v1/orders")
        .body(Full::new(Bytes::from_static(b"abc")))
        .expect("a request");
    assert_eq!(send(&service, get).await.body, "call 2: 3 bytes");
}
