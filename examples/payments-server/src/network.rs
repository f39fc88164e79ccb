//! A simulated card network, inside the server: it authorises amounts idempotently by the key
//! its caller sends (the request's `Reservation::downstream_key()`, the same on every retry and
//! takeover of one request), remembers each authorization, and answers a lookup by that key,
//! as a real network's "retrieve by idempotency key" does. Its calls have a deadline
//! ([`CALL_DEADLINE`]): past it the caller cannot tell whether the card was charged.
//!
//! With the test hooks on, `X-Test-Network: timeout-after-charging` makes the network record
//! the authorization and then never answer (the handler's call times out: the charge went
//! through, nobody knows), and `X-Test-Network: timeout-before-charging` makes it never answer
//! without recording anything (the charge did not go through, nobody knows either).
//!
//! The network lives in the process's memory: a restarted server has a network with no
//! authorizations, and each server process has its own. Run one instance per database: the
//! reconciler of a second instance would not find the first one's authorizations, release its
//! charges in doubt, and let their retries be authorised again, which a real network, shared
//! by every instance, never allows.

use crate::charge::NewCharge;
use axum::http::HeaderMap;
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a call to the network may take before the caller gives up on its answer.
pub(crate) const CALL_DEADLINE: Duration = Duration::from_secs(1);

/// The test header that makes the network fail a call (test hooks only).
pub(crate) const FAULT_HEADER: &str = "x-test-network";

/// An authorization the network made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Authorization {
    /// `auth_` and 24 random letters and digits.
    pub id: String,
    /// In the currency's smallest unit.
    pub amount: i64,
    /// Three lower-case letters.
    pub currency: String,
    /// What the cardholder's statement shows, if anything.
    pub description: Option<String>,
    /// When it was made, in unix seconds.
    pub created: i64,
}

/// How a call to the network failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallError {
    /// No answer within [`CALL_DEADLINE`]: the call may or may not have had its effect.
    NoAnswer,
    /// The key already authorised another amount, currency or description: nothing done.
    KeyReused,
}

/// A failure a test asks the network for (`X-Test-Network`, test hooks only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Record the authorization, then never answer.
    TimeoutAfterCharging,
    /// Never answer, recording nothing.
    TimeoutBeforeCharging,
}

impl Fault {
    /// The fault `headers` ask for, if any (an unknown value is none).
    pub(crate) fn from_headers(headers: &HeaderMap) -> Option<Fault> {
        match headers.get(FAULT_HEADER)?.to_str().ok()?.trim() {
            "timeout-after-charging" => Some(Fault::TimeoutAfterCharging),
            "timeout-before-charging" => Some(Fault::TimeoutBeforeCharging),
            _ => None,
        }
    }
}

/// The network: its authorizations by the idempotency key they were made under.
#[derive(Debug, Default)]
pub(crate) struct Network {
    authorizations: Mutex<HashMap<String, Authorization>>,
}

impl Network {
    /// A network with no authorizations yet.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Authorises `charge` under `key`, within [`CALL_DEADLINE`]: the same key answers the
    /// authorization it already made (nothing is charged twice), or [`CallError::KeyReused`]
    /// if that one was for another charge. `fault` (a test hook) makes the call go unanswered.
    pub(crate) async fn authorize(
        &self,
        key: &str,
        charge: &NewCharge,
        fault: Option<Fault>,
    ) -> Result<Authorization, CallError> {
        let call = async {
            if fault == Some(Fault::TimeoutBeforeCharging) {
                std::future::pending::<()>().await;
            }
            let answer = self.authorized(key, charge);
            if fault == Some(Fault::TimeoutAfterCharging) {
                std::future::pending::<()>().await;
            }
            answer
        };
        tokio::time::timeout(CALL_DEADLINE, call)
            .await
            .unwrap_or(Err(CallError::NoAnswer))
    }

