//! The body of a gRPC answer the layer sends: its bytes in one frame, then its trailers.

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The response body of a stored (or rendered) gRPC answer: the messages as the handler sent
/// them, then the trailers.
#[derive(Debug, Default)]
pub(crate) struct AnswerBody {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl AnswerBody {
    /// `data` (nothing when empty), then `trailers` (none when `None`).
    pub(crate) fn new(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self {
            data: (!data.is_empty()).then_some(data),
            trailers,
        }
    }
}

impl Body for AnswerBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    /// Exact only when no trailers follow: an exact hint makes hyper send `content-length`
    /// and may end the stream with the data, before the trailers that carry `grpc-status`.
    fn size_hint(&self) -> SizeHint {
        let len = self.data.as_ref().map_or(0, |d| d.len() as u64);
        if self.trailers.is_some() {
            let mut hint = SizeHint::new();
            hint.set_lower(len);
            hint
        } else {
            SizeHint::with_exact(len)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn data_then_trailers() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let collected = AnswerBody::new(Bytes::from_static(b"abc"), Some(trailers.clone()))
            .collect()
            .await
            .expect("infallible");
        assert_eq!(collected.trailers(), Some(&trailers));
        assert_eq!(collected.to_bytes(), Bytes::from_static(b"abc"));
        assert!(AnswerBody::new(Bytes::new(), None).is_end_stream());
    }

    #[test]
    fn an_answer_with_trailers_has_no_exact_size() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let body = AnswerBody::new(Bytes::from_static(b"abc"), Some(trailers));
        assert_eq!(
            body.size_hint().exact(),
            None,
            "no content-length before trailers"
        );
        assert_eq!(body.size_hint().lower(), 3);
        let head_only = AnswerBody::new(Bytes::new(), None);
        assert_eq!(head_only.size_hint().exact(), Some(0));
    }
}
