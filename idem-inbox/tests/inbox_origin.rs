//! Origin verification and event identity under attack (docs/inbox.md, "Wiring a provider"):
//! header tricks, tolerance edges, rotation, look-alike sources and ids, volatile fields.

use idem_core::{Idempotency, MemoryStore};
use idem_inbox::{Ack, Delivery, Inbox, Receipt, SignatureError, SignatureScheme};
use std::time::Duration;
use tokio::time::timeout;

const T: i64 = 1_700_000_000;
const BODY: &[u8] = br#"{"id":"evt_1","type":"payment_intent.succeeded"}"#;

fn scheme(secrets: &[&str]) -> SignatureScheme {
    SignatureScheme::new(secrets.iter().copied()).expect("scheme")
}

fn v1_of(header: &str) -> String {
    header
        .split_once(",v1=")
        .map(|(_, v)| v.to_owned())
        .expect("v1")
}

// ---------------------------------------------------------------------------------------------
// What held: forged, stale, replayed, malformed headers.
// ---------------------------------------------------------------------------------------------

#[test]
fn duplicate_t_is_refused_whatever_the_order_or_values() {
    let s = scheme(&["whsec_a"]);
    let good = s.sign(BODY, T);
    let v1 = v1_of(&good);
    for header in [
        format!("t={T},t={},v1={v1}", T + 1),
        format!("t={},t={T},v1={v1}", T - 1000),
        format!("t={T},v1={v1},t={T}"),
        format!("t={T},v1={v1},t=abc"),
        format!("t={T},v1={v1}, t ={T}"),
    ] {
        assert!(
            matches!(
                s.verify(Some(&header), BODY, T),
                Err(SignatureError::Malformed(_))
            ),
            "{header:?}"
        );
    }
}

#[test]
fn moving_bytes_between_t_and_body_never_verifies() {
    // The MAC is over "<t>.<body>": with t canonical digits, "17.x" / "1.7x" cannot be shifted.
    let s = scheme(&["whsec_a"]);
    let header = s.sign(b"5.{}", 17);
    let v1 = v1_of(&header);
    for (t, body) in [
        ("175", &b"{}"[..]),
        ("1", &b"7.5.{}"[..]),
        ("17.5", &b"{}"[..]),
    ] {
        let forged = format!("t={t},v1={v1}");
        assert!(
            s.verify(Some(&forged), body, 17).is_err(),
            "{forged} {body:?}"
        );
    }
}

#[test]
fn replay_outside_tolerance_and_future_are_refused_at_the_edges() {
    let s = scheme(&["whsec_a"]).tolerance(Duration::from_secs(300));
    let h = s.sign(BODY, T);
    assert_eq!(s.verify(Some(&h), BODY, T + 300), Ok(()));
    assert_eq!(
        s.verify(Some(&h), BODY, T + 301),
        Err(SignatureError::Stale { age_secs: 301 })
    );
    assert_eq!(s.verify(Some(&h), BODY, T - 300), Ok(()));
    assert_eq!(
        s.verify(Some(&h), BODY, T - 301),
        Err(SignatureError::Future { ahead_secs: 301 })
    );
    // A sub-second tolerance truncates to 0: only the same second.
    let tight = scheme(&["whsec_a"]).tolerance(Duration::from_millis(999));
    assert_eq!(tight.verify(Some(&h), BODY, T), Ok(()));
    assert!(tight.verify(Some(&h), BODY, T + 1).is_err());
}

