//! proto/ → the tonic client and server code and the gRPC operation table
//! (`crate::contract::GRPC_OPERATIONS`).

use std::path::{Path, PathBuf};

use quote::{format_ident, quote};

use crate::BuildResult;

fn proto_files(dir: &Path, found: &mut Vec<PathBuf>) -> BuildResult<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            proto_files(&path, found)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            found.push(path);
        }
    }
    Ok(())
}

pub fn generate(out_dir: &Path) -> BuildResult<()> {
    println!("cargo:rerun-if-changed=proto");
    let mut files = Vec::new();
    proto_files(Path::new("proto"), &mut files)?;
    files.sort();
    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler
        .include_source_info(true)
        .include_imports(true)
        .open_files(&files)?;
    let fds = compiler.file_descriptor_set();
    // Custom options (the role) survive only in the reflective pool, not in prost's types.
    let pool = compiler.descriptor_pool();
    let role_option = pool
        .get_extension_by_name("pgvs3.v1.role")
        .ok_or("proto/pgvs3/v1/role.proto: extension pgvs3.v1.role missing")?;

    std::fs::write(
        out_dir.join("grpc_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;

    // The read-only table for the gate comes from `idempotency_level = NO_SIDE_EFFECTS`, the role
    // from `(pgvs3.v1.role)`, which every method must declare.
    let mut rows = Vec::new();
    for file in &fds.file {
        let package = file.package();
        for service in &file.service {
            for method in &service.method {
                let read_only = method.options.as_ref().is_some_and(|o| {
                    o.idempotency_level()
                        == prost_types::method_options::IdempotencyLevel::NoSideEffects
                });
                let full_name = format!("{package}.{}", service.name());
                let declared = pool
                    .get_service_by_name(&full_name)
                    .and_then(|s| s.methods().find(|m| m.name() == method.name()))
                    .map(|m| m.options().get_extension(&role_option).into_owned());
                let role = match declared.as_ref().and_then(|v| v.as_enum_number()) {
                    Some(1) => "Public",
                    Some(2) => "Reader",
                    Some(3) => "Producer",
                    Some(4) => "Worker",
                    Some(5) => "Admin",
                    _ => {
                        return Err(format!(
                            "{full_name}/{}: no `option (pgvs3.v1.role)`; every method declares its role",
                            method.name()
                        )
                        .into());
                    }
                };
                let path = format!("/{full_name}/{}", method.name());
                let role = format_ident!("{role}");
                rows.push(quote! {
                    GrpcOperation { path: #path, read_only: #read_only, role: crate::core::Role::#role }
                });
            }
        }
    }
    let table = quote! {
        /// Every gRPC method served, with whether a read-only gateway may serve it and its role.
        pub const GRPC_OPERATIONS: &[GrpcOperation] = &[#(#rows),*];
    };
    crate::write_rust(&out_dir.join("grpc_operations.rs"), "proto/", table)?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
