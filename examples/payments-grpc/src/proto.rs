//! `payments.v1`, generated from `charges.proto` at build time: the messages, the server trait
//! ([`charges_server::Charges`], served by [`charges_server::ChargesServer`]) and the client
//! ([`charges_client::ChargesClient`]). `build.rs` compiles the file with protox (no `protoc`)
//! and tonic-prost-build writes the code into `OUT_DIR/payments.v1.rs`. This module includes
//! it. The file is at the root of this package (what grpcurl's `-proto` takes):
//!
#![doc = concat!("```proto\n", include_str!("../charges.proto"), "```")]
// No `allow` needed: every element of charges.proto has a comment, which becomes its doc
// (missing_docs), and tonic's generated modules carry their own `allow`s.

tonic::include_proto!("payments.v1");
