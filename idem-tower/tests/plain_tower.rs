//! The layer around a plain tower service (hyper's `service_fn` shape), without axum.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_core::{Idempotency, MemoryStore};
use idem_tower::{ConsumerError, IdempotencyLayer, RequestBody};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tower::{Layer, ServiceExt};

async fn send<S>(service: S) -> (StatusCode, Option<http::HeaderValue>, Bytes)
where
    S: tower::Service<Request<Full<Bytes>>, Response = Response<Full<Bytes>>, Error = Infallible>,
{
    let request = Request::post("/v1/orders?x=1")
        .header("idempotency-key", "order-1")
        .body(Full::new(Bytes::from_static(b"{\"sku\":42}")))
        .expect("a request");
    let response = service.oneshot(request).await.expect("infallible");
    let replayed = response.headers().get("idempotent-replayed").cloned();
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    (status, replayed, body)
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
    let layer = IdempotencyLayer::new(
        Idempotency::new(MemoryStore::new()),
        |_: &http::request::Parts| Ok::<_, ConsumerError>("acct_1".to_owned()),
    );
    let service = layer.layer(inner);
    let (status, replayed, body) = send(service.clone()).await;
    assert_eq!(
        (status, replayed, &body[..]),
        (StatusCode::CREATED, None, &b"call 1: 10 bytes"[..])
    );
    let (status, replayed, again) = send(service.clone()).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        replayed.as_ref().and_then(|v| v.to_str().ok()),
        Some("true")
    );
    assert_eq!(again, body);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // A GET passes through with its body stream untouched.
    let get = Request::get("/v1/orders")
        .body(Full::new(Bytes::from_static(b"abc")))
        .expect("a request");
    let response = service.oneshot(get).await.expect("infallible");
    let body = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    assert_eq!(&body[..], b"call 2: 3 bytes");
}
