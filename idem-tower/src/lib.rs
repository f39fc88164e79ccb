//! # idem-tower
//!
//! HTTP for idem: [`IdempotencyLayer`], a tower layer that makes the `POST` and `PATCH`
//! endpoints under it idempotent, with the HTTP mapping of docs/state-machine.md and
//! docs/http.md: 400 for a bad or missing key, 413, 422 for a key reused with another request,
//! 409 + `Retry-After` while the first request runs, the stored response replayed byte for byte
//! with `Idempotent-Replayed: true`, 503 when the store is down (fail closed).
//!
//! The execution outlives the request's future: a client that disconnects cannot cancel it,
//! its response is stored and the retry gets it (C8).
//!
//! Two forms, side by side:
//!
//! - **The handler does not know the layer is there**: its response is stored and replayed,
//!   unless its status says the request was refused before it executed (the engine's
//!   `Policy::refusals`: 400, 401, 403, 404, 422, 429...; an axum extractor's rejection
//!   included): then it is sent, nothing is stored and the key is released, so the corrected
//!   retry with the same key executes. A 402 decline, a 409 conflict, a 5xx are stored. Mark a
//!   response [`NothingHappened`] to release the key whatever its status (a rollback), or
//!   [`Happened`] to store it whatever its status (a 422 after the effect ran).
//! - **Completion in the handler's own transaction** (SQLite, PostgreSQL): the handler takes the
//!   [`Reservation`] (an axum extractor with feature `axum`), writes its effect and the
//!   reservation's completion in one transaction, commits, and returns [`Completed`]; the layer
//!   sends what was stored, without completing twice.
//!
//! ```
//! use axum::{routing::post, Json, Router};
//! use idem_core::{Idempotency, MemoryStore};
//! use idem_tower::{ConsumerError, IdempotencyLayer};
//!
//! async fn create_charge(Json(charge): Json<serde_json::Value>) -> Json<serde_json::Value> {
//!     Json(serde_json::json!({ "id": "ch_1", "amount": charge["amount"] }))
//! }
//!
//! let idem = Idempotency::new(MemoryStore::new());
//! let app: Router = Router::new()
//!     .route("/v1/charges", post(create_charge))
//!     .route_layer(IdempotencyLayer::new(idem, |req: &http::request::Parts| {
//!         // The authenticated account, from your authentication layer (here a header).
//!         req.headers.get("x-account").and_then(|v| v.to_str().ok()).map(str::to_owned)
//!             .ok_or_else(ConsumerError::unauthenticated)
//!     }));
//! ```
//!
//! With feature `tonic`, [`GrpcIdempotencyLayer`] does the same for the unary methods of a tonic
//! server (docs/grpc.md): the key from metadata or from the request message (AIP-155
//! `request_id`), answers stored with their trailers and replayed byte for byte.
//!
//! [`canonical`] makes a body canonical by its media type (canonical JSON, canonical forms), so
//! that a re-encoded retry is the same request (C3); the layer does it for JSON and forms by
//! default.
//!
//! [`render`] turns idem's errors and answers into HTTP for handlers that call the engine
//! themselves; with feature `axum`, `Http(..)` sends them as axum responses.
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "axum")]
mod axum;
pub mod bounds;
pub mod canonical;
mod config;
mod consumer;
mod convert;
mod disposition;
#[cfg(feature = "tonic")]
mod grpc;
mod key;
mod layer;
mod limits;
mod marker;
pub mod render;
mod reservation;
mod service;
mod transaction;

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use axum::Http;
pub use config::{ServerErrors, DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_MAX_RETRY_AFTER};
pub use consumer::ConsumerError;
pub use convert::{BoxError, RequestBody};
pub use disposition::Handled;
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
pub use grpc::{
    grpc_code_of, grpc_happened, grpc_nothing_happened, http_status_of, GrpcAnswer,
    GrpcIdempotencyLayer, GrpcIdempotent, GrpcMethod, DEFAULT_GRPC_REFUSALS,
};
pub use layer::IdempotencyLayer;
pub use marker::{Completed, Happened, NothingHappened, OutcomeUnknown};
pub use reservation::Reservation;
pub use service::{Idempotent, ResponseFuture};
