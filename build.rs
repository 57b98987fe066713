//! Compiles `proto/` with protox (a pure-Rust protobuf compiler, so the build
//! needs no system `protoc`) and generates:
//! - the public API, `retrybudget.v1`: the tonic service and prost messages,
//!   plus the encoded descriptor set that server reflection serves;
//! - the stored schema, `retrybudget.store.v1`: prost messages only, for the
//!   embedded store's records (`src/store/codec.rs`). It is compiled apart so
//!   that reflection never shows it: it is not part of the API.

use std::{env, fs, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/retrybudget/v1/retry_budget.proto",
        "proto/retrybudget/v1/error_detail.proto",
    ];
    let stored = ["proto/retrybudget/store/v1/record.proto"];
    for proto in protos.iter().chain(&stored) {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    // The descriptor set holds our files and every file they import, so
    // reflection clients can resolve google.protobuf types too.
    fs::write(
        out_dir.join("retrybudget_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    // tonic-prost's codec, but a request that does not decode is refused
    // with a stable code (src/grpc/codec.rs).
    tonic_prost_build::configure()
        .codec_path("crate::grpc::codec::ApiCodec")
        .compile_fds(fds)?;
    // Messages alone: the stored schema has no service.
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .compile_fds(protox::compile(stored, ["proto"])?)?;
    Ok(())
}
