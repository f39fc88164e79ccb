//! What the layer did with a request, for logs and metrics outside it.

use idem_core::EventKind;

/// What the idempotency layer did with a request, in the response's extensions, so that an
/// outer logging or metrics layer can record it.
///
/// ```
/// use idem_tower::Handled;
/// # let response = http::Response::new(());
/// if let Some(handled) = response.extensions().get::<Handled>() {
///     println!("{} for {:?}", handled.disposition.name(), handled.consumer);
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Handled {
    /// What the layer did, in the engine's event vocabulary (C16), one name for logs, metrics
    /// and this field ([`EventKind::name`]): `executed`, `replayed`, `in_flight`, `mismatch`,
    /// `released`, `outcome_unknown`, `in_doubt`, `lease_lost`, or `rejected` (refused before
    /// anything was recorded: bad key, body too large, no consumer, store unavailable).
    pub disposition: EventKind,
    /// The consumer the key belongs to, when it was found.
    pub consumer: Option<String>,
}
