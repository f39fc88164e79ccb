//! Who a record belongs to (C2).

use crate::error::{Error, Field};
use crate::key::IdempotencyKey;
use std::sync::LazyLock;

/// The derivations of a record id, each context absorbed once per process: a new derivation
/// hashes its context first (a compression per request), a clone copies the hasher's state.
static RECORD_ID: LazyLock<blake3::Hasher> =
    LazyLock::new(|| blake3::Hasher::new_derive_key("idem 2026 record id v1"));
static DOWNSTREAM: LazyLock<blake3::Hasher> =
    LazyLock::new(|| blake3::Hasher::new_derive_key("idem 2026 downstream idempotency key v1"));

/// The consumer (the authenticated caller) and route (the operation, `"POST /v1/charges"`) a
/// key lives under (C2): equal keys under another scope are unrelated. Each part is
/// 1..=[`Scope::MAX_CONSUMER_LEN`] / [`Scope::MAX_ROUTE_LEN`] bytes, no control characters.
///
/// ```
/// use idem_core::Scope;
/// let scope = Scope::new("acct_42", "POST /v1/charges")?;
/// assert_eq!(scope.consumer(), "acct_42");
/// assert!(Scope::new("", "POST /v1/charges").is_err());
/// # Ok::<(), idem_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope {
    consumer: String,
    route: String,
}

impl Scope {
    /// The longest consumer accepted, in bytes.
    pub const MAX_CONSUMER_LEN: usize = 255;
    /// The longest route accepted, in bytes.
    pub const MAX_ROUTE_LEN: usize = 1024;

    /// Validates both parts.
    pub fn new(consumer: &str, route: &str) -> Result<Self, Error> {
        check_part(Field::Consumer, consumer, Self::MAX_CONSUMER_LEN)?;
        check_part(Field::Route, route, Self::MAX_ROUTE_LEN)?;
        Ok(Self {
            consumer: consumer.to_owned(),
            route: route.to_owned(),
        })
    }

    /// The consumer (the authenticated caller).
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// The route (the operation).
    pub fn route(&self) -> &str {
        &self.route
    }

    /// Checks `consumer` as [`Scope::new`] does, without making a scope.
    ///
    /// ```
    /// use idem_core::Scope;
    /// assert!(Scope::check_consumer("acct_42").is_ok());
    /// assert!(Scope::check_consumer("").is_err());
    /// ```
    pub fn check_consumer(consumer: &str) -> Result<(), Error> {
        check_part(Field::Consumer, consumer, Self::MAX_CONSUMER_LEN)
    }

    /// Checks `route` as [`Scope::new`] does, without making a scope.
    ///
    /// ```
    /// use idem_core::Scope;
    /// assert!(Scope::check_route("POST /v1/charges").is_ok());
    /// assert!(Scope::check_route("").is_err());
    /// ```
    pub fn check_route(route: &str) -> Result<(), Error> {
        check_part(Field::Route, route, Self::MAX_ROUTE_LEN)
    }
}

pub(crate) fn check_part(field: Field, value: &str, max: usize) -> Result<(), Error> {
    if value.is_empty() {
        return Err(Error::invalid(field, "empty"));
    }
    if value.len() > max {
        return Err(Error::invalid(
            field,
            format!("{} bytes, at most {max} allowed", value.len()),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::invalid(field, "contains a control character"));
    }
    Ok(())
}

/// The identity of one record: (consumer, route, key).
///
/// ```
/// use idem_core::{IdempotencyKey, RecordId, Scope};
/// let a = RecordId::new(Scope::new("a:b", "c")?, IdempotencyKey::new("k")?);
/// let b = RecordId::new(Scope::new("a", "b:c")?, IdempotencyKey::new("k")?);
/// assert_ne!(a, b);
/// assert_ne!(a.digest(), b.digest());
/// # Ok::<(), idem_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordId {
    /// Consumer and route.
    pub scope: Scope,
    /// The client's key.
    pub key: IdempotencyKey,
}

const DOWNSTREAM_PREFIX: &str = "idem_";
const DOWNSTREAM_BYTES: usize = 16;

impl RecordId {
    /// Puts the triple together.
    pub fn new(scope: Scope, key: IdempotencyKey) -> Self {
        Self { scope, key }
    }

    /// The consumer.
    pub fn consumer(&self) -> &str {
        self.scope.consumer()
    }

    /// The route.
    pub fn route(&self) -> &str {
        self.scope.route()
    }

    /// The key.
    pub fn key(&self) -> &str {
        self.key.as_str()
    }

    /// A 32-byte digest of the triple, for a flat key (Redis); no two triples collide.
    pub fn digest(&self) -> [u8; 32] {
        *self.hashed(&RECORD_ID).as_bytes()
    }

    /// [`Lease::downstream_key`](crate::Lease::downstream_key), unrelated to the digest.
    pub fn downstream_key(&self) -> String {
        let digest = self.hashed(&DOWNSTREAM);
        let hex = crate::hex::lower(&digest.as_bytes()[..DOWNSTREAM_BYTES]);
        format!("{DOWNSTREAM_PREFIX}{hex}")
    }

    /// blake3 in `derivation`'s derive-key context over each part's length (u64 LE) and bytes
    /// (C2).
    fn hashed(&self, derivation: &blake3::Hasher) -> blake3::Hash {
        let mut hasher = derivation.clone();
        for part in [self.consumer(), self.route(), self.key()] {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part.as_bytes());
        }
        hasher.finalize()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The record id of a valid triple (for the crate's tests).
    pub(crate) fn id(c: &str, r: &str, k: &str) -> RecordId {
        RecordId::new(
            Scope::new(c, r).expect("valid scope"),
            IdempotencyKey::new(k).expect("valid key"),
        )
    }

    #[test]
    fn c02_rejects_empty_long_and_control_parts() {
        assert!(Scope::new("", "r").is_err());
        assert!(Scope::new("c", "").is_err());
        assert!(Scope::new(&"c".repeat(256), "r").is_err());
        assert!(Scope::new("c", &"r".repeat(1025)).is_err());
        assert!(Scope::new("c\n", "r").is_err());
        assert!(Scope::new("c", "r\0").is_err());
        assert!(Scope::new(&"c".repeat(255), &"r".repeat(1024)).is_ok());
    }

    #[test]
    fn c02_no_join_ambiguity_between_triples() {
        let triples = [
            id("a:b", "c", "d"),
            id("a", "b:c", "d"),
            id("a", "b", "c:d"),
            id("ab", "c", "d"),
            id("a", "bc", "d"),
        ];
        for (i, x) in triples.iter().enumerate() {
            for y in &triples[i + 1..] {
                assert_ne!(x, y);
                assert_ne!(x.digest(), y.digest());
            }
        }
    }
}
