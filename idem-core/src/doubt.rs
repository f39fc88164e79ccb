//! The mark beside an "outcome unknown" answer (C8; docs/state-machine.md, "Records in doubt").

use crate::error::Error;
use crate::token::FencingToken;
use std::fmt;

/// Why the engine stored an "outcome unknown" answer.
///
/// ```
/// use idem_core::store::DoubtCause;
/// assert_eq!(DoubtCause::Failure.name(), "handler_failure");
/// assert_eq!(DoubtCause::from_name("panicked"), Some(DoubtCause::Panicked));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DoubtCause {
    /// The handler said so ([`Failure::unknown`](crate::Failure::unknown), or `?`).
    Failure,
    /// The handler panicked.
    Panicked,
    /// The record lacks the completion the handler said it wrote.
    CompletionMissing,
    /// The store refused the answer for good (or timed out past the lease): the answer is lost.
    CompletionRefused,
    /// A transactional effect was abandoned or committed by itself.
    Abandoned,
}

impl DoubtCause {
    const ALL: [DoubtCause; 5] = [
        DoubtCause::Failure,
        DoubtCause::Panicked,
        DoubtCause::CompletionMissing,
        DoubtCause::CompletionRefused,
        DoubtCause::Abandoned,
    ];

    /// The cause's one name (snake case), as the `idem` command prints it.
    pub fn name(self) -> &'static str {
        match self {
            DoubtCause::Failure => "handler_failure",
            DoubtCause::Panicked => "panicked",
            DoubtCause::CompletionMissing => "completion_missing",
            DoubtCause::CompletionRefused => "completion_refused",
            DoubtCause::Abandoned => "abandoned",
        }
    }

    /// The cause named `name`, if any.
    pub fn from_name(name: &str) -> Option<DoubtCause> {
        Self::ALL.into_iter().find(|cause| cause.name() == name)
    }

    fn code(self) -> u8 {
        match self {
            DoubtCause::Failure => 1,
            DoubtCause::Panicked => 2,
            DoubtCause::CompletionMissing => 3,
            DoubtCause::CompletionRefused => 4,
            DoubtCause::Abandoned => 5,
        }
    }

    fn from_code(code: u8) -> Option<DoubtCause> {
        Self::ALL.into_iter().find(|cause| cause.code() == code)
    }
}

impl fmt::Display for DoubtCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The mark of a record in doubt, kept [`encode`](Self::encode)d (rule 6 of
/// [`Store`](crate::Store)) in a canonical form: [`decode`](Self::decode) accepts exactly it.
///
/// ```
/// use idem_core::store::{Doubt, DoubtCause};
/// let doubt = Doubt::new(DoubtCause::Failure, "network key 3f2a");
/// assert_eq!(Doubt::decode(&doubt.encode())?, doubt);
/// assert_eq!(doubt.attempts, 0);
/// assert!(Doubt::decode(b"D\x01garbage").is_err());
/// # Ok::<(), idem_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Doubt {
    /// Why the outcome is unknown.
    pub cause: DoubtCause,
    /// [`Failure::noting`](crate::Failure::noting), at most [`MAX_NOTE`](Self::MAX_NOTE) bytes.
    pub note: String,
    /// How many reconciliations found the outcome still unknown.
    pub attempts: u32,
    /// The execution in doubt; under another token the mark is stale.
    pub token: FencingToken,
}

const MAGIC: u8 = b'D';
const VERSION: u8 = 1;
/// The fixed part: magic, version, cause, token, attempts, note length.
const HEAD: usize = 3 + 16 + 4 + 2;

impl Doubt {
    /// The longest note kept, in bytes; a longer one is cut at a character boundary.
    pub const MAX_NOTE: usize = 1024;

    /// A fresh mark, no attempts, no token yet; `note` cut to [`MAX_NOTE`](Self::MAX_NOTE) bytes.
    pub fn new(cause: DoubtCause, note: impl Into<String>) -> Self {
        Self {
            cause,
            note: bounded(note.into(), Self::MAX_NOTE),
            attempts: 0,
            token: FencingToken::from_bytes([0; 16]),
        }
    }

    /// `b'D'`, version `1`, cause code, token (16 bytes), attempts `u32`, note length `u16`,
    /// note (UTF-8); big-endian.
    pub fn encode(&self) -> Vec<u8> {
        let note = bounded(self.note.clone(), Self::MAX_NOTE);
        let mut out = Vec::with_capacity(HEAD + note.len());
        out.extend([MAGIC, VERSION, self.cause.code()]);
        out.extend(self.token.as_bytes());
        out.extend(self.attempts.to_be_bytes());
        // At most MAX_NOTE (1024) bytes: fits a u16.
        out.extend((note.len() as u16).to_be_bytes());
        out.extend(note.as_bytes());
        out
    }

    /// Reads the stored form; anything else is [`Error::CorruptRecord`], never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        let corrupt = |why: &str| Error::CorruptRecord(format!("stored doubt: {why}"));
        let (head, rest) = bytes
            .split_at_checked(HEAD)
            .ok_or_else(|| corrupt("truncated"))?;
        if head[..2] != [MAGIC, VERSION] {
            return Err(corrupt("unknown magic or version"));
        }
        let cause = DoubtCause::from_code(head[2]).ok_or_else(|| corrupt("unknown cause"))?;
        let token = FencingToken::from_slice(&head[3..19])?;
        let attempts = u32::from_be_bytes([head[19], head[20], head[21], head[22]]);
        let len = usize::from(u16::from_be_bytes([head[23], head[24]]));
        if rest.len() != len || len > Self::MAX_NOTE {
            return Err(corrupt("note length"));
        }
        let note = std::str::from_utf8(rest)
            .map_err(|_| corrupt("note is not UTF-8"))?
            .to_owned();
        Ok(Self {
            cause,
            note,
            attempts,
            token,
        })
    }
}

/// `text` cut to at most `max` bytes, at a character boundary.
pub(crate) fn bounded(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn c08_a_long_note_is_cut_at_a_character_boundary() {
        let doubt = Doubt::new(DoubtCause::Failure, "é".repeat(600));
        assert!(doubt.note.len() <= Doubt::MAX_NOTE);
        assert_eq!(Doubt::decode(&doubt.encode()).expect("decodes"), doubt);
    }

    proptest! {
        #[test]
        fn c12_decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Doubt::decode(&bytes);
        }

        #[test]
        fn the_encoding_is_canonical(note in ".{0,40}", attempts in any::<u32>(), cause in 0usize..5) {
            let doubt = Doubt { cause: DoubtCause::ALL[cause], note, attempts, token: FencingToken::generate() };
            let encoded = doubt.encode();
            let decoded = Doubt::decode(&encoded).expect("decodes");
            prop_assert_eq!(decoded.encode(), encoded);
            prop_assert_eq!(decoded, doubt);
        }
    }
}
