//! What a store keeps beside a record for operators: when, and by which process.

use crate::Holder;
use idem_core::Timestamp;

/// What a store keeps beside a record for operators (store rule 6): when its current
/// reservation was made, when its completion landed, and which process made the reservation.
/// The times are `None` where the store does not know them (a record written before the store
/// kept them, a store that keeps none); the holder is [`Noted::Unknown`] then, and
/// [`Noted::Unreadable`] when what is stored does not decode (a record is listed all the same).
/// None of it takes part in a decision.
///
/// ```
/// use idem_ops::{Noted, Provenance};
/// let unknown = Provenance::default();
/// assert_eq!((unknown.reserved_at, unknown.completed_at), (None, None));
/// assert_eq!(unknown.holder, Noted::Unknown);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Provenance {
    /// When the current reservation (a fresh one or a takeover) was made, by the store's clock
    /// (C11).
    pub reserved_at: Option<Timestamp>,
    /// When the completion landed, by the store's clock; `None` while in progress.
    pub completed_at: Option<Timestamp>,
    /// The process that made the current reservation.
    pub holder: Noted<Holder>,
}

/// A value a store keeps for operators only: unknown (not stored), known, or stored but
/// unreadable (with a short description of what is stored, at most 64 characters of it).
///
/// ```
/// use idem_ops::Noted;
/// use idem_ops::Holder;
/// assert_eq!(Noted::holder(None), Noted::Unknown);
/// let me = Holder::this_process();
/// assert_eq!(Noted::holder(Some(&me.encode())).known(), Some(me));
/// let odd = Noted::holder(Some("h7 from the future"));
/// assert!(matches!(odd, Noted::Unreadable(ref why) if why.contains("h7")));
/// assert_eq!(odd.to_string(), "unreadable (\"h7 from the future\")");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Noted<T> {
    /// Not stored (a record written before the store kept it).
    #[default]
    Unknown,
    /// As stored.
    Known(T),
    /// Stored, but not in a form this version reads: what it is, bounded.
    Unreadable(String),
}

impl<T> Noted<T> {
    /// The value, where it is known.
    pub fn known(&self) -> Option<&T> {
        match self {
            Noted::Known(value) => Some(value),
            Noted::Unknown | Noted::Unreadable(_) => None,
        }
    }

    /// An unreadable value, described by at most 64 characters of what is stored.
    pub fn unreadable(stored: &str) -> Self {
        Noted::Unreadable(shown(stored))
    }
}

impl Noted<Holder> {
    /// A stored holder decoded on its own: `None` is unknown, a value [`Holder::decode`] does
    /// not read is unreadable.
    pub fn holder(stored: Option<&str>) -> Self {
        match stored {
            None => Noted::Unknown,
            Some(text) => {
                Holder::decode(text).map_or_else(|_| Noted::unreadable(text), Noted::Known)
            }
        }
    }
}

impl<T: std::fmt::Display> std::fmt::Display for Noted<T> {
    /// The value, `unknown`, or `unreadable (…)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Noted::Unknown => f.write_str("unknown"),
            Noted::Known(value) => value.fmt(f),
            Noted::Unreadable(why) => write!(f, "unreadable ({why})"),
        }
    }
}

/// At most 64 characters of `text`, escaped as Rust debug output (control characters
/// included), with `…` where it was cut (as idem-core shows an unreadable stored holder).
fn shown(text: &str) -> String {
    let mut cut: String = text.chars().take(64).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    format!("{cut:?}")
}
