//! The client's idempotency key (C1).

use crate::error::{Error, Field};
use std::fmt;

/// A client's idempotency key (a UUID v4, say): 1..=255 bytes of visible ASCII (0x21..=0x7E).
/// Anything else is rejected before the store (C1).
///
/// ```
/// use idem_core::IdempotencyKey;
/// let key = IdempotencyKey::new("8e03978e-40d5-43e8-bc93-6894a57f9324")?;
/// assert_eq!(key.as_str().len(), 36);
/// assert!(IdempotencyKey::new("").is_err());
/// assert!(IdempotencyKey::new("with space").is_err());
/// assert!(IdempotencyKey::new(&"k".repeat(256)).is_err());
/// # Ok::<(), idem_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The longest key accepted, in bytes.
    pub const MAX_LEN: usize = 255;

    /// Validates `key` (C1).
    pub fn new(key: &str) -> Result<Self, Error> {
        if key.is_empty() {
            return Err(Error::invalid(Field::Key, "empty"));
        }
        if key.len() > Self::MAX_LEN {
            return Err(Error::invalid(
                Field::Key,
                format!("{} bytes, at most {} allowed", key.len(), Self::MAX_LEN),
            ));
        }
        if let Some(pos) = key.bytes().position(|b| !(0x21..=0x7E).contains(&b)) {
            return Err(Error::invalid(
                Field::Key,
                format!("byte {pos} is not visible ASCII (0x21..=0x7E)"),
            ));
        }
        Ok(Self(key.to_owned()))
    }

    /// Validates a required `Idempotency-Key` header: a missing one is an error too (400).
    ///
    /// ```
    /// use idem_core::IdempotencyKey;
    /// assert!(IdempotencyKey::required(None).is_err());
    /// assert!(IdempotencyKey::required(Some("abc")).is_ok());
    /// ```
    pub fn required(header: Option<&str>) -> Result<Self, Error> {
        match header {
            Some(value) => Self::new(value),
            None => Err(Error::KeyMissing),
        }
    }

    /// The key as sent by the client.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({:?})", self.0)
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c01_accepts_every_visible_ascii_byte_and_the_length_bounds() {
        let all: String = (0x21u8..=0x7E).map(char::from).collect();
        assert!(IdempotencyKey::new(&all).is_ok());
        assert!(IdempotencyKey::new("a").is_ok());
        assert!(IdempotencyKey::new(&"a".repeat(255)).is_ok());
    }

    #[test]
    fn c01_rejects_empty_long_control_space_and_non_ascii() {
        for bad in [
            "", " ", "a b", "tab\t", "nl\n", "nul\0", "del\x7f", "é", "ключ",
        ] {
            let err = IdempotencyKey::new(bad).expect_err("invalid key");
            assert!(
                matches!(
                    err,
                    Error::InvalidInput {
                        field: Field::Key,
                        ..
                    }
                ),
                "{bad:?}"
            );
        }
        assert!(IdempotencyKey::new(&"a".repeat(256)).is_err());
        assert!(IdempotencyKey::required(None).is_err());
    }
}
