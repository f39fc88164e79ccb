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
    /// Refused before it executed ([`Policy::refusals`](crate::Policy::refusals),
    /// [`Reply::Refused`]): not stored, key released (C8).
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

    /// What the engine did as an event kind (C16): the HTTP layer's disposition.
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

/// A [`run`](crate::Idempotency::run) handler's success: a response, or a written [`Completion`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Store this response, unless its status is a refusal: then as [`Refused`](Self::Refused).
    Respond(StoredResponse),
    /// Store this response whatever its status: the effect happened.
    Executed(StoredResponse),
    /// Send this response, store nothing, release the key whatever its status: nothing happened.
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

/// A handler's error, with what it means for the key (C8). `?` gives [`unknown`](Self::unknown),
/// which never runs an effect twice: its answer is stored in doubt until reconciled or expired.
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

    /// The outcome is unknown: keep the key and store `response` (a 202, say).
    pub fn unknown_with(error: E, response: StoredResponse) -> Self {
        let mut failure = Self::unknown(error);
        failure.meaning = Meaning::Unknown {
            response: Some(response),
            note: String::new(),
        };
        failure
    }

    /// For an unknown outcome: what a reconciler needs (a [`Doubt`](crate::store::Doubt)'s note).
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
    /// Nothing ran: refused or failed before the handler (400, 413, 503...).
    #[error(transparent)]
    Idem(Error),
    /// [`Failure::nothing_happened`]: the key was released (the store down: released again by a
    /// task of its own until it answers, or the lease passes).
    #[error("handler failed, nothing happened: {0}")]
    Released(E),
    /// Outcome unknown: `response` is stored; send it, as every retry gets it.
    #[error("handler failed, outcome unknown: {error}")]
    Unknown {
        /// The handler's error.
        error: E,
        /// The answer stored for the key (a 500 problem unless the handler chose one).
        response: StoredResponse,
    },
    /// The effect may have run but its completion was not stored within the lease. Answer 500.
    #[error("completion not stored after the effect: {0}")]
    Incomplete(Error),
    /// The commit's answer was lost and the record did not tell in time: effect and completion
    /// committed together or not at all. Answer 500, retryable.
    #[error("commit outcome unknown: {0}")]
    InDoubt(Error),
}

impl<E> RunError<E> {
    /// What the engine did as an event kind (C16): the HTTP layer's disposition.
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