#[test]
fn rotation_old_secret_removed_refuses_old_signatures() {
    let old = scheme(&["whsec_old"]).sign(BODY, T);
    assert_eq!(
        scheme(&["whsec_new", "whsec_old"]).verify(Some(&old), BODY, T),
        Ok(())
    );
    assert_eq!(
        scheme(&["whsec_new"]).verify(Some(&old), BODY, T),
        Err(SignatureError::Mismatch)
    );
    // A secret that is a prefix / suffix of the real one does not verify.
    for s in ["whsec_ol", "whsec_oldx", "hsec_old", "whsec_old "] {
        assert_eq!(
            scheme(&[s]).verify(Some(&old), BODY, T),
            Err(SignatureError::Mismatch),
            "{s:?}"
        );
    }
    // Trailing whitespace in a configured secret is trimmed by from_comma_separated only.
    assert_eq!(
        SignatureScheme::from_comma_separated(" whsec_old ")
            .expect("s")
            .verify(Some(&old), BODY, T),
        Ok(())
    );
}

#[test]
fn header_size_edges_and_odd_bytes() {
    let s = scheme(&["whsec_a"]);
    let good = s.sign(BODY, T);
    // Padded to exactly the limit: parsed; one byte over: refused before parsing.
    let pad = idem_inbox::signature::MAX_HEADER_LEN - good.len() - 1;
    let at_limit = format!("{good},{}", "x".repeat(pad));
    assert_eq!(at_limit.len(), idem_inbox::signature::MAX_HEADER_LEN);
    assert_eq!(s.verify(Some(&at_limit), BODY, T), Ok(()));
    let over = format!("{at_limit}x");
    assert_eq!(
        s.verify(Some(&over), BODY, T),
        Err(SignatureError::Malformed("header too long"))
    );
    // NULs, other control bytes, Unicode digits, a hex MAC with a Unicode char in it.
    let v1 = v1_of(&good);
    for header in [
        format!("t={T}\0,v1={v1}"),
        format!("t=\u{661}\u{667}00000000,v1={v1}"),
        format!("t={T},v1={}\u{e9}", &v1[..62]),
        format!("t={T},v1={v1}\0"),
        format!("t={T};v1={v1}"),
    ] {
        assert!(s.verify(Some(&header), BODY, T).is_err(), "{header:?}");
    }
    // A signature for the empty body does not verify another body and vice versa.
    let empty = s.sign(b"", T);
    assert_eq!(
        s.verify(Some(&empty), b" ", T),
        Err(SignatureError::Mismatch)
    );
}

#[test]
fn a_v1_of_a_different_t_or_of_the_raw_vs_reserialised_body_is_a_mismatch() {
    let s = scheme(&["whsec_a"]);
    let other_t = s.sign(BODY, T - 10);
    let spliced = format!("t={T},v1={}", v1_of(&other_t));
    assert_eq!(
        s.verify(Some(&spliced), BODY, T),
        Err(SignatureError::Mismatch)
    );
    let reserialised = br#"{"id": "evt_1", "type": "payment_intent.succeeded"}"#;
    assert_eq!(
        s.verify(Some(&s.sign(BODY, T)), reserialised, T),
        Err(SignatureError::Mismatch)
    );
}

// ---------------------------------------------------------------------------------------------
// Identity: sources and ids.
// ---------------------------------------------------------------------------------------------

/// Sources that look alike, ids that share prefixes or look like the hashed key itself, the id
/// of one source in another: all distinct events; a source the scope refuses is an error before
/// anything is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookalike_sources_and_ids_never_collide() {
    timeout(Duration::from_secs(20), async {
        let inbox = Inbox::new(Idempotency::new(MemoryStore::new()));
        let hex = blake3::hash(b"evt_1").to_hex().to_string();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("stripe", b"evt_1".to_vec()),
            ("stripe", b"evt_1 ".to_vec()),
            ("stripe", b"evt_".to_vec()),
            ("stripe", hex.clone().into_bytes()),
            ("stripe", b"EVT_1".to_vec()),
            ("Stripe", b"evt_1".to_vec()),
            ("stripe ", b"evt_1".to_vec()),
            ("stripe\u{200b}", b"evt_1".to_vec()),
            ("EVENT /inbox", b"evt_1".to_vec()),
            ("stripe EVENT", b"evt_1".to_vec()),
        ];
        for (source, id) in &cases {
            let ev = inbox
                .event(&Delivery::trusted(source, BODY), id)
                .expect("event");
            let r = inbox
                .receive(&ev, |_ctx| async { Ok::<_, std::io::Error>(Ack::Done) })
                .await
                .expect("answers");
            assert!(
                matches!(r, Receipt::Processed(_)),
                "{source:?} {id:?}: {r:?}"
            );
        }
        for bad in ["", "a\nb", "a\0b"] {
            assert!(
                inbox
                    .event(&Delivery::trusted(bad, BODY), b"evt_1")
                    .is_err(),
                "{bad:?}"
            );
        }
        assert!(inbox
            .event(&Delivery::trusted(&"s".repeat(256), BODY), b"evt_1")
            .is_err());
    })
    .await
    .expect("bounded");
}

