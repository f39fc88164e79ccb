//! Message ids: `msg_` and a UUIDv7, made at enqueue and sent unchanged on every attempt.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

/// A message's stable id, `msg_` and a UUIDv7 in its hyphenated form (time ordered: 48 bits of
/// Unix milliseconds, then random bits). It is the `webhook-id` of every attempt, the key a
/// receiver deduplicates on.
///
/// ```
/// use idem_outbox::MessageId;
/// let (a, b) = (MessageId::generate(), MessageId::generate());
/// assert!(a.as_str().starts_with("msg_") && a.as_str().len() == 40);
/// assert_ne!(a, b);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(String);

impl MessageId {
    /// A fresh id.
    pub fn generate() -> Self {
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let mut bytes = random_bytes::<16>();
        let millis = u64::try_from(millis & 0xFFFF_FFFF_FFFF).unwrap_or(0);
        for (i, byte) in millis.to_be_bytes()[2..].iter().enumerate() {
            if let Some(slot) = bytes.get_mut(i) {
                *slot = *byte;
            }
        }
        bytes[6] = (bytes[6] & 0x0F) | 0x70; // version 7
        bytes[8] = (bytes[8] & 0x3F) | 0x80; // RFC 9562 variant
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Self(format!(
            "msg_{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        ))
    }

    /// An id as stored or received (not checked: ids come from the outbox's own tables).
    pub fn from_stored(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `N` bytes from the system's random source; should it fail, bytes from the time and a
/// counter (unique in the process, still time ordered).
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    if getrandom::fill(&mut bytes).is_err() {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let seed = COUNTER.fetch_add(1, Ordering::Relaxed)
            ^ SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| u64::try_from(d.as_nanos() & u128::from(u64::MAX)).unwrap_or(0))
                .unwrap_or(0);
        for (i, slot) in bytes.iter_mut().enumerate() {
            *slot = seed
                .rotate_left(u32::try_from(i * 8 % 64).unwrap_or(0))
                .to_le_bytes()[0];
        }
    }
    bytes
}

/// A random `u64`.
pub(crate) fn random_u64() -> u64 {
    u64::from_le_bytes(random_bytes::<8>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c17_ids_are_uuid_v7_and_time_ordered() {
        let a = MessageId::generate();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = MessageId::generate();
        assert!(a < b, "{a} {b}");
        let uuid = &a.as_str()[4..];
        assert_eq!(uuid.as_bytes()[14], b'7');
        assert!(matches!(uuid.as_bytes()[19], b'8' | b'9' | b'a' | b'b'));
        assert_eq!(
            uuid.split('-').map(str::len).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
    }
}
