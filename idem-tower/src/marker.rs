//! What a handler tells the layer through its response: nothing happened, it happened whatever
//! its status, or it is already completed.

use bytes::Bytes;
use http::{Response, StatusCode};
use idem_core::Completion;

/// A response extension by which a handler says its effect did not happen (its transaction
/// rolled back, a validation error before anything ran): the layer sends the response, stores
/// nothing and releases the key, so a retry runs again (C8). Any status may carry it.
///
/// ```
/// use idem_tower::NothingHappened;
/// let mut response = http::Response::new(String::from("amount must be positive"));
/// *response.status_mut() = http::StatusCode::BAD_REQUEST;
/// response.extensions_mut().insert(NothingHappened);
/// ```
///
/// With axum (feature `axum`) it is a response part: `(StatusCode::BAD_REQUEST,
/// NothingHappened, Json(error))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NothingHappened;

/// A response extension by which a handler says its effect happened whatever its status: the
/// layer stores and replays it even when the status is one the engine's policy takes for a
/// refusal before execution (`Policy::refusals`: 400, 404, 422...), for a handler that
/// answers such a status after its effect ran (C8).
///
/// ```
/// use idem_tower::Happened;
/// let mut response = http::Response::new(String::from("charged, but the receipt address is invalid"));
/// *response.status_mut() = http::StatusCode::UNPROCESSABLE_ENTITY;
/// response.extensions_mut().insert(Happened);
/// ```
///
/// With axum it is a response part: `(StatusCode::UNPROCESSABLE_ENTITY, Happened, Json(body))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Happened;

/// A response extension by which a handler says its effect's outcome is unknown (an upstream
/// call timed out after it was sent: the card may have been charged). The layer stores the
/// response (a 500 problem, or a 202 pointing at a status resource) marked in doubt with
/// [`note`](Self::note), replays it to every retry, and never runs the effect again blind; a
/// reconciler (`idem_ops::reconcile`) or an operator (`idem doubt`) settles it with the real
/// answer or releases the key (C8; docs/state-machine.md, "Records in doubt"). Any status may
/// carry it.
///
/// ```
/// use idem_tower::OutcomeUnknown;
/// let mut response = http::Response::new(String::from("the card network did not answer"));
/// *response.status_mut() = http::StatusCode::BAD_GATEWAY;
/// response.extensions_mut().insert(OutcomeUnknown::noting("network key idem_3f2a"));
/// ```
///
/// With axum it is a response part: `(StatusCode::BAD_GATEWAY, OutcomeUnknown::noting(key), Json(error))`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OutcomeUnknown {
    /// What a reconciler needs to ask the provider later (its idempotency key, a request id),
    /// kept with the answer in doubt.
    pub note: String,
}

impl OutcomeUnknown {
    /// The marker with `note`.
    pub fn noting(note: impl Into<String>) -> Self {
        Self { note: note.into() }
    }
}

/// The response of a handler that completed the record **inside its own transaction** (with a
/// SQL store's `complete_in` and [`Reservation::completion`](crate::Reservation::completion))
/// and committed it. The layer checks that the record carries this completion and sends the
/// response exactly as stored: no second completion. A completion that is not in the store
/// (the transaction rolled back, or another lease's) is answered with a stored 500, never with
/// a success for an effect that was not recorded.
///
/// ```
/// use idem_tower::Completed;
/// # fn demo(completion: idem_core::Completion) {
/// let response: http::Response<axum::body::Body> = Completed(completion).into_http();
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Completed(pub Completion);

impl Completed {
    /// An `http` response carrying the completion (its status; the layer sends the stored body).
    pub fn into_http<B: From<Bytes>>(self) -> Response<B> {
        let mut response = Response::new(B::from(Bytes::new()));
        *response.status_mut() = StatusCode::from_u16(self.0.response().status)
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        response.extensions_mut().insert(self);
        response
    }
}
