//! What a reconciler found out about one record in doubt.

use idem_core::StoredResponse;
use std::time::Duration;

/// What a reconciler (or an operator) found out about a record in doubt, asking the provider:
/// whether the effect [`happened`](Self::happened) (with its real answer if it did), what it
/// asked and what it was told, for the audit trail.
///
/// ```
/// use idem_ops::reconcile::Finding;
/// use idem_core::StoredResponse;
/// use std::time::Duration;
/// let found = Finding::settled(StoredResponse::new(201, r#"{"id":"ch_1"}"#))
///     .asked("GET /v1/authorizations?idempotency_key=3f2a")
///     .answered("captured as ch_1");
/// assert_eq!(found.happened(), Some(true));
/// assert_eq!(found.response().map(|r| r.status), Some(201));
/// assert_eq!(found.question(), "GET /v1/authorizations?idempotency_key=3f2a");
/// assert_eq!(Finding::not_happened().happened(), Some(false));
/// let unknown = Finding::still_unknown().retry_after(Duration::from_secs(5));
/// assert_eq!((unknown.happened(), unknown.delay()), (None, Some(Duration::from_secs(5))));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    found: Found,
    asked: String,
    answer: String,
}

/// What became of a record in doubt's effect: how [`resolve`](super::resolve) decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Found {
    /// It happened: this real answer replaces the answer in doubt (C7, C10).
    Settled(StoredResponse),
    /// It did not: the key is released (C8).
    NotHappened,
    /// Nobody can tell yet: asked again after this delay, else after the backoff.
    StillUnknown(Option<Duration>),
}

impl Finding {
    /// The longest question or answer kept in the audit trail, in bytes (cut at a character
    /// boundary).
    pub const MAX_TEXT: usize = 1024;

    /// The effect happened and `response` is its real answer.
    pub fn settled(response: StoredResponse) -> Self {
        Self::of(Found::Settled(response))
    }

    /// The effect did not happen: release the key.
    pub fn not_happened() -> Self {
        Self::of(Found::NotHappened)
    }

    /// Still unknown: ask again after the backoff.
    pub fn still_unknown() -> Self {
        Self::of(Found::StillUnknown(None))
    }

    fn of(found: Found) -> Self {
        Self {
            found,
            asked: String::new(),
            answer: String::new(),
        }
    }

    /// What was asked of the provider (for the audit trail).
    pub fn asked(mut self, question: impl Into<String>) -> Self {
        self.asked = bounded(question.into(), Self::MAX_TEXT);
        self
    }

    /// What the provider answered, or the operator's reason (for the audit trail).
    pub fn answered(mut self, answer: impl Into<String>) -> Self {
        self.answer = bounded(answer.into(), Self::MAX_TEXT);
        self
    }

    /// For a finding [`still_unknown`](Self::still_unknown): ask again after `delay` instead
    /// of the backoff.
    pub fn retry_after(mut self, delay: Duration) -> Self {
        if let Found::StillUnknown(retry_after) = &mut self.found {
            *retry_after = Some(delay);
        }
        self
    }

    /// Whether the effect happened: `Some(true)` [`settled`](Self::settled), `Some(false)`
    /// [`not_happened`](Self::not_happened), `None` [`still_unknown`](Self::still_unknown).
    pub fn happened(&self) -> Option<bool> {
        match self.found {
            Found::Settled(_) => Some(true),
            Found::NotHappened => Some(false),
            Found::StillUnknown(_) => None,
        }
    }

    /// The real answer, if the effect happened.
    pub fn response(&self) -> Option<&StoredResponse> {
        match &self.found {
            Found::Settled(response) => Some(response),
            _ => None,
        }
    }

    /// When to ask again, if still unknown and [`retry_after`](Self::retry_after) said.
    pub fn delay(&self) -> Option<Duration> {
        match self.found {
            Found::StillUnknown(delay) => delay,
            _ => None,
        }
    }

    /// What was asked.
    pub fn question(&self) -> &str {
        &self.asked
    }

    /// What was answered.
    pub fn answer(&self) -> &str {
        &self.answer
    }

    pub(super) fn into_parts(self) -> (Found, String, String) {
        (self.found, self.asked, self.answer)
    }
}

/// `text` cut to at most `max` bytes, at a character boundary.
pub(super) fn bounded(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}
