//! A stored record, as a store reads it back.

use crate::clock::Timestamp;
use crate::fingerprint::Fingerprint;
use crate::response::StoredResponse;
use crate::token::FencingToken;

/// One record: its request's fingerprint, its holder's token, its state. `R` is the response,
/// decoded ([`StoredResponse`]) or as read (`&[u8]`), so a store decodes only what it replays.
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
    /// `lease_until` or `expires_at`: from then on the record behaves as absent.
    pub fn deadline(&self) -> Timestamp {
        match &self.state {
            RecordState::InProgress { lease_until } => *lease_until,
            RecordState::Completed { expires_at, .. } => *expires_at,
        }
    }

    /// Whether the record counts at `now` (deadlines are exclusive: expired at `now == deadline`).
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

    /// Whether the holder of `token` completed the record (C6).
    pub fn is_completed_by(&self, token: &FencingToken) -> bool {
        self.token == *token && self.is_completed()
    }

    /// The record with a reference to its response.
    pub fn as_ref(&self) -> Record<&R> {
        Record {
            fingerprint: self.fingerprint,
            token: self.token,
            state: match &self.state {
                RecordState::InProgress { lease_until } => RecordState::InProgress {
                    lease_until: *lease_until,
                },
                RecordState::Completed {
                    response,
                    expires_at,
                } => RecordState::Completed {
                    response,
                    expires_at: *expires_at,
                },
            },
        }
    }

    /// Converts the stored response (decodes it, say), keeping the rest.
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
