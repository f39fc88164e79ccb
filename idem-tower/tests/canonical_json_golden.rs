//! Golden canonical forms (C3): `canonical_json` pinned byte for byte on payment-like bodies.
//!
//! The fingerprint of a request is a hash over the canonical body, and stores keep that
//! fingerprint for the whole retention window. If the canonical bytes of any of these documents
//! change (a rewrite of the parser, a dependency bump, a "harmless" escaping tweak), every
//! idempotency key still retained at the upgrade that is retried afterwards would compute a
//! different fingerprint and get 422 (mismatch) instead of its stored response. A change to an
//! expected value here is therefore a breaking change: it needs a new fingerprint version (or a
//! migration), not an edit of this table.

use idem_tower::canonical::canonical_json;

/// One pinned case: a name, the body as sent, the exclusions, the exact canonical bytes.
type Case = (
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static str,
);

fn check(cases: &[Case]) {
    for &(name, body, exclude, expected) in cases {
        let out = canonical_json(body.as_bytes(), exclude)
            .unwrap_or_else(|e| panic!("{name}: rejected: {e}"));
        assert_eq!(
            String::from_utf8_lossy(&out),
            expected,
            "{name}: canonical form changed (a breaking change, see the module doc)"
        );
        assert_eq!(out, expected.as_bytes(), "{name}: bytes differ");
        let again = canonical_json(&out, &[])
            .unwrap_or_else(|e| panic!("{name}: canonical form rejected: {e}"));
        assert_eq!(again, out, "{name}: canonical form is not a fixed point");
    }
}

#[test]
fn c03_golden_structure() {
    check(&[
        (
            "flat payment, keys out of order, whitespace",
            r#"{ "currency": "EUR", "amount": 1999, "customer": "cus_42" }"#,
            &[],
            r#"{"amount":1999,"currency":"EUR","customer":"cus_42"}"#,
        ),
        (
            "nested objects sorted at every level",
            r#"{"payment":{"method":{"type":"card","card":{"last4":"4242","exp_year":2030,"exp_month":12}},"amount":500},"capture":true}"#,
            &[],
            r#"{"capture":true,"payment":{"amount":500,"method":{"card":{"exp_month":12,"exp_year":2030,"last4":"4242"},"type":"card"}}}"#,
        ),
        (
            "arrays keep their order, objects inside are sorted",
            r#"{"total":4500,"items":[{"sku":"B-2","qty":1},{"sku":"A-1","qty":3}]}"#,
            &[],
            r#"{"items":[{"qty":1,"sku":"B-2"},{"qty":3,"sku":"A-1"}],"total":4500}"#,
        ),
        (
            "literals and empty containers",
            r#"{"refund":null,"captured":false,"tags":[],"metadata":{},"live":true}"#,
            &[],
            r#"{"captured":false,"live":true,"metadata":{},"refund":null,"tags":[]}"#,
        ),
        (
            "all four whitespace characters dropped",
            "\r\n\t{ \"b\" : [ { \"d\" : [ ] , \"c\" : { } } ] , \"a\" : \"\" }\n",
            &[],
            r#"{"a":"","b":[{"c":{},"d":[]}]}"#,
        ),
        (
            "keys sorted by UTF-8 bytes",
            r#"{"é":1,"z":2,"Z":3,"_":4,"10":5,"9":6,"":7,"\ud83d\ude00":8,"ｚ":9}"#,
            &[],
            r#"{"":7,"10":5,"9":6,"Z":3,"_":4,"z":2,"é":1,"ｚ":9,"😀":8}"#,
        ),
    ]);
}

