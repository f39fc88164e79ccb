//! What the closure style returns, and how a handler says what its error means (C8).

use crate::answer::Answer;
use crate::completion::Completion;
use crate::error::Error;
use crate::event::EventKind;
use crate::response::StoredResponse;

/// The result of [`Idempotency::run`](crate::Idempotency::run) when nothing failed.
///
/// ```
/// use idem_core::{Answer, Outcome, StoredResponse};
/// let executed = Outcome::Executed(StoredResponse::new(201, ""));
/// assert_eq!(executed.response().map(|r| r.status), Some(201));
/// assert_eq!(Outcome::Answered(Answer::Mismatch).response(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Outcome {
    /// The handler ran now; this is its response as stored.
    Executed(StoredResponse),
    /// The handler refused the request before it executed (a status of
    /// [`Policy::refusals`](crate::Policy::refusals), or [`Reply::Refused`]): its response, not stored; the key was
    /// released, so a corrected retry with the same key executes (C8).
    Refused(StoredResponse),
    /// The handler did not run: a replay, in flight, or a mismatch.
    Answered(Answer),
}

impl Outcome {
    /// The response, for executed and replayed outcomes.
    pub fn response(&self) -> Option<&StoredResponse> {
        match self {
            Outcome::Executed(r) | Outcome::Refused(r) | Outcome::Answered(Answer::Replay(r)) => {
                Some(r)
            }
            _ => None,
        }
    }

    /// What the engine did, in the vocabulary of its events (C16): the HTTP layer's
    /// disposition.
    pub fn kind(&self) -> EventKind {
        match self {
            Outcome::Executed(_) => EventKind::Executed,
            Outcome::Refused(_) => EventKind::Released,
            Outcome::Answered(Answer::Replay(_)) => EventKind::Replayed,
            Outcome::Answered(Answer::InFlight { .. }) => EventKind::InFlight,
            Outcome::Answered(Answer::Mismatch) => EventKind::Mismatch,
        }
    }
}

/// What a [`run`](crate::Idempotency::run) handler returns on success: a response for the
/// engine to complete with, or a [`Completion`] the handler already wrote inside its own
/// transaction (with a SQL store's `complete_in`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Complete the record with this response (the engine stores it), unless its status is a
    /// refusal of the policy ([`Policy::refusals`](crate::Policy::refusals): 400, 422, ...), which says the request was
    /// refused before it executed: then it is sent, not stored, and the key released.
    Respond(StoredResponse),
    /// Complete the record with this response whatever its status: the effect happened (a
    /// 422 after a charge went through is stored and replayed).
    Executed(StoredResponse),
    /// Send this response, store nothing and release the key whatever its status: nothing
    /// happened (the request failed validation; the client may correct it and retry).
    Refused(StoredResponse),
    /// The handler wrote this completion in the effect's transaction and committed it.
    Completed(Completion),
}

impl From<StoredResponse> for Reply {
    fn from(response: StoredResponse) -> Self {
        Reply::Respond(response)
    }
}

impl From<Completion> for Reply {
    fn from(completion: Completion) -> Self {
        Reply::Completed(completion)
    }
}

/// A handler's error, with what it means for the key (C8).
///
/// - [`Failure::nothing_happened`]: the effect did not happen (its transaction rolled back, the
///   call was refused before it was sent): the reservation is released and a retry runs.
/// - [`Failure::unknown`] (also what `?` and `From` give): the effect may have happened (an
///   upstream timeout: the card may have been charged). The key is kept and a 500 problem is
///   stored and replayed, so nothing re-runs blind, until a reconciler settles or releases it
///   (or the retention frees the key).
/// - [`Failure::unknown_with`]: the same, storing your own answer (for example a 202 that points
///   at a status resource while you reconcile).
///
/// An unknown outcome's answer is stored marked in doubt, with what [`noting`](Self::noting)
/// attached, for a reconciler to settle (idem-ops' `reconcile`).
///
/// The default is the one that cannot run an effect twice.
///
/// ```
/// use idem_core::Failure;
/// let safe: Failure<&str> = "upstream timed out".into();
/// assert!(!safe.releases());
/// assert!(Failure::nothing_happened("declined before sending").releases());
/// ```
#[derive(Debug)]
pub struct Failure<E> {
    error: E,
    meaning: Meaning,
}

#[derive(Debug)]
pub(crate) enum Meaning {
    NothingHappened,
    Unknown {
        response: Option<StoredResponse>,
        note: String,
    },
}

