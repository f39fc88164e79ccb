//! What a reconciler found out about one record in doubt.

use idem_core::StoredResponse;
use std::time::Duration;

/// What a reconciler (or an operator) found out about a record in doubt, asking the provider:
/// the [`Verdict`], what it asked and what it was told, for the audit trail.
///
/// ```
/// use idem_ops::reconcile::{Finding, Verdict};
/// use idem_core::StoredResponse;
/// let found = Finding::settled(StoredResponse::new(201, r#"{"id":"ch_1"}"#))
///     .asked("GET /v1/authorizations?idempotency_key=3f2a")
///     .answered("captured as ch_1");
/// assert!(matches!(found.verdict(), Verdict::Settled(r) if r.status == 201));
/// assert_eq!(found.question(), "GET /v1/authorizations?idempotency_key=3f2a");
/// assert!(matches!(Finding::still_unknown().verdict(), Verdict::StillUnknown { retry_after: None }));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    verdict: Verdict,
    asked: String,
    answer: String,
}

/// What became of a record in doubt's effect.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// The effect happened: store this, the real answer, in place of the answer in doubt;
    /// every retry replays it for the retention from now (C7, C10).
    Settled(StoredResponse),
    /// The effect did not happen: the key is released and the next retry executes (C8).
    NotHappened,
    /// Nobody can tell yet: ask again later, after `retry_after` if set, else after the
    /// reconciler's backoff ([`backoff`](super::backoff)).
    StillUnknown {
        /// When to ask again, if the provider said.
        retry_after: Option<Duration>,
    },
}

impl Verdict {
    /// The verdict's name in the audit trail: `settled`, `released`, `still_unknown`.
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Settled(_) => "settled",
            Verdict::NotHappened => "released",
            Verdict::StillUnknown { .. } => "still_unknown",
        }
    }
}

impl Finding {
    /// The longest question or answer kept in the audit trail, in bytes (cut at a character
    /// boundary).
    pub const MAX_TEXT: usize = 1024;

    /// The effect happened and `response` is its real answer.
    pub fn settled(response: StoredResponse) -> Self {
        Self::of(Verdict::Settled(response))
    }

    /// The effect did not happen: release the key.
    pub fn not_happened() -> Self {
        Self::of(Verdict::NotHappened)
    }

    /// Still unknown: ask again after the backoff.
    pub fn still_unknown() -> Self {
        Self::of(Verdict::StillUnknown { retry_after: None })
    }

    fn of(verdict: Verdict) -> Self {
        Self {
            verdict,
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

    /// For a [`Verdict::StillUnknown`]: ask again after `delay` instead of the backoff.
    pub fn retry_after(mut self, delay: Duration) -> Self {
        if let Verdict::StillUnknown { retry_after } = &mut self.verdict {
            *retry_after = Some(delay);
        }
        self
    }

    /// The verdict.
    pub fn verdict(&self) -> &Verdict {
        &self.verdict
    }

    /// What was asked.
    pub fn question(&self) -> &str {
        &self.asked
    }

    /// What was answered.
    pub fn answer(&self) -> &str {
        &self.answer
    }

    pub(super) fn into_parts(self) -> (Verdict, String, String) {
        (self.verdict, self.asked, self.answer)
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
