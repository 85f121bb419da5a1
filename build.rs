//! Generates Rust from the contracts: the gRPC service code and `GRPC_OPERATIONS` from `proto/`
//! (pure-Rust protox, no system protoc; `build/grpc.rs`), and the HTTP types, service trait,
//! router and `HTTP_OPERATIONS` from `openapi/pgvs3.yaml` (`build/http.rs`).

#[path = "build/grpc.rs"]
mod grpc;
#[path = "build/http.rs"]
mod http;

use std::path::PathBuf;

type BuildResult<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> BuildResult<()> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    grpc::generate(&out_dir)?;
    http::generate(&out_dir)?;
    Ok(())
}
