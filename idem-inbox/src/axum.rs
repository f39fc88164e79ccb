//! axum integration (feature `axum`): a [`Receipt`] is sent as its HTTP answer, so a webhook
//! handler returns it as it is (`receipt.into_response()`).

use crate::Receipt;
use axum_core::body::Body;
use axum_core::response::{IntoResponse, Response};

/// [`Receipt::to_http`](crate::Receipt::to_http): 200 for a processed event or a duplicate (marked
/// `Idempotent-Replayed: true`), 409 + `Retry-After` in progress, 422 for another payload under
/// the same id, 500 for a failure the sender retries.
///
/// ```
/// use axum_core::response::IntoResponse;
/// use idem_inbox::{Ack, Delivery, Inbox};
/// use idem_core::{Idempotency, MemoryStore};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_core::Error> {
/// let inbox = Inbox::new(Idempotency::new(MemoryStore::new()));
/// let event = inbox.event(&Delivery::trusted("stripe", b"{}"), b"evt_1")?;
/// let receipt = inbox.receive(&event, |_ctx| async { Ok::<_, std::io::Error>(Ack::Done) }).await?;
/// assert_eq!(receipt.into_response().status(), 200);
/// # Ok(())
/// # }
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl IntoResponse for Receipt {
    fn into_response(self) -> Response {
        idem_tower::render::into_http(self.to_http(), Body::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;
    use idem_core::StoredResponse;

    #[test]
    fn c07_a_duplicate_receipt_is_marked_as_a_replay() {
        let receipt = Receipt::Duplicate(StoredResponse::new(200, "ok"));
        let response = receipt.into_response();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["idempotent-replayed"], "true");
        let in_progress = Receipt::InProgress {
            retry_after: std::time::Duration::from_secs(2),
        }
        .into_response();
        assert_eq!(in_progress.status(), StatusCode::CONFLICT);
        assert_eq!(in_progress.headers()["retry-after"], "2");
    }
}
