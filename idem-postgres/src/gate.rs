//! The advisory-lock keys of a fresh reservation's gate (`sql/reserve.sql`, C15): what keeps a
//! reservation from waiting on another one that is not committed yet.
//!
//! A one-commit execution inserts its reservation inside its own transaction, which commits
//! only with the effect. Another reservation of the same record must neither wait for that
//! transaction (an `INSERT .. ON CONFLICT` on the key would, C5) nor miss it (a plain read does
//! not see an uncommitted row). So every fresh reservation takes transaction-scoped advisory
//! locks on two keys first, tried, never waited for:
//!
//! - the record's key, from the record id's digest: exclusive for a one-commit reservation
//!   (held until its COMMIT or ROLLBACK), shared for a two-commit one (held for its statement);
//! - the record's and fingerprint's key, a distinct derivation over the digest and the
//!   fingerprint: it tells a duplicate of the request being executed (in flight) from another
//!   body (mismatch, C3).
//!
//! Each key is 64 bits of blake3 (in derive-key mode, with a context of its own), taken by the
//! single-`bigint` advisory lock functions. Two different records (or fingerprints) share a key
//! with probability 2^-64 per pair of reservations running at the same moment; a collision can
//! only answer one of them "in flight" (a retry then succeeds), never run an effect twice: the
//! primary key still decides every insert. An application's own `bigint` advisory locks share
//! this key space (the same odds apply to them); its two-`int` locks do not.

use idem_core::{Fingerprint, RecordId};

/// The two lock keys of one reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GateKeys {
    /// The record's key.
    pub(crate) record: i64,
    /// The record's and fingerprint's key.
    pub(crate) fingerprint: i64,
}

impl GateKeys {
    /// The keys of `id` reserved with `fingerprint`.
    pub(crate) fn of(id: &RecordId, fingerprint: &Fingerprint) -> Self {
        let digest = id.digest();
        let mut with_fingerprint =
            blake3::Hasher::new_derive_key("idem-postgres 2026 gate fingerprint v1");
        with_fingerprint.update(&digest);
        with_fingerprint.update(fingerprint.as_bytes());
        Self {
            record: Self::record(id),
            fingerprint: first_64_bits(&with_fingerprint.finalize()),
        }
    }

    /// The record's key of `id` (what waits for a one-commit execution of it to end).
    pub(crate) fn record(id: &RecordId) -> i64 {
        let mut record = blake3::Hasher::new_derive_key("idem-postgres 2026 gate record v1");
        record.update(&id.digest());
        first_64_bits(&record.finalize())
    }
}

fn first_64_bits(hash: &blake3::Hash) -> i64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&hash.as_bytes()[..8]);
    i64::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{Idempotency, MemoryStore};

    fn fingerprint_of(key: &str, body: &[u8]) -> (RecordId, Fingerprint) {
        let idem = Idempotency::new(MemoryStore::new());
        let request = idem
            .request("acct", "POST", "/charges")
            .key(Some(key))
            .body(body)
            .build()
            .expect("request");
        (request.id().clone(), *request.fingerprint())
    }

    #[test]
    fn c15_the_keys_tell_records_and_bodies_apart() {
        let (id, same) = fingerprint_of("k-1", b"{}");
        let (_, other) = fingerprint_of("k-1", b"{\"cents\":1}");
        let (elsewhere, _) = fingerprint_of("k-2", b"{}");
        let keys = GateKeys::of(&id, &same);
        assert_eq!(keys, GateKeys::of(&id, &same), "deterministic");
        let other_body = GateKeys::of(&id, &other);
        assert_eq!(keys.record, other_body.record, "one record, one record key");
        assert_ne!(keys.fingerprint, other_body.fingerprint);
        assert_ne!(keys.record, GateKeys::of(&elsewhere, &same).record);
        assert_ne!(
            keys.record, keys.fingerprint,
            "the two derivations are distinct"
        );
    }
}
