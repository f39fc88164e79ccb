//! A stored record, as a store reads it back.

use crate::clock::Timestamp;
use crate::fingerprint::Fingerprint;
use crate::holder::Holder;
use crate::response::StoredResponse;
use crate::token::FencingToken;

/// One record: the fingerprint of the request that created it, the fencing token of its
/// current holder, and its state.
///
/// `R` is the stored response: decoded ([`StoredResponse`], the default) or as the store read it
/// (for example `&[u8]`), so that a store decides on a record without decoding a response it
/// will not replay (a mismatch or an in-flight answer costs the same whatever the body's size).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<R = StoredResponse> {
    /// The fingerprint of the request that reserved the record (C3).
    pub fingerprint: Fingerprint,
    /// The token of the reservation the record carries (C6).
    pub token: FencingToken,
    /// In progress or completed.
    pub state: RecordState<R>,
}

/// Where a record is in its life (docs/state-machine.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordState<R = StoredResponse> {
    /// Reserved; the holder runs the effect until `lease_until` (C4, C9).
    InProgress {
        /// After this instant the record is an orphan and may be taken over.
        lease_until: Timestamp,
    },
    /// Done; the response is replayed until `expires_at` (C7, C10).
    Completed {
        /// The stored response.
        response: R,
        /// After this instant the key is new again.
        expires_at: Timestamp,
    },
}

impl<R> Record<R> {
    /// The instant after which the record behaves as absent (an orphaned lease or an expired
    /// retention): `lease_until` or `expires_at`.
    pub fn deadline(&self) -> Timestamp {
        match &self.state {
            RecordState::InProgress { lease_until } => *lease_until,
            RecordState::Completed { expires_at, .. } => *expires_at,
        }
    }

    /// Whether the record still counts at `now`: a deadline is exclusive, so at
    /// `now == deadline` the record has expired.
    pub fn is_live(&self, now: Timestamp) -> bool {
        now < self.deadline()
    }

    /// Whether the record is in progress.
    pub fn is_in_progress(&self) -> bool {
        matches!(self.state, RecordState::InProgress { .. })
    }

    /// Whether the record is completed.
    pub fn is_completed(&self) -> bool {
        matches!(self.state, RecordState::Completed { .. })
    }

    /// Whether the record is completed by the holder of `token`: a completion of that
    /// reservation landed (only its holder can complete it, C6).
    pub fn is_completed_by(&self, token: &FencingToken) -> bool {
        self.token == *token && self.is_completed()
    }

    /// Converts the stored response (for example decodes the bytes a store read), keeping the
    /// rest of the record.
    pub fn try_map_response<T, E>(self, f: impl FnOnce(R) -> Result<T, E>) -> Result<Record<T>, E> {
        let state = match self.state {
            RecordState::InProgress { lease_until } => RecordState::InProgress { lease_until },
            RecordState::Completed {
                response,
                expires_at,
            } => RecordState::Completed {
                response: f(response)?,
                expires_at,
            },
        };
        Ok(Record {
            fingerprint: self.fingerprint,
            token: self.token,
            state,
        })
    }
}

/// What a store keeps beside a record for operators (store rule 6): when its current
/// reservation was made, when its completion landed, and which process made the reservation.
/// The times are `None` where the store does not know them (a record written before the store
/// kept them, a store that keeps none); the holder is [`Noted::Unknown`] then, and
/// [`Noted::Unreadable`] when what is stored does not decode (a record is listed all the same).
/// None of it takes part in a decision.
///
/// ```
/// use idem_core::store::{Noted, Provenance};
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
/// use idem_core::store::Noted;
/// use idem_core::Holder;
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
        Noted::Unreadable(crate::holder::shown(stored))
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
