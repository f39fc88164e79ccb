//! The scope's limits at the edge (C2, C12): what a client sent that no record can be keyed on
//! is the client's error, answered before anything is read or recorded.

use crate::consumer::ConsumerError;
use crate::render::Problem;
use http::Method;
use idem_core::Scope;

/// Where the route a key is scoped to comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RouteFrom {
    /// The router's matched template (axum): the server's, bounded by its own routes.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    Template,
    /// The concrete path the client sent (a plain tower service).
    Path,
}

/// The longest path a request with `method` may have when its path is the key's route: the
/// route idem keeps is `"METHOD path"`, at most [`Scope::MAX_ROUTE_LEN`] bytes (1019 bytes of
/// path for a `POST`, 1018 for a `PATCH`).
pub(crate) fn max_path_len(method: &Method) -> usize {
    Scope::MAX_ROUTE_LEN.saturating_sub(method.as_str().len() + 1)
}

/// A 414 when the client's path is the route and is too long for one; a template never is
/// the client's doing (an over-long one stays the server's 500).
pub(crate) fn check_path(method: &Method, route: &str, from: RouteFrom) -> Result<(), Problem> {
    let max = max_path_len(method);
    if from == RouteFrom::Path && route.len() > max {
        return Err(Problem::new(
            414,
            "path-too-long",
            format!(
                "The path is {} bytes; an idempotent {method} request's path may have at most {max}.",
                route.len()
            ),
            false,
        ));
    }
    Ok(())
}

/// The consumer must be one a record can belong to (1..=[`Scope::MAX_CONSUMER_LEN`] bytes, no
/// control character, C2). It comes from the request's credentials, so one that cannot be is
/// a credential the server never issued: 401, as for no credentials at all.
pub(crate) fn check_consumer(consumer: &str) -> Result<(), ConsumerError> {
    Scope::new(consumer, "/")
        .map(drop)
        .map_err(|error| ConsumerError::unusable(error.to_string()))
}
