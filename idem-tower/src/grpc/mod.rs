//! gRPC (feature `tonic`): [`GrpcIdempotencyLayer`] for tonic servers, with the mapping of
//! docs/grpc.md.

mod answer;
mod body;
mod config;
mod details;
mod frame;
mod layer;
mod mark;
mod service;
mod status;
mod timeout;

pub use answer::GrpcAnswer;
pub use config::GrpcMethod;
pub use layer::GrpcIdempotencyLayer;
pub use mark::{grpc_happened, grpc_nothing_happened};
pub use service::GrpcIdempotent;
pub use status::{grpc_code_of, http_status_of, DEFAULT_GRPC_REFUSALS};
