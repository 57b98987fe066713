//! Compiles `proto/` with protox (a pure-Rust protobuf compiler, so the build
//! needs no system `protoc`) and generates the tonic service and prost
//! messages, plus the encoded descriptor set that server reflection serves.

use std::{env, fs, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/retrybudget/v1/retry_budget.proto",
        "proto/retrybudget/v1/error_detail.proto",
    ];
    for proto in protos {
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
    // Messages are decoded from one slice rather than through tonic's
    // buffer (src/grpc/codec.rs).
    tonic_prost_build::configure()
        .codec_path("crate::grpc::codec::SliceCodec")
        .compile_fds(fds)?;
    Ok(())
}
