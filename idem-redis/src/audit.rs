//! The audit trail of a record in doubt (Operator rule 4): a Redis list in the record's own hash
//! slot, so that `lua/resolve.lua` changes the record and appends the entry in one script on a
//! Cluster too. Each element is `<at ms>:<kept until ms>:` (decimal, Redis's clock) followed by
//! the entry as [`Reconciliation::encode`] writes it; the list lives as long as its
//! longest-kept element, and a reader skips the elements whose own time has passed.

use crate::record::timestamp;
use idem_core::store::Reconciliation;
use idem_core::{Error, Timestamp};

/// The key of the audit trail of the record at `record_key`, in the same hash slot.
///
/// A Cluster hashes a key by its hash tag (the text between its first `{` and the first `}`
/// after it, when not empty) or else whole. So a record key with a tag keeps it:
/// `<record key>:audit` has the same tag; one without is made the tag: `{<record key>}:audit`
/// hashes exactly as the record key does. (A record key never holds a `}` outside a tag, which
/// no tag could reproduce: the prefix refuses braces and the digest is hex.) Neither form
/// matches the `SCAN` of the prefix's records (`<prefix>:<64 hex digits>`, of type hash).
pub(crate) fn key(record_key: &str) -> String {
    if hash_tag(record_key).is_some() {
        format!("{record_key}:audit")
    } else {
        format!("{{{record_key}}}:audit")
    }
}

/// The hash tag of `key`, as a Redis Cluster finds it, if it has one.
fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let rest = &key[open + 1..];
    let close = rest.find('}')?;
    (close > 0).then(|| &rest[..close])
}

fn corrupt(why: &str) -> Error {
    Error::CorruptRecord(format!("redis audit trail: {why}"))
}

/// One element of the trail: when it was kept, until when, and the entry.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Element<'a> {
    pub(crate) at: Timestamp,
    pub(crate) kept_until: Timestamp,
    pub(crate) entry: &'a [u8],
}

impl<'a> Element<'a> {
    /// Reads an element as `lua/resolve.lua` writes it; anything else is
    /// [`Error::CorruptRecord`], never a panic.
    pub(crate) fn parse(stored: &'a [u8]) -> Result<Self, Error> {
        let mut fields = stored.splitn(3, |&b| b == b':');
        let (Some(at), Some(until), Some(entry)) = (fields.next(), fields.next(), fields.next())
        else {
            return Err(corrupt("an element without its times"));
        };
        let millis = |digits: &[u8]| -> Result<Timestamp, Error> {
            if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                return Err(corrupt("a time that is not a number"));
            }
            std::str::from_utf8(digits)
                .ok()
                .and_then(|text| text.parse::<i64>().ok())
                .ok_or_else(|| corrupt("a time out of range"))
                .and_then(timestamp)
        };
        Ok(Self {
            at: millis(at)?,
            kept_until: millis(until)?,
            entry,
        })
    }

    /// The entry, decoded at its time.
    pub(crate) fn decode(&self) -> Result<Reconciliation, Error> {
        Reconciliation::decode(self.at, self.entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::cluster_routing::Slot;

    #[test]
    fn the_trail_and_its_record_share_a_hash_slot() {
        let digest = "0123456789abcdef".repeat(4);
        for record_key in [
            format!("idem:{digest}"),
            format!("t-1.a*b?:{digest}"),
            format!("{{tenant}}:{digest}"),
            format!("idem:{{tag}}x:{digest}"),
            // An opening brace without a closing one is no tag: the key hashes whole.
            format!("a{{b:{digest}"),
        ] {
            let trail = key(&record_key);
            assert_ne!(trail, record_key);
            assert_eq!(
                Slot::for_key(&trail),
                Slot::for_key(&record_key),
                "{record_key} and {trail}"
            );
        }
        assert_eq!(key("idem:ab"), "{idem:ab}:audit");
        assert_eq!(key("{t}:ab"), "{t}:ab:audit");
    }

    #[test]
    fn hash_tags_are_found_as_a_cluster_finds_them() {
        assert_eq!(hash_tag("a{b}c"), Some("b"));
        assert_eq!(hash_tag("{b}{c}"), Some("b"));
        assert_eq!(hash_tag("a{}b{c}"), None);
        assert_eq!(hash_tag("a{b"), None);
        assert_eq!(hash_tag("a}b{"), None);
        assert_eq!(hash_tag("plain"), None);
    }

    #[test]
    fn elements_parse_exactly_and_entries_may_hold_any_byte() {
        let element =
            Element::parse(b"1700000000000:1700000060000:A\x01:\x00\xff").expect("parses");
        assert_eq!(
            element,
            Element {
                at: Timestamp::from_millis(1_700_000_000_000),
                kept_until: Timestamp::from_millis(1_700_000_060_000),
                entry: b"A\x01:\x00\xff",
            }
        );
        for bad in [
            &b""[..],
            b"1",
            b"1:2",
            b":2:x",
            b"1::x",
            b"-1:2:x",
            b"1:+2:x",
            b"99999999999999999999:2:x",
            b"1 :2:x",
        ] {
            assert!(
                matches!(Element::parse(bad), Err(Error::CorruptRecord(_))),
                "{bad:?}"
            );
        }
    }
}
