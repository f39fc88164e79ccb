//! The advisory-lock keys of a fresh reservation's gate (`sql/reserve.sql`, C15): what keeps a
//! reservation from waiting on another one that is not committed yet.
//!
//! A one-commit execution inserts its reservation inside its own transaction, which commits
//! only with the effect. Another reservation of the same record must neither wait for that
//! transaction (an `INSERT .. ON CONFLICT` on the key would, C5) nor miss it (a plain read does
//! not see an uncommitted row). So every fresh reservation takes transaction-scoped advisory
//! locks on two keys first, tried, never waited for:
//!
//! Both keys are derived from the records' table (schema-qualified) too: advisory locks are the
//! whole database's, and two tables' records are unrelated.
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
    pub(crate) record: i64,
    pub(crate) fingerprint: i64,
}

/// The two derivations of one table's gate keys, with the table already absorbed: made once
/// per store, cloned per reservation (a clone copies a hasher's state; a new derivation hashes
/// its context first). The keys are exactly [`GateKeys::of`]'s.
#[derive(Debug, Clone)]
pub(crate) struct Gate {
    record: blake3::Hasher,
    with_fingerprint: blake3::Hasher,
}

impl Gate {
    pub(crate) fn new(namespace: &str) -> Self {
        let mut record = blake3::Hasher::new_derive_key(RECORD_CONTEXT);
        table(&mut record, namespace);
        let mut with_fingerprint = blake3::Hasher::new_derive_key(FINGERPRINT_CONTEXT);
        table(&mut with_fingerprint, namespace);
        Self {
            record,
            with_fingerprint,
        }
    }

    /// The keys of `id` and `fingerprint` in this table.
    pub(crate) fn keys(&self, id: &RecordId, fingerprint: &Fingerprint) -> GateKeys {
        let digest = id.digest();
        let mut record = self.record.clone();
        record.update(&digest);
        let mut with_fingerprint = self.with_fingerprint.clone();
        with_fingerprint.update(&digest);
        with_fingerprint.update(fingerprint.as_bytes());
        GateKeys {
            record: first_64_bits(&record.finalize()),
            fingerprint: first_64_bits(&with_fingerprint.finalize()),
        }
    }
}

const RECORD_CONTEXT: &str = "idem-postgres 2026 gate record v2";
const FINGERPRINT_CONTEXT: &str = "idem-postgres 2026 gate fingerprint v2";

impl GateKeys {
    #[cfg(test)]
    pub(crate) fn of(namespace: &str, id: &RecordId, fingerprint: &Fingerprint) -> Self {
        let mut with_fingerprint = blake3::Hasher::new_derive_key(FINGERPRINT_CONTEXT);
        in_table(&mut with_fingerprint, namespace, id);
        with_fingerprint.update(fingerprint.as_bytes());
        Self {
            record: Self::record(namespace, id),
            fingerprint: first_64_bits(&with_fingerprint.finalize()),
        }
    }

    pub(crate) fn record(namespace: &str, id: &RecordId) -> i64 {
        let mut record = blake3::Hasher::new_derive_key(RECORD_CONTEXT);
        in_table(&mut record, namespace, id);
        first_64_bits(&record.finalize())
    }
}

fn table(hasher: &mut blake3::Hasher, namespace: &str) {
    hasher.update(&(namespace.len() as u64).to_le_bytes());
    hasher.update(namespace.as_bytes());
}

fn in_table(hasher: &mut blake3::Hasher, namespace: &str, id: &RecordId) {
    table(hasher, namespace);
    hasher.update(&id.digest());
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

    /// The keys of `fingerprint_of("k-1", b"{}")` in `public.idem_records`.
    const GOLDEN: GateKeys = GateKeys {
        record: -946_163_856_806_479_808,
        fingerprint: 8_627_687_960_950_826_148,
    };

    #[test]
    fn c15_the_keys_tell_records_bodies_and_tables_apart() {
        let (id, same) = fingerprint_of("k-1", b"{}");
        let (_, other) = fingerprint_of("k-1", b"{\"cents\":1}");
        let (elsewhere, _) = fingerprint_of("k-2", b"{}");
        let table = "public.idem_records";
        let keys = GateKeys::of(table, &id, &same);
        assert_eq!(keys, GateKeys::of(table, &id, &same), "deterministic");
        let other_body = GateKeys::of(table, &id, &other);
        assert_eq!(keys.record, other_body.record, "one record, one record key");
        assert_ne!(keys.fingerprint, other_body.fingerprint);
        assert_ne!(keys.record, GateKeys::of(table, &elsewhere, &same).record);
        let other_table = GateKeys::of("tenant_2.idem_records", &id, &same);
        assert_ne!(keys.record, other_table.record, "another table's record");
        assert_ne!(keys.fingerprint, other_table.fingerprint);
        assert_eq!(keys.record, GateKeys::record(table, &id));
        assert_ne!(
            keys.record, keys.fingerprint,
            "the two derivations are distinct"
        );
        // The store's prepared derivations give the same keys (processes of both releases
        // share the gate during a deploy).
        let gate = Gate::new(table);
        assert_eq!(gate.keys(&id, &same), keys);
        assert_eq!(gate.keys(&id, &other), other_body);
        assert_eq!(
            Gate::new("tenant_2.idem_records").keys(&id, &same),
            other_table
        );
        // The pinned values of this release's keys.
        assert_eq!(keys, GOLDEN);
    }
}