#[test]
fn c03_golden_strings() {
    check(&[
        (
            "unicode escapes become raw UTF-8",
            r#"{"merchant":"Müller & Söhne","description":"Caf\u00e9 cr\u00E8me \ud83d\ude00"}"#,
            &[],
            r#"{"description":"Café crème 😀","merchant":"Müller & Söhne"}"#,
        ),
        (
            "one escaping for quotes, backslash, slash and control characters",
            r#"{"memo":"l1\nl2\ttab \"q\" back\\slash \/path \u0007bell \u001F \u000a\u0009\u0008\u000C\u000D"}"#,
            &[],
            r#"{"memo":"l1\nl2\ttab \"q\" back\\slash /path \u0007bell \u001f \n\t\b\f\r"}"#,
        ),
        (
            "escaped keys, DEL and U+2028 raw",
            "{\"k\\u0000\":1,\"k\":2,\"del\\u007f\":\"\u{7f}\\u2028\"}",
            &[],
            "{\"del\u{7f}\":\"\u{7f}\u{2028}\",\"k\":2,\"k\\u0000\":1}",
        ),
    ]);
}

#[test]
fn c03_golden_numbers() {
    check(&[
        (
            "integers beyond 64 bits kept digit for digit",
            r#"{"fee":18446744073709551617,"amount":123456789012345678901234567890,"debit":-9223372036854775809}"#,
            &[],
            r#"{"amount":123456789012345678901234567890,"debit":-9223372036854775809,"fee":18446744073709551617}"#,
        ),
        (
            "decimals beyond f64 kept digit for digit",
            r#"{"rate":1234567890123456.78,"fx":0.10000000000000001,"tiny":1e-400}"#,
            &[],
            r#"{"fx":0.10000000000000001,"rate":1234567890123456.78,"tiny":1e-400}"#,
        ),
        (
            "exponent marker lowercased, exponent plus dropped",
            r#"{"a":1E+2,"b":2.5e-3,"c":-1E5,"d":1e+0,"e":6.02E+023}"#,
            &[],
            r#"{"a":1e2,"b":2.5e-3,"c":-1e5,"d":1e0,"e":6.02e023}"#,
        ),
        (
            "otherwise numbers keep their form",
            "[1, 1.0, 1e0, 100, 1e2, -0, 0.50, 0]",
            &[],
            "[1,1.0,1e0,100,1e2,-0,0.50,0]",
        ),
    ]);
}

#[test]
fn c03_golden_exclusions() {
    check(&[
        (
            "bare top-level name and nested pointer",
            r#"{"amount":100,"sent_at":"2026-01-01T10:00:00Z","metadata":{"trace_id":"abc","order":"o-1"}}"#,
            &["sent_at", "/metadata/trace_id"],
            r#"{"amount":100,"metadata":{"order":"o-1"}}"#,
        ),
        (
            "array element and a field inside one, applied in order",
            r#"{"items":[{"sku":"A","note":"gift"},{"sku":"B"},{"sku":"C"}]}"#,
            &["/items/0/note", "/items/1"],
            r#"{"items":[{"sku":"A"},{"sku":"C"}]}"#,
        ),
        (
            "escaped pointer tokens, a bare name with a slash, missing paths",
            r#"{"a/b":1,"m~n":2,"x/y":3,"keep":{"":4,"k":5}}"#,
            &[
                "/a~1b",
                "/m~0n",
                "x/y",
                "/keep/",
                "/missing/x",
                "/keep/k/0",
                "",
            ],
            r#"{"keep":{"k":5}}"#,
        ),
    ]);
}

#[test]
fn c03_golden_rejections_stay_rejected() {
    // Accepting any of these later would also change which requests share a fingerprint.
    let rejected: &[&[u8]] = &[
        br#"{"amount":1,"amount":2}"#,
        br#"{"a":1,"\u0061":2}"#,
        br#"{"amount":01}"#,
        br#"{"amount":1.}"#,
        br#"{"amount":NaN}"#,
        br#"{"amount":1,}"#,
        br#"{"note":"\ud83d"}"#,
        b"\xEF\xBB\xBF{}",
        b"{\"note\":\"\xff\"}",
        b"{} {}",
    ];
    for body in rejected {
        assert!(
            canonical_json(body, &[]).is_err(),
            "{:?} was accepted",
            String::from_utf8_lossy(body)
        );
    }
}
