//! Golden record digests (C2): a record id's digest and downstream key, pinned byte for byte.
//!
//! The Redis store names every record by its id's digest, and an effect passes the downstream
//! key to the services it calls, for the whole retention window: a change to an expected value
//! here strands every retained record (a retry would find none and run the effect again) and
//! every downstream deduplication, so it needs a new derivation version, not an edit of this
//! table.

use idem_core::{IdempotencyKey, RecordId, Scope};

fn id(consumer: &str, route: &str, key: &str) -> RecordId {
    let scope = Scope::new(consumer, route).expect("a valid scope");
    RecordId::new(scope, IdempotencyKey::new(key).expect("a valid key"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn c02_golden_record_digests() {
    let charge = id("acct_42", "POST /v1/charges", "k-1");
    assert_eq!(hex(&charge.digest()), DIGEST_CHARGE);
    assert_eq!(charge.downstream_key(), DOWNSTREAM_CHARGE);
    // The parts are delimited by their lengths: moving a byte between them is another record.
    let shifted = id("acct_4", "2POST /v1/charges", "k-1");
    assert_eq!(hex(&shifted.digest()), DIGEST_SHIFTED);
}

const DIGEST_CHARGE: &str = "00093f5b0f15b0b3530d7dca7e93fb6da62764242dc8c8d14c8a961cbda977c6";
const DOWNSTREAM_CHARGE: &str = "idem_31dd8070a8406565a536ae1189d93279";
const DIGEST_SHIFTED: &str = "4b6da278d486b12300413ff56fb63293ce3dcbb6c1113cdee3227a5550e988f8";