/// RISK (depends on the sender): a Stripe event's JSON carries `pending_webhooks`, "the number
/// of webhooks that haven't been successfully delivered". If a redelivery of the same event is
/// rendered with another value (the event also goes to another endpoint, which succeeded in
/// between), the inbox answers 422 `event-id-reused` to a genuine redelivery: a processed event
/// is never acknowledged (Stripe retries for three days and flags the endpoint), and an event
/// in flight gets a non-retryable answer. The fingerprint should ignore sender-volatile fields
/// (`Inbox::event_json` names them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c03_a_redelivery_differing_only_in_a_volatile_field_is_a_duplicate() {
    timeout(Duration::from_secs(20), async {
        let inbox = Inbox::new(Idempotency::new(MemoryStore::new()));
        let first =
            br#"{"id":"evt_9","object":"event","pending_webhooks":2,"type":"invoice.paid"}"#;
        let again =
            br#"{"id":"evt_9","object":"event","pending_webhooks":1,"type":"invoice.paid"}"#;
        let e1 = inbox
            .event_json(
                &Delivery::trusted("stripe", first),
                b"evt_9",
                &["pending_webhooks"],
            )
            .expect("event");
        let r1 = inbox
            .receive(&e1, |_ctx| async { Ok::<_, std::io::Error>(Ack::Done) })
            .await
            .expect("answers");
        assert!(matches!(r1, Receipt::Processed(_)));
        let e2 = inbox
            .event_json(
                &Delivery::trusted("stripe", again),
                b"evt_9",
                &["pending_webhooks"],
            )
            .expect("event");
        let r2 = inbox
            .receive(&e2, |_ctx| async { Ok::<_, std::io::Error>(Ack::Done) })
            .await
            .expect("answers");
        assert!(
            matches!(r2, Receipt::Duplicate(_)),
            "a redelivery of a processed event must be acknowledged: {r2:?}"
        );
    })
    .await
    .expect("bounded");
}

/// The fingerprints of events, pinned (C3): an event's record stored before canonical JSON moved
/// from idem-core to idem-tower must still match its redelivery. A change here is a breaking
/// change, not an edit of this test.
#[test]
fn c03_golden_event_fingerprints() {
    let hex = |event: &idem_inbox::Event| -> String {
        event
            .request()
            .fingerprint()
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let inbox = Inbox::new(Idempotency::new(MemoryStore::new()));
    let json = inbox
        .event_json(
            &Delivery::trusted(
                "stripe",
                br#"{"id":"evt_1","amount":5,"pending_webhooks":2}"#,
            ),
            b"evt_1",
            &["pending_webhooks"],
        )
        .expect("event");
    assert_eq!(
        hex(&json),
        "133d36a42aaac7d631aad949dc2d410132d6ff914e52784f79806e7475b4f097"
    );
    let raw = inbox
        .event_json(
            &Delivery::trusted("stripe", b"not json"),
            b"evt_2",
            &["pending_webhooks"],
        )
        .expect("event");
    assert_eq!(
        hex(&raw),
        "fec4f3f5c7d9dc568082743fed0e9d79a38fc2e7cb8a49efe1716db6030647fd"
    );
}
