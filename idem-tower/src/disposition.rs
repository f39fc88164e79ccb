//! What the layer did with a request, for logs and metrics outside it.

/// What the idempotency layer did with a request, in the response's extensions, so that an
/// outer logging or metrics layer can record it.
///
/// ```
/// use idem_tower::{Disposition, Handled};
/// # let response = http::Response::new(());
/// if let Some(handled) = response.extensions().get::<Handled>() {
///     println!("{} for {:?}", handled.disposition.as_str(), handled.consumer);
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Disposition {
    /// The handler ran now; its response was stored.
    Executed,
    /// A duplicate of a completed request: the stored response.
    Replayed,
    /// A duplicate of a request still running (409, or 202).
    InFlight,
    /// The key was used with another request (422).
    Mismatch,
    /// The handler said nothing happened: the key was released, nothing stored.
    Released,
    /// The effect may have run and its outcome is unknown: a 500 (stored when it could be).
    Failed,
    /// Refused before anything was recorded: a bad or missing key, no consumer, a body over
    /// the limit, the store down.
    Rejected,
}

impl Disposition {
    /// A short stable name: `executed`, `replayed`, `in_flight`, `mismatch`, `released`,
    /// `failed`, `rejected`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Disposition::Executed => "executed",
            Disposition::Replayed => "replayed",
            Disposition::InFlight => "in_flight",
            Disposition::Mismatch => "mismatch",
            Disposition::Released => "released",
            Disposition::Failed => "failed",
            Disposition::Rejected => "rejected",
        }
    }
}

/// The response extension the layer adds to every request it protected.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Handled {
    /// What the layer did.
    pub disposition: Disposition,
    /// The consumer the key belongs to, when it was found.
    pub consumer: Option<String>,
}