    /// The authorization made under `key`, if any, within [`CALL_DEADLINE`]
    /// ([`CallError::NoAnswer`] past it). A call that went unanswered never lands later here:
    /// once its caller gave up, the network has made it or never will.
    pub(crate) async fn lookup(&self, key: &str) -> Result<Option<Authorization>, CallError> {
        let call = async { self.lock().get(key).cloned() };
        tokio::time::timeout(CALL_DEADLINE, call)
            .await
            .map_err(|_| CallError::NoAnswer)
    }

    /// How many authorizations the network made.
    pub(crate) fn count(&self) -> usize {
        self.lock().len()
    }

    /// The network's side of an authorization: the one under `key`, made now if there is none.
    fn authorized(&self, key: &str, charge: &NewCharge) -> Result<Authorization, CallError> {
        let mut authorizations = self.lock();
        if let Some(made) = authorizations.get(key) {
            let same = made.amount == charge.amount
                && made.currency == charge.currency
                && made.description == charge.description;
            return if same {
                Ok(made.clone())
            } else {
                Err(CallError::KeyReused)
            };
        }
        let made = Authorization {
            id: new_id("auth_"),
            amount: charge.amount,
            currency: charge.currency.clone(),
            description: charge.description.clone(),
            created: now(),
        };
        authorizations.insert(key.to_owned(), made.clone());
        Ok(made)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Authorization>> {
        // A panic while holding the lock leaves the map whole (inserts are single steps).
        self.authorizations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Now, in unix seconds.
fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// `prefix` and 24 random letters and digits.
fn new_id(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut bytes = [0u8; 24];
    if getrandom::fill(&mut bytes).is_err() {
        // No system randomness: a hash of the time and the thread is still unique here.
        let seed = format!("{:?}{:?}", SystemTime::now(), std::thread::current().id());
        bytes.copy_from_slice(&blake3::hash(seed.as_bytes()).as_bytes()[..24]);
    }
    let id: String = bytes
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect();
    format!("{prefix}{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tea() -> NewCharge {
        NewCharge {
            amount: 4242,
            currency: "usd".into(),
            description: Some("Tea for two".into()),
        }
    }

    #[tokio::test]
    async fn one_key_authorises_once() {
        let network = Network::new();
        let first = network.authorize("k1", &tea(), None).await.expect("first");
        let again = network.authorize("k1", &tea(), None).await.expect("again");
        assert_eq!(first, again);
        assert!(
            first.id.starts_with("auth_") && first.id.len() == 29,
            "{first:?}"
        );
        let other = NewCharge { amount: 1, ..tea() };
        assert_eq!(
            network.authorize("k1", &other, None).await,
            Err(CallError::KeyReused)
        );
        assert_eq!(network.count(), 1);
        assert_eq!(network.lookup("k1").await, Ok(Some(first)));
        assert_eq!(network.lookup("k2").await, Ok(None));
    }

    #[tokio::test]
    async fn a_timeout_after_charging_records_and_one_before_does_not() {
        let network = Network::new();
        let after = Some(Fault::TimeoutAfterCharging);
        let before = Some(Fault::TimeoutBeforeCharging);
        assert_eq!(
            network.authorize("k1", &tea(), after).await,
            Err(CallError::NoAnswer)
        );
        assert_eq!(
            network.authorize("k2", &tea(), before).await,
            Err(CallError::NoAnswer)
        );
        assert!(network.lookup("k1").await.expect("answered").is_some());
        assert_eq!(network.lookup("k2").await, Ok(None));
        assert_eq!(network.count(), 1);
    }

    #[test]
    fn the_fault_header_names_one_fault() {
        let mut headers = HeaderMap::new();
        assert_eq!(Fault::from_headers(&headers), None);
        headers.insert(
            FAULT_HEADER,
            "timeout-after-charging".parse().expect("value"),
        );
        assert_eq!(
            Fault::from_headers(&headers),
            Some(Fault::TimeoutAfterCharging)
        );
        headers.insert(FAULT_HEADER, "nonsense".parse().expect("value"));
        assert_eq!(Fault::from_headers(&headers), None);
    }
}
