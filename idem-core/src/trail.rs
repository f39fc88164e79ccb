//! The audit trail: one entry per reconciliation decision, kept by the store.

use crate::clock::Timestamp;
use crate::codec::Reader;
use crate::error::Error;
use crate::token::FencingToken;
use std::time::Duration;

/// One decision about a record in doubt, kept in its audit trail with the store's `now`.
///
/// ```
/// use idem_core::store::{Decided, Reconciliation};
/// use idem_core::{FencingToken, Timestamp};
/// let entry = Reconciliation { at: Timestamp::from_millis(1_700_000_000_000), token: FencingToken::generate(),
///     by: "operator alice".into(), decided: Decided::Released, asked: "card network dashboard".into(),
///     answer: "no authorization under this key".into(), nonce: 7 };
/// assert_eq!(Reconciliation::decode(entry.at, &entry.encode())?, entry);
/// # Ok::<(), idem_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconciliation {
    /// When the decision was applied, by the store's clock.
    pub at: Timestamp,
    /// The token of the execution in doubt it decided about.
    pub token: FencingToken,
    /// Who decided (`reconciler <process>`, an operator), at most [`MAX_BY`](Self::MAX_BY) bytes.
    pub by: String,
    /// What was decided.
    pub decided: Decided,
    /// What was asked of the provider.
    pub asked: String,
    /// What the provider answered, or the operator's reason.
    pub answer: String,
    /// A random number that tells this decision apart, so the engine finds its own entry.
    pub nonce: u64,
}

/// A decision of the audit trail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decided {
    /// The effect happened; this status is now stored and replayed.
    Settled {
        /// The real answer's status.
        status: u16,
    },
    /// The effect did not happen; the key was released.
    Released,
    /// Still unknown; asked again after `retry_after`.
    StillUnknown {
        /// How many attempts found it unknown, this one included.
        attempt: u32,
        /// When it is asked again, from `at`.
        retry_after: Duration,
    },
}

impl Decided {
    /// The decision's name: `settled`, `released`, `still_unknown`.
    pub fn name(&self) -> &'static str {
        match self {
            Decided::Settled { .. } => "settled",
            Decided::Released => "released",
            Decided::StillUnknown { .. } => "still_unknown",
        }
    }
}

const MAGIC: u8 = b'A';
const VERSION: u8 = 1;

impl Reconciliation {
    /// The longest [`by`](Self::by) kept, in bytes.
    pub const MAX_BY: usize = 256;

    /// The stored form of everything but [`at`](Self::at) (the store's): `b'A'`, version `1`,
    /// the token (16 bytes), the nonce `u64`, the decision (tag 1 settled + status `u16`, 2
    /// released, 3 still unknown + attempt `u32` + delay in ms `u64`), then `by`, `asked` and
    /// `answer`, each a `u16` length and UTF-8.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.by.len() + self.asked.len() + self.answer.len());
        out.extend([MAGIC, VERSION]);
        out.extend(self.token.as_bytes());
        out.extend(self.nonce.to_be_bytes());
        match self.decided {
            Decided::Settled { status } => {
                out.push(1);
                out.extend(status.to_be_bytes());
            }
            Decided::Released => out.push(2),
            Decided::StillUnknown {
                attempt,
                retry_after,
            } => {
                out.push(3);
                out.extend(attempt.to_be_bytes());
                let millis = u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX);
                out.extend(millis.to_be_bytes());
            }
        }
        for text in [&self.by, &self.asked, &self.answer] {
            let text = crate::doubt::bounded(text.clone(), usize::from(u16::MAX));
            out.extend((text.len() as u16).to_be_bytes());
            out.extend(text.as_bytes());
        }
        out
    }

    /// Reads an entry kept at `at`; anything else is [`Error::CorruptRecord`], never a panic.
    pub fn decode(at: Timestamp, bytes: &[u8]) -> Result<Self, Error> {
        let mut r = Reader::new("stored reconciliation", bytes);
        if r.take(2)? != [MAGIC, VERSION] {
            return Err(corrupt("unknown magic or version"));
        }
        let token = FencingToken::from_slice(r.take(16)?)?;
        let nonce = u64::from_be_bytes(r.array()?);
        let decided = match r.take(1)?[0] {
            1 => Decided::Settled {
                status: u16::from_be_bytes(r.array()?),
            },
            2 => Decided::Released,
            3 => Decided::StillUnknown {
                attempt: u32::from_be_bytes(r.array()?),
                retry_after: Duration::from_millis(u64::from_be_bytes(r.array()?)),
            },
            _ => return Err(corrupt("unknown decision")),
        };
        let mut text = || -> Result<String, Error> {
            let len = usize::from(u16::from_be_bytes(r.array()?));
            std::str::from_utf8(r.take(len)?)
                .map(str::to_owned)
                .map_err(|_| corrupt("text is not UTF-8"))
        };
        let (by, asked, answer) = (text()?, text()?, text()?);
        if !r.rest.is_empty() {
            return Err(corrupt("trailing bytes"));
        }
        Ok(Self {
            at,
            token,
            by,
            decided,
            asked,
            answer,
            nonce,
        })
    }
}

fn corrupt(why: &str) -> Error {
    Error::CorruptRecord(format!("stored reconciliation: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn c12_decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..96)) {
            let _ = Reconciliation::decode(Timestamp::from_millis(0), &bytes);
        }

        #[test]
        fn round_trip(by in ".{0,20}", asked in ".{0,20}", answer in ".{0,20}", which in 0u8..3, n in any::<u32>(), ms in 0u64..1_000_000_000) {
            let decided = match which {
                0 => Decided::Settled { status: 201 },
                1 => Decided::Released,
                _ => Decided::StillUnknown { attempt: n, retry_after: Duration::from_millis(ms) },
            };
            let entry = Reconciliation { at: Timestamp::from_millis(7), token: FencingToken::generate(), by, decided, asked, answer, nonce: n.into() };
            prop_assert_eq!(Reconciliation::decode(entry.at, &entry.encode()).expect("decodes"), entry);
        }
    }
}
