//! Whose key it is: the consumer a request's key is scoped to (C2).

use crate::render::Problem;
use std::fmt;

/// Why the layer could not tell which consumer (an authenticated account, a tenant) a request
/// belongs to. The key is scoped to the consumer (C2), so without one nothing is recorded and
/// the request is answered with this error's problem.
///
/// ```
/// use idem_tower::ConsumerError;
/// assert_eq!(ConsumerError::unauthenticated().problem().status, 401);
/// assert_eq!(ConsumerError::misconfigured("no Account extension: is the auth layer outside?").problem().status, 500);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct ConsumerError {
    problem: Problem,
    reason: String,
}

impl ConsumerError {
    /// The request carries no credentials the application recognises: 401.
    pub fn unauthenticated() -> Self {
        Self {
            problem: Problem::new(
                401,
                "consumer-unknown",
                "The request is not authenticated, so its idempotency key has no owner.",
                false,
            ),
            reason: "unauthenticated".to_owned(),
        }
    }

    /// The consumer the application found is not one a key can be scoped to (empty, over
    /// [`Scope::MAX_CONSUMER_LEN`](idem_core::Scope::MAX_CONSUMER_LEN) bytes, a control
    /// character): it comes from the request's credentials, so they are not ones the server
    /// issued: 401, like no credentials. `reason` is logged, never sent.
    pub(crate) fn unusable(reason: String) -> Self {
        Self {
            problem: Problem::new(
                401,
                "consumer-unknown",
                format!(
                    "The request's credentials name no account an idempotency key can belong to (at most {} bytes of text).",
                    idem_core::Scope::MAX_CONSUMER_LEN
                ),
                false,
            ),
            reason,
        }
    }

    /// The application is wired wrongly (for example the authentication layer that provides
    /// the account runs inside the idempotency layer instead of outside it): 500. `reason` is
    /// logged, never sent.
    pub fn misconfigured(reason: impl Into<String>) -> Self {
        Self {
            problem: Problem::new(
                500,
                "consumer-unavailable",
                "The server could not tell whose idempotency key this is.",
                false,
            ),
            reason: reason.into(),
        }
    }

    /// The problem sent to the client.
    pub fn problem(&self) -> &Problem {
        &self.problem
    }
}

impl fmt::Debug for ConsumerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsumerError")
            .field("status", &self.problem.status)
            .field("reason", &self.reason)
            .finish()
    }
}

impl fmt::Display for ConsumerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no consumer for the idempotency key: {}", self.reason)
    }
}

impl std::error::Error for ConsumerError {}