impl<E> Failure<E> {
    /// Nothing happened: release the key so a retry can run.
    pub fn nothing_happened(error: E) -> Self {
        Self {
            error,
            meaning: Meaning::NothingHappened,
        }
    }

    /// The outcome is unknown: keep the key and store a 500 problem.
    pub fn unknown(error: E) -> Self {
        Self {
            error,
            meaning: Meaning::Unknown {
                response: None,
                note: String::new(),
            },
        }
    }

    /// The outcome is unknown: keep the key and store `response`.
    pub fn unknown_with(error: E, response: StoredResponse) -> Self {
        Self {
            error,
            meaning: Meaning::Unknown {
                response: Some(response),
                note: String::new(),
            },
        }
    }

    /// For an unknown outcome: what a reconciler needs to ask the provider later (its own
    /// idempotency key, a request id), kept with the answer in doubt
    /// ([`Doubt::note`](crate::doubt::Doubt::note), at most
    /// [`Doubt::MAX_NOTE`](crate::doubt::Doubt::MAX_NOTE) bytes). Nothing for a failure
    /// where nothing happened.
    ///
    /// ```
    /// use idem_core::Failure;
    /// let failure = Failure::unknown("card network timed out").noting("network request req_81");
    /// assert!(!failure.releases());
    /// ```
    pub fn noting(mut self, note: impl Into<String>) -> Self {
        if let Meaning::Unknown { note: kept, .. } = &mut self.meaning {
            *kept = note.into();
        }
        self
    }

    /// Whether the key is given back.
    pub fn releases(&self) -> bool {
        matches!(self.meaning, Meaning::NothingHappened)
    }

    /// The handler's error.
    pub fn error(&self) -> &E {
        &self.error
    }

    pub(crate) fn into_parts(self) -> (E, Meaning) {
        (self.error, self.meaning)
    }
}

impl<E> From<E> for Failure<E> {
    fn from(error: E) -> Self {
        Failure::unknown(error)
    }
}

/// Why [`Idempotency::run`](crate::Idempotency::run) did not return an [`Outcome`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError<E> {
    /// Nothing ran: idem refused the request or failed before the handler (bad key 400, body
    /// too large 413, store down 503...).
    #[error(transparent)]
    Idem(Error),
    /// The handler said nothing happened ([`Failure::nothing_happened`]); the key was released
    /// (if that failed, the reservation passes with its lease) and a retry runs.
    #[error("handler failed, nothing happened: {0}")]
    Released(E),
    /// The handler's outcome is unknown; the key is kept and `response` was stored: send it,
    /// every retry gets it too.
    #[error("handler failed, outcome unknown: {error}")]
    Unknown {
        /// The handler's error.
        error: E,
        /// The answer stored for the key (a 500 problem unless the handler chose one).
        response: StoredResponse,
    },
    /// The effect may have run but its completion could not be stored within the lease (the
    /// store stayed down, or the lease was taken over). Answer 500: the outcome is unknown.
    #[error("completion not stored after the effect: {0}")]
    Incomplete(Error),
    /// The effect's transaction was committed and the commit's answer lost, and the record
    /// could not tell within the store timeout whether it committed: the effect and its
    /// completion took effect together, or neither did. The key is kept in progress: a retry is
    /// answered in flight, then the stored response if it committed, or runs once the lease
    /// has passed if it did not. Answer 500, marked retryable.
    #[error("commit outcome unknown: {0}")]
    InDoubt(Error),
}

impl<E> RunError<E> {
    /// What the engine did, in the vocabulary of its events (C16): the HTTP layer's
    /// disposition.
    ///
    /// ```
    /// use idem_core::{Error, EventKind, RunError};
    /// assert_eq!(RunError::<()>::Idem(Error::LeaseLost).kind(), EventKind::LeaseLost);
    /// assert_eq!(RunError::Released(()).kind(), EventKind::Released);
    /// ```
    pub fn kind(&self) -> EventKind {
        match self {
            RunError::Idem(Error::LeaseLost) | RunError::Incomplete(Error::LeaseLost) => {
                EventKind::LeaseLost
            }
            RunError::Idem(_) => EventKind::Rejected,
            RunError::Released(_) => EventKind::Released,
            RunError::Unknown { .. } | RunError::Incomplete(_) => EventKind::OutcomeUnknown,
            RunError::InDoubt(_) => EventKind::InDoubt,
        }
    }
}
