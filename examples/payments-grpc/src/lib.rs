//! # payments-grpc
//!
//! A gRPC charges service (`payments.v1.Charges`: `CreateCharge`, `GetCharge`) on tonic, made
//! idempotent by idem's gRPC layer (`idem_tower::GrpcIdempotencyLayer`, docs/grpc.md).
//! `CreateCharge` takes its key from the request's `request_id` field (AIP-155) or from the
//! `idempotency-key` metadata entry; it writes the charge and the key's completion in one
//! transaction, so both commit or neither does: SQLite by default, PostgreSQL when
//! `--database` is a `postgres://` URL. The messages, the server trait and the client are
//! generated at build time from `charges.proto` ([`proto`]): no `protoc` needed.
//!
//! ```sh
//! cargo run -p payments-grpc -- --addr 127.0.0.1:50051
//! ```

pub mod app;
pub mod charges;
pub mod db;
pub mod proto;

/// docs/grpc.md's Rust example, compiled as a doctest here, where the code it uses is.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/grpc.md")]
pub struct GrpcMd;
