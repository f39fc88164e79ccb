//! Between `http` messages and idem's stored responses; bodies read with a limit.

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, Response};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_core::{Error, Field, StoredResponse};

/// The boxed error of a body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body the inner service receives: the original stream for requests the layer passes
/// through, the buffered bytes for the requests it protects. axum's routers and handlers take it
/// as they are; a hyper `service_fn` takes `Request<RequestBody>`.
pub type RequestBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// Reads a request body of at most `limit` bytes. A declared `Content-Length` over the limit is
/// refused before anything is read; a body that turns out longer is refused when it crosses
/// the limit (C12: 413, nothing recorded). A body that cannot be read is a 400.
pub(crate) async fn read_request_body<B>(
    headers: &HeaderMap,
    body: B,
    limit: usize,
) -> Result<Bytes, Error>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(declared) = declared {
        if declared > limit as u64 {
            return Err(Error::BodyTooLarge {
                limit,
                actual: usize::try_from(declared).unwrap_or(usize::MAX),
            });
        }
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<LengthLimitError>() => Err(Error::BodyTooLarge {
            limit,
            actual: limit.saturating_add(1),
        }),
        Err(error) => Err(Error::invalid(
            Field::Body,
            format!("the body could not be read: {error}"),
        )),
    }
}

/// Why a handler's response could not be buffered for storing.
#[derive(Debug)]
pub(crate) enum ResponseReadError {
    /// Over the layer's `max_response_bytes`.
    TooLarge,
    /// The body failed while it was read.
    Failed(BoxError),
}

/// Reads a handler's response whole, with its headers as sent, for storing.
pub(crate) async fn read_response<RB>(
    parts: &http::response::Parts,
    body: RB,
    limit: usize,
) -> Result<StoredResponse, ResponseReadError>
where
    RB: Body,
    RB::Error: Into<BoxError>,
{
    let body = match Limited::new(body, limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) if error.is::<LengthLimitError>() => return Err(ResponseReadError::TooLarge),
        Err(error) => return Err(ResponseReadError::Failed(error)),
    };
    let mut stored = StoredResponse::new(parts.status.as_u16(), body.to_vec());
    for (name, value) in &parts.headers {
        stored = stored.with_header(name.as_str(), value.as_bytes());
    }
    Ok(stored)
}

/// An `http` response from a stored (or rendered) one ([`crate::render::into_http`]).
pub(crate) fn to_http<RB: From<Bytes>>(stored: StoredResponse) -> Response<RB> {
    crate::render::into_http(stored, |body| RB::from(Bytes::from(body)))
}
