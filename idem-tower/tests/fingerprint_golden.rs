//! Golden fingerprints (C3) from the bodies as sent: canonicalised here, hashed by idem-core.
//!
//! The digests are the ones idem-core computed when it parsed bodies itself (its
//! `fingerprint_golden.rs` pins them from the canonical bytes): records stored before
//! canonicalisation moved to the HTTP layer must still match their retries. A change to an
//! expected value here is a breaking change (every retained key's retry would get 422), not an
//! edit of this table.

use idem_core::store::Deadline;
use idem_core::{Fingerprint, Request};
use idem_tower::canonical::{canonical_form, canonical_json};

fn hex(fingerprint: &Fingerprint) -> String {
    fingerprint
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn c03_golden_canonical_json_fingerprints_from_the_body_as_sent() {
    let sent = br#"{ "b": [1, {"y":1,"x":2}], "a": "\u00e9", "t": 9, "amount": 1E+2 }"#;
    let canonical = canonical_json(sent, &["t"]).expect("JSON");
    let json = Fingerprint::builder()
        .method("POST")
        .path("/v1/charges")
        .media_type("application/json")
        .canonical_json(&canonical)
        .finish();
    assert_eq!(
        hex(&json),
        "9454c0066f37784ced23cde28710eec22d0d96242da5c6036984915c2985d1b3"
    );
    let canonical = canonical_json(br#"{"amount":100}"#, &[]).expect("JSON");
    let plain = Fingerprint::builder().canonical_json(&canonical).finish();
    assert_eq!(
        hex(&plain),
        "bd99addd46c771e8bf95a5e4fb387d48f3ae1f334384003fcd8b3657edc5ba43"
    );
    let body =
        br#"{"amount": 1000, "currency": "eur", "metadata": {"sent_at": "10:00", "order": 7}}"#;
    let canonical = canonical_json(body, &["/metadata/sent_at"]).expect("JSON");
    let request = Request::builder("acct_42", "post", "/customers/{id}/refunds")
        .path("/customers/cus_A/refunds?notify=1")
        .key(Some("k-1"))
        .content_type("Application/JSON; charset=utf-8")
        .header("x-tenant", b"t1")
        .body(body)
        .canonical_json(&canonical)
        .build()
        .expect("a request");
    assert_eq!(
        hex(request.fingerprint()),
        "3a30917003b1cc3373327ba325d6282441c119ad4143ed2b6129bd1c92c0ddf2"
    );
}

#[test]
fn c03_golden_canonical_form_fingerprints_from_the_body_as_sent() {
    let canonical =
        canonical_form(b"currency=eur&amount=1000&note=caf%C3%A9+au+lait").expect("a form");
    let form = Fingerprint::builder()
        .method("POST")
        .path("/v1/charges")
        .media_type("application/x-www-form-urlencoded")
        .canonical_form(&canonical)
        .finish();
    assert_eq!(
        hex(&form),
        "31eb6d763c10ee288d1ca08f3fc429d7106d6ab70382425134a57fed6ff239fc"
    );
    let canonical = canonical_form(b"b=2&a=%7e").expect("a form");
    let plain = Fingerprint::builder().canonical_form(&canonical).finish();
    assert_eq!(
        hex(&plain),
        "b4db6372c48c92a620fd962c871b20c580d01a4fc3c4791b0aa317717d3bfee5"
    );
    let body = b"currency=usd&amount=100&flag";
    let canonical = canonical_form(body).expect("a form");
    let request = Request::builder("acct_42", "POST", "/v1/charges")
        .key(Some("k-1"))
        .content_type("application/x-www-form-urlencoded")
        .body(body)
        .canonical_form(&canonical)
        .build()
        .expect("a request");
    assert_eq!(
        hex(request.fingerprint()),
        "e9dff9004667dde5d1bb4df7d55b5fb6d202d843c082b94205afcc5c77d05c45"
    );
}

/// The layer's fingerprints (a JSON body with `canonical_json`, a form body by default, a body
/// of another type raw), read back from the stored records: the digests that records stored before
/// canonicalisation moved out of idem-core carry.
#[tokio::test]
async fn c03_golden_fingerprints_through_the_layer() {
    use axum::body::Body;
    use axum::routing::post;
    use axum::Router;
    use idem_core::{Idempotency, IdempotencyKey, MemoryStore, RecordId, Scope};
    use idem_ops::Operator;
    use std::sync::Arc;
    use tower::ServiceExt;

    let store = Arc::new(MemoryStore::new());
    let layer = idem_tower::IdempotencyLayer::new(
        Idempotency::new(Arc::clone(&store)),
        |_: &http::request::Parts| Ok::<_, idem_tower::ConsumerError>("acct_1".to_owned()),
    )
    .canonical_json(&["/metadata/sent_at"]);
    let app: Router = Router::new()
        .route("/v1/charges", post(|| async { "charged" }))
        .route_layer(layer);
    let cases = [
        (
            "json",
            "application/json; charset=utf-8",
            r#"{ "currency": "eur", "amount": 1000, "metadata": {"sent_at": "10:00", "order": 7} }"#,
            "7571db596238b4385cf4aa851a60108f29df298c9d3efba86423dbb42e4a2bf8",
        ),
        (
            "form",
            "application/x-www-form-urlencoded",
            "currency=usd&amount=100&flag&n=%7e",
            "fd8900a790fb4bbc684397ea0455869137afe21d3977d666ee9bae87bc5abf23",
        ),
        (
            "text",
            "text/plain",
            "amount=100",
            "896aff091158cf8324701e9aa39d9d8edf053163552d9cd982bd7140112e038a",
        ),
        // Duplicate keys: not canonical JSON, so fingerprinted as sent.
        (
            "broken",
            "application/json",
            r#"{"amount":1,"amount":2}"#,
            "c0bc779dac08984299db610354d0303ea053d0a746a6d1b97bce56b6783f5852",
        ),
    ];
    for (key, content_type, body, expected) in cases {
        let request = http::Request::builder()
            .method("POST")
            .uri("/v1/charges?notify=1")
            .header("content-type", content_type)
            .header("idempotency-key", key)
            .body(Body::from(body))
            .expect("a request");
        let response = app.clone().oneshot(request).await.expect("infallible");
        assert_eq!(response.status(), 200, "{key}");
        let id = RecordId::new(
            Scope::new("acct_1", "POST /v1/charges").expect("a scope"),
            IdempotencyKey::new(key).expect("a key"),
        );
        let record = store
            .inspect(&id, Deadline::default())
            .await
            .expect("inspect")
            .expect("stored")
            .record;
        assert_eq!(hex(&record.fingerprint), expected, "{key}");
    }
}
