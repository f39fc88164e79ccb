//! What the layer needs of the service it wraps and of the bodies it reads and sends, written
//! once. Each trait is implemented for every type that meets its bounds: nothing to implement,
//! only names for generic code (a function that builds a router around the layer, say).

use crate::convert::{BoxError, RequestBody};
use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use std::fmt;
use tower_service::Service;

/// An application's service the layer can protect: it takes the buffered request and answers
/// a response whose body is `RB`, its future and error can move to the engine's task.
///
/// ```
/// use idem_tower::bounds::ProtectedService;
/// fn protectable<S: ProtectedService<axum::body::Body>>(_: &S) {}
/// protectable(&axum::Router::<()>::new());
/// ```
pub trait ProtectedService<RB>:
    Service<
        Request<RequestBody>,
        Response = Response<RB>,
        Future: Send + 'static,
        Error: fmt::Display + Send + 'static,
    > + Send
    + 'static
{
}

impl<T, RB> ProtectedService<RB> for T
where
    T: Service<Request<RequestBody>, Response = Response<RB>> + Send + 'static,
    T::Future: Send + 'static,
    T::Error: fmt::Display + Send + 'static,
{
}

/// A request body the layer can buffer.
pub trait IncomingBody: Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static {}

impl<T> IncomingBody for T where T: Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static {}

/// A response body the layer can buffer, store and rebuild from stored bytes.
pub trait OutgoingBody:
    Body<Data: Send, Error: Into<BoxError>> + From<Bytes> + Send + 'static
{
}

impl<T> OutgoingBody for T where
    T: Body<Data: Send, Error: Into<BoxError>> + From<Bytes> + Send + 'static
{
}
