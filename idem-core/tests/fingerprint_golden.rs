//! Golden fingerprints (C3): digests pinned byte for byte, raw bodies and already canonical ones.
//!
//! Stores keep a request's fingerprint for the whole retention window, and a retry matches its
//! record only if it computes the same digest. These digests were computed before canonical JSON
//! and canonical forms moved out of idem-core (idem-tower's `canonical` module makes the bytes
//! now, and the builder hashes them in their domain): a change to an expected value here is a
//! breaking change that turns every retained key's retry into a 422, so it needs a new
//! fingerprint version, not an edit of this table. idem-tower's `fingerprint_golden.rs` pins the
//! same digests from the bodies as sent, through its canonicalisation.

use idem_core::{Fingerprint, Request};

fn hex(fingerprint: &Fingerprint) -> String {
    fingerprint
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn c03_golden_raw_fingerprints() {
    let raw = Fingerprint::builder()
        .method("POST")
        .path("/v1/charges")
        .body(br#"{"amount":100}"#)
        .finish();
    assert_eq!(
        hex(&raw),
        "71e0b2941f8bdc83cddf9581ed57a8abd70e80b087d4bcc894651a57349022b9"
    );
    let typed = Fingerprint::builder()
        .method("POST")
        .path("/v1/charges?notify=1")
        .media_type("application/json")
        .header("X-Tenant", b"t1")
        .body(br#"{"amount":100}"#)
        .finish();
    assert_eq!(
        hex(&typed),
        "2e7d4116cc799e1f66c01a89dc099fde3de7fccc804a27896c1c17c28cf4e3c1"
    );
    assert_eq!(
        hex(&Fingerprint::builder().finish()),
        "36b52a69b9f3ed1d73d57723404f6a4d252dc67d87e9699af281c1c004841144"
    );
    let request = Request::builder("acct_42", "POST", "/v1/charges")
        .key(Some("k-1"))
        .content_type("text/plain")
        .body(b"amount=100")
        .build()
        .expect("a request");
    assert_eq!(
        hex(request.fingerprint()),
        "c421ccb5946924ab11939ea709e11c35cf421fa7f637604d1f043d4a11a396bb"
    );
}

#[test]
fn c03_golden_canonical_json_fingerprints() {
    let json = Fingerprint::builder()
        .method("POST")
        .path("/v1/charges")
        .media_type("application/json")
        .canonical_json(r#"{"a":"é","amount":1e2,"b":[1,{"x":2,"y":1}]}"#.as_bytes())
        .finish();
    assert_eq!(
        hex(&json),
        "9454c0066f37784ced23cde28710eec22d0d96242da5c6036984915c2985d1b3"
    );
    let plain = Fingerprint::builder()
        .canonical_json(br#"{"amount":100}"#)
        .finish();
    assert_eq!(
        hex(&plain),
        "bd99addd46c771e8bf95a5e4fb387d48f3ae1f334384003fcd8b3657edc5ba43"
    );
    let body =
        br#"{"amount": 1000, "currency": "eur", "metadata": {"sent_at": "10:00", "order": 7}}"#;
    let request = Request::builder("acct_42", "post", "/customers/{id}/refunds")
        .path("/customers/cus_A/refunds?notify=1")
        .key(Some("k-1"))
        .content_type("Application/JSON; charset=utf-8")
        .header("x-tenant", b"t1")
        .body(body)
        .canonical_json(br#"{"amount":1000,"currency":"eur","metadata":{"order":7}}"#)
        .build()
        .expect("a request");
    assert_eq!(
        hex(request.fingerprint()),
        "3a30917003b1cc3373327ba325d6282441c119ad4143ed2b6129bd1c92c0ddf2"
    );
    assert_eq!(request.body_len(), body.len());
}

#[test]
fn c03_golden_canonical_form_fingerprints() {
    let form = Fingerprint::builder()
        .method("POST")
        .path("/v1/charges")
        .media_type("application/x-www-form-urlencoded")
        .canonical_form(b"amount=1000&currency=eur&note=caf%C3%A9+au+lait")
        .finish();
    assert_eq!(
        hex(&form),
        "31eb6d763c10ee288d1ca08f3fc429d7106d6ab70382425134a57fed6ff239fc"
    );
    let plain = Fingerprint::builder().canonical_form(b"a=%7E&b=2").finish();
    assert_eq!(
        hex(&plain),
        "b4db6372c48c92a620fd962c871b20c580d01a4fc3c4791b0aa317717d3bfee5"
    );
    let request = Request::builder("acct_42", "POST", "/v1/charges")
        .key(Some("k-1"))
        .content_type("application/x-www-form-urlencoded")
        .body(b"currency=usd&amount=100&flag")
        .canonical_form(b"amount=100&currency=usd&flag=")
        .build()
        .expect("a request");
    assert_eq!(
        hex(request.fingerprint()),
        "e9dff9004667dde5d1bb4df7d55b5fb6d202d843c082b94205afcc5c77d05c45"
    );
}
