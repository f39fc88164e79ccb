//! An effect that failed on a connection that broke under it (C13, C8): the database went away
//! during the effect. No COMMIT was sent, so nothing committed; the caller is told the store is
//! unavailable (a 503 with `Retry-After`), not that its effect failed, and the effect's own
//! message is kept.

use crate::error::BACKEND;
use idem_core::{Error, StoreErrorKind};
use std::any::Any;
use std::fmt;

/// The store-unavailable error for an effect that failed with `effect` while its transaction's
/// connection broke (its ROLLBACK failed with `rollback`).
pub(crate) fn broken_effect<E: 'static>(effect: &E, rollback: Error) -> Error {
    Error::store(
        BACKEND,
        StoreErrorKind::Unavailable,
        BrokenEffect {
            effect: message(effect),
            rollback,
        },
    )
}

/// The effect's message: its own text when it is a sqlx error (what `?` on a statement of the
/// transaction gives), else a placeholder (the effect's error type need not be printable).
fn message<E: 'static>(effect: &E) -> String {
    let any: &dyn Any = effect;
    match any.downcast_ref::<sqlx::Error>() {
        Some(error) => error.to_string(),
        None => "an error of the effect's own".to_owned(),
    }
}

#[derive(Debug)]
struct BrokenEffect {
    effect: String,
    rollback: Error,
}

impl fmt::Display for BrokenEffect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the effect failed on a connection that broke ({}); no COMMIT was sent, nothing \
             committed; its ROLLBACK: {}",
            self.effect, self.rollback
        )
    }
}

impl std::error::Error for BrokenEffect {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.rollback)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c13_a_broken_effect_is_unavailable_and_keeps_the_effects_message() {
        let effect = sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
        let rollback = Error::store(BACKEND, StoreErrorKind::Unavailable, "rollback failed");
        let error = broken_effect(&effect, rollback);
        assert!(error.is_retryable());
        let store = error.as_store().expect("a store error");
        assert_eq!(store.kind(), StoreErrorKind::Unavailable);
        assert!(error.to_string().contains("connection closed"), "{error}");
        let other = broken_effect(&42_u8, Error::LeaseLost);
        assert!(other.to_string().contains("effect's own"), "{other}");
    }
}
