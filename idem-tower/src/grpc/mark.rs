//! What a tonic handler's `Err(Status)` says about its effect: marks carried as the status's
//! source, which tonic keeps in the response's extensions.

use http::Extensions;
use std::fmt;
use std::sync::Arc;
use tonic::Status;

/// The mark a status carries as its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Meaning {
    happened: bool,
}

impl fmt::Display for Meaning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.happened {
            "the effect happened"
        } else {
            "nothing happened"
        })
    }
}

impl std::error::Error for Meaning {}

/// Marks a handler's error status as "nothing happened" (its transaction rolled back): the
/// layer sends it, stores nothing and releases the key whatever its code, so a retry runs
/// again (C8). The gRPC form of [`NothingHappened`](crate::NothingHappened), for handlers that
/// answer `Err(Status)` (a tonic status has no extensions of its own).
///
/// ```
/// use idem_tower::grpc_nothing_happened;
/// # fn handler() -> Result<(), tonic::Status> {
/// Err(grpc_nothing_happened(tonic::Status::unavailable("the database is busy; retry")))
/// # }
/// ```
pub fn grpc_nothing_happened(status: Status) -> Status {
    mark(status, false)
}

/// Marks a handler's error status as "the effect happened" whatever its code: stored and
/// replayed even when its code is one of the layer's refusals. The gRPC form of
/// [`Happened`](crate::Happened).
///
/// ```
/// use idem_tower::grpc_happened;
/// let status = grpc_happened(tonic::Status::not_found("charged; the receipt's customer is gone"));
/// assert_eq!(status.code(), tonic::Code::NotFound);
/// ```
pub fn grpc_happened(status: Status) -> Status {
    mark(status, true)
}

fn mark(mut status: Status, happened: bool) -> Status {
    status.set_source(Arc::new(Meaning { happened }));
    status
}

/// What the handler's error status in `extensions` says: `Some(true)` happened,
/// `Some(false)` nothing happened, `None` unmarked.
pub(crate) fn meaning(extensions: &Extensions) -> Option<bool> {
    let status = extensions.get::<Status>()?;
    let source = std::error::Error::source(status)?;
    source.downcast_ref::<Meaning>().map(|m| m.happened)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c08_the_mark_survives_into_the_response_extensions() {
        let response = grpc_nothing_happened(Status::internal("rolled back")).into_http::<()>();
        assert_eq!(meaning(response.extensions()), Some(false));
        let response = grpc_happened(Status::not_found("charged")).into_http::<()>();
        assert_eq!(meaning(response.extensions()), Some(true));
        let response = Status::internal("unmarked").into_http::<()>();
        assert_eq!(meaning(response.extensions()), None);
    }
}
