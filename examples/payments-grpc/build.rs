//! Generates `payments.v1` from `charges.proto`: protox, a .proto compiler written in Rust (no
//! `protoc`), parses the file into a descriptor set; tonic-prost-build writes the messages, the
//! server trait and the client from it into `OUT_DIR`, where `src/proto.rs` includes them.

use std::error::Error;
use std::path::Path;

const PROTO: &str = "charges.proto";

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed={PROTO}");
    let dir = std::env::var("CARGO_MANIFEST_DIR")?;
    let descriptors = protox::compile([Path::new(&dir).join(PROTO)], [&dir])
        // protox's error says where in the file it failed.
        .map_err(|error| format!("{PROTO}: {error}"))?;
    tonic_prost_build::configure()
        // The one rerun-if-changed line is the one above.
        .emit_rerun_if_changed(false)
        .compile_fds(descriptors)?;
    Ok(())
}
