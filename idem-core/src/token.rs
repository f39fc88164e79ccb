//! Fencing tokens (C4, C6, C9).

use crate::error::Error;
use std::fmt;

/// A 128-bit token written with every reservation or takeover; only its holder may complete,
/// release or renew the record (C6). Fresh OS randomness, so forked workers never share one.
///
/// ```
/// use idem_core::FencingToken;
/// let a = FencingToken::generate();
/// assert_ne!(a, FencingToken::generate());
/// assert_eq!(FencingToken::from_hex(&a.to_string())?, a);
/// # Ok::<(), idem_core::Error>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FencingToken([u8; 16]);

impl FencingToken {
    /// A fresh token.
    pub fn generate() -> Self {
        let mut token = [0u8; 16];
        if getrandom::fill(&mut token).is_err() {
            token = fallback_random();
        }
        Self(token)
    }

    /// Wraps 16 stored bytes.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// Reads a stored token; anything but 16 bytes is [`Error::CorruptRecord`].
    pub fn from_slice(bytes: &[u8]) -> Result<Self, Error> {
        <[u8; 16]>::try_from(bytes)
            .map(Self)
            .map_err(|_| Error::CorruptRecord(format!("fencing token of {} bytes", bytes.len())))
    }

    /// Reads the 32-digit lower-case hex form; anything else is [`Error::CorruptRecord`].
    pub fn from_hex(hex: &str) -> Result<Self, Error> {
        let bad = || Error::CorruptRecord(format!("fencing token {hex:?} is not 32 hex digits"));
        if hex.len() != 32 || !hex.is_ascii() {
            return Err(bad());
        }
        let mut token = [0u8; 16];
        for (i, byte) in token.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Self(token))
    }

    /// The token bytes.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

/// Without OS randomness: a keyed hash, pid, time and counter (pid and time split forks).
fn fallback_random() -> [u8; 16] {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = blake3::Hasher::new_derive_key("idem 2026 fencing token fallback");
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    hasher.update(&h.finish().to_le_bytes());
    hasher.update(&std::process::id().to_le_bytes());
    hasher.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    hasher.update(format!("{:?}", std::time::SystemTime::now()).as_bytes());
    let mut token = [0u8; 16];
    token.copy_from_slice(&hasher.finalize().as_bytes()[..16]);
    token
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::hex::lower(&self.0))
    }
}

impl fmt::Debug for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FencingToken({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique_and_round_trip() {
        let tokens: std::collections::HashSet<_> =
            (0..10_000).map(|_| FencingToken::generate()).collect();
        assert_eq!(tokens.len(), 10_000);
        for t in tokens.iter().take(10) {
            assert_eq!(FencingToken::from_hex(&t.to_string()).expect("hex"), *t);
            assert_eq!(FencingToken::from_slice(t.as_bytes()).expect("bytes"), *t);
        }
        assert!(FencingToken::from_hex("zz").is_err());
        assert!(FencingToken::from_hex(&"é".repeat(16)).is_err());
        assert!(FencingToken::from_slice(&[1, 2]).is_err());
    }
}
