//! Generates the gRPC service code from `proto/` (pure-Rust protox, no system protoc) and the HTTP
//! types, service trait, router and operation table from `openapi/pgvs3.yaml`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

type BuildResult<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> BuildResult<()> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    generate_grpc(&out_dir)?;
    generate_http(&out_dir)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// gRPC

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

fn generate_grpc(out_dir: &Path) -> BuildResult<()> {
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
    let mut table = String::from(
        "/// Every gRPC method served, with whether a read-only gateway may serve it and its role.\n\
         pub const GRPC_OPERATIONS: &[GrpcOperation] = &[\n",
    );
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
                writeln!(
                    table,
                    "    GrpcOperation {{ path: \"/{full_name}/{}\", read_only: {read_only}, role: crate::core::Role::{role} }},",
                    method.name()
                )?;
            }
        }
    }
    table.push_str("];\n");
    std::fs::write(out_dir.join("grpc_operations.rs"), table)?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// HTTP from OpenAPI

struct Param {
    name: String,
    rust_type: String,
    required: bool,
}

struct Operation {
    id: String,
    fn_name: String,
    type_name: String,
    method: String,
    path: String,
    summary: String,
    read_only: bool,
    /// The `crate::core::Role` variant the operation needs.
    role: &'static str,
    path_params: Vec<String>,
    query: Vec<Param>,
    /// Optional string header parameters, by their HTTP name.
    headers: Vec<String>,
    body: Option<(String, bool)>,
    responses: Vec<(u16, Option<String>, Vec<String>)>,
    /// The status of a successful answer that may also be `text/event-stream`.
    event_stream: Option<u16>,
    /// `x-external: true`: served by its own router (its answer is not JSON); only the
    /// operation table names it.
    external: bool,
}

/// The media type of server-sent events; a response offering it is negotiated on `Accept`.
const EVENT_STREAM: &str = "text/event-stream";

/// The schema of a content map, ignoring `text/event-stream` (its frames are not a JSON body).
fn content_schema(content: Option<&Value>) -> Option<&Value> {
    content
        .and_then(Value::as_object)
        .and_then(|c| {
            c.iter()
                .find(|(media, _)| media.as_str() != EVENT_STREAM)
                .map(|(_, m)| m)
        })
        .and_then(|m| m.get("schema"))
}

/// The Rust field name of a header parameter: `Last-Event-ID` becomes `last_event_id`.
fn header_ident(name: &str) -> String {
    name.to_ascii_lowercase().replace('-', "_")
}

fn generate_http(out_dir: &Path) -> BuildResult<()> {
    let spec_path = "openapi/pgvs3.yaml";
    println!("cargo:rerun-if-changed={spec_path}");
    let spec: Value = serde_yaml::from_str(&std::fs::read_to_string(spec_path)?)?;

    let mut code =
        String::from("// @generated by build.rs from openapi/pgvs3.yaml; do not edit.\n\n");
    code.push_str(&generate_types(&spec)?);
    let operations = collect_operations(&spec)?;
    code.push_str(&generate_operations(&operations)?);
    std::fs::write(out_dir.join("openapi.rs"), code)?;
    std::fs::write(
        out_dir.join("http_operations.rs"),
        generate_operation_table(&operations)?,
    )?;
    Ok(())
}

fn ref_name(reference: &str) -> String {
    reference
        .rsplit('/')
        .next()
        .unwrap_or(reference)
        .to_string()
}

fn rust_type(schema: &Value) -> BuildResult<String> {
    if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
        return Ok(ref_name(reference));
    }
    let ty = match schema.get("type").and_then(Value::as_str) {
        None => "serde_json::Value".to_string(),
        Some("string") => "String".to_string(),
        Some("boolean") => "bool".to_string(),
        Some("number") => "f64".to_string(),
        Some("integer") => match schema.get("format").and_then(Value::as_str) {
            Some("int32") => "i32".to_string(),
            _ => "i64".to_string(),
        },
        Some("array") => {
            let items = schema.get("items").cloned().unwrap_or(Value::Null);
            format!("Vec<{}>", rust_type(&items)?)
        }
        Some("object") => {
            if schema.get("properties").is_some() {
                return Err("inline objects with properties are not supported; use a $ref".into());
            }
            "serde_json::Map<String, serde_json::Value>".to_string()
        }
        Some(other) => return Err(format!("unsupported schema type {other}").into()),
    };
    Ok(ty)
}

fn field_ident(name: &str) -> String {
    match name {
        "type" | "ref" | "match" | "move" | "self" | "struct" | "enum" | "fn" | "use" => {
            format!("r#{name}")
        }
        _ => name.to_string(),
    }
}

fn doc(text: &str, indent: &str) -> String {
    let mut out = String::new();
    for line in text.trim().lines() {
        let _ = writeln!(out, "{indent}/// {}", line.trim_end());
    }
    out
}

fn generate_types(spec: &Value) -> BuildResult<String> {
    let schemas = spec
        .pointer("/components/schemas")
        .and_then(Value::as_object)
        .ok_or("components.schemas missing")?;
    let mut code = String::from(
        "/// Wire types generated from the OpenAPI component schemas.\n\
         pub mod types {\n    #![allow(clippy::all)]\n    use serde::{Deserialize, Serialize};\n\n",
    );
    for (name, schema) in schemas {
        let description = schema
            .get("description")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("The `{name}` schema."));
        code.push_str(&doc(&description, "    "));
        code.push_str("    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]\n");
        let _ = writeln!(code, "    pub struct {name} {{");
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let empty = serde_json::Map::new();
        let properties = schema
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        for (field, field_schema) in properties {
            if let Some(d) = field_schema.get("description").and_then(Value::as_str) {
                code.push_str(&doc(d, "        "));
            }
            let ty = rust_type(field_schema)?;
            let ident = field_ident(field);
            if required.contains(&field.as_str()) {
                let _ = writeln!(code, "        pub {ident}: {ty},");
            } else if ty == "serde_json::Value" {
                // Any-JSON fields keep an explicit null (Some(Null)) apart from absence (None).
                code.push_str(
                    "        #[serde(default, deserialize_with = \"crate::http::present\", skip_serializing_if = \"Option::is_none\")]\n",
                );
                let _ = writeln!(code, "        pub {ident}: Option<{ty}>,");
            } else {
                code.push_str(
                    "        #[serde(default, skip_serializing_if = \"Option::is_none\")]\n",
                );
                let _ = writeln!(code, "        pub {ident}: Option<{ty}>,");
            }
        }
        if schema.get("additionalProperties") == Some(&Value::Bool(true)) {
            code.push_str("        /// Fields the schema does not name, kept as they came.\n");
            code.push_str("        #[serde(flatten)]\n");
            code.push_str("        pub extra: serde_json::Map<String, serde_json::Value>,\n");
        }
        code.push_str("    }\n\n");
    }
    code.push_str("}\n\n");
    Ok(code)
}

fn snake_case(id: &str) -> String {
    let mut out = String::new();
    for (i, c) in id.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn pascal_case(id: &str) -> String {
    let mut chars = id.chars();
    match chars.next() {
        Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
        None => String::new(),
    }
}

fn status_variant(status: u16) -> BuildResult<&'static str> {
    Ok(match status {
        200 => "Ok",
        201 => "Created",
        202 => "Accepted",
        204 => "NoContent",
        503 => "ServiceUnavailable",
        other => return Err(format!("no variant name for status {other}").into()),
    })
}

fn collect_operations(spec: &Value) -> BuildResult<Vec<Operation>> {
    let paths = spec
        .get("paths")
        .and_then(Value::as_object)
        .ok_or("paths missing")?;
    let mut operations = Vec::new();
    for (path, item) in paths {
        let shared_params = item
            .get("parameters")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for method in ["get", "post", "put", "patch", "delete"] {
            let Some(op) = item.get(method) else { continue };
            let id = op
                .get("operationId")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("{method} {path}: operationId missing"))?;
            let mut params = shared_params.clone();
            params.extend(
                op.get("parameters")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
            );
            let mut path_params = Vec::new();
            let mut query = Vec::new();
            let mut headers = Vec::new();
            for p in &params {
                let name = p.get("name").and_then(Value::as_str).ok_or("param name")?;
                match p.get("in").and_then(Value::as_str) {
                    Some("path") => path_params.push(name.to_string()),
                    Some("query") => query.push(Param {
                        name: name.to_string(),
                        rust_type: rust_type(p.get("schema").unwrap_or(&Value::Null))?,
                        required: p.get("required") == Some(&Value::Bool(true)),
                    }),
                    Some("header") => {
                        let ty = rust_type(p.get("schema").unwrap_or(&Value::Null))?;
                        if ty != "String" || p.get("required") == Some(&Value::Bool(true)) {
                            return Err(
                                format!("{id}: header {name} must be an optional string").into()
                            );
                        }
                        headers.push(name.to_string());
                    }
                    _ => return Err(format!("{id}: unsupported parameter {name}").into()),
                }
            }
            // Path parameters are passed in the order they appear in the path.
            path_params.sort_by_key(|p| path.find(&format!("{{{p}}}")));
            let body = match op.get("requestBody") {
                None => None,
                Some(body) => {
                    let schema = content_schema(body.get("content"))
                        .ok_or_else(|| format!("{id}: request body schema missing"))?;
                    let required = body.get("required") == Some(&Value::Bool(true));
                    Some((rust_type(schema)?, required))
                }
            };
            let mut responses = Vec::new();
            let mut event_stream = None;
            for (code, response) in op
                .get("responses")
                .and_then(Value::as_object)
                .ok_or("responses")?
            {
                let status: u16 = code.parse()?;
                if response.get("$ref").is_some() {
                    continue; // shared error responses: always the error envelope
                }
                if !(200..300).contains(&status) && status != 503 {
                    continue;
                }
                let schema = content_schema(response.get("content"))
                    .map(rust_type)
                    .transpose()?;
                if response
                    .pointer(&format!("/content/{}", EVENT_STREAM.replace('/', "~1")))
                    .is_some()
                {
                    if event_stream.is_some() {
                        return Err(
                            format!("{id}: more than one answer offers {EVENT_STREAM}").into()
                        );
                    }
                    event_stream = Some(status);
                }
                let headers = response
                    .get("headers")
                    .and_then(Value::as_object)
                    .map(|h| h.keys().cloned().collect())
                    .unwrap_or_default();
                responses.push((status, schema, headers));
            }
            let role = match op.get("x-role").and_then(Value::as_str) {
                Some("public") => "Public",
                Some("reader") => "Reader",
                Some("producer") => "Producer",
                Some("worker") => "Worker",
                Some("admin") => "Admin",
                other => {
                    return Err(format!(
                        "{method} {path} ({id}): x-role is {other:?}; every operation declares \
                         one of public, reader, producer, worker, admin"
                    )
                    .into());
                }
            };
            let read_only = op
                .get("x-read-only")
                .and_then(Value::as_bool)
                .unwrap_or(method == "get");
            let external = op.get("x-external").and_then(Value::as_bool) == Some(true);
            operations.push(Operation {
                id: id.to_string(),
                fn_name: snake_case(id),
                type_name: pascal_case(id),
                method: method.to_uppercase(),
                path: path.clone(),
                summary: op
                    .get("summary")
                    .and_then(Value::as_str)
                    .unwrap_or(id)
                    .to_string(),
                read_only,
                role,
                path_params,
                query,
                headers,
                body,
                responses,
                event_stream,
                external,
            });
        }
    }
    Ok(operations)
}

/// The HTTP operation table (`crate::contract::HTTP_OPERATIONS`), a file of its own so that the
/// middleware reads it without the HTTP adapter.
fn generate_operation_table(operations: &[Operation]) -> BuildResult<String> {
    let mut code = String::from(
        "// @generated by build.rs from openapi/pgvs3.yaml; do not edit.\n\n\
         /// Every HTTP operation of the OpenAPI document.\n\
         pub const HTTP_OPERATIONS: &[HttpOperation] = &[\n",
    );
    for op in operations {
        writeln!(
            code,
            "    HttpOperation {{ id: \"{}\", method: \"{}\", path: \"{}\", read_only: {}, role: crate::core::Role::{} }},",
            op.id, op.method, op.path, op.read_only, op.role
        )?;
    }
    code.push_str("];\n");
    Ok(code)
}

fn generate_operations(operations: &[Operation]) -> BuildResult<String> {
    let mut code = String::new();

    // Generated for the operations this module serves.
    let served: Vec<&Operation> = operations.iter().filter(|op| !op.external).collect();
    let operations = served.as_slice();

    // Query structs and response enums.
    for op in operations {
        if !op.query.is_empty() {
            let _ = writeln!(
                code,
                "/// Query parameters of `{}`.\n#[derive(Debug, Clone, Default, serde::Deserialize)]\npub struct {}Query {{",
                op.id, op.type_name
            );
            for p in &op.query {
                let ident = field_ident(&p.name);
                if p.required {
                    let _ = writeln!(code, "    pub {ident}: {},", p.rust_type);
                } else {
                    let _ = writeln!(
                        code,
                        "    #[serde(default)]\n    pub {ident}: Option<{}>,",
                        p.rust_type
                    );
                }
            }
            code.push_str("}\n\n");
        }
        if !op.headers.is_empty() {
            let _ = writeln!(
                code,
                "/// Header parameters of `{}`.\n#[derive(Debug, Clone, Default)]\npub struct {}Headers {{",
                op.id, op.type_name
            );
            for h in &op.headers {
                let _ = writeln!(
                    code,
                    "    /// `{h}`.\n    pub {}: Option<String>,",
                    header_ident(h)
                );
            }
            code.push_str("}\n\n");
        }
        let _ = writeln!(
            code,
            "/// Successful answers of `{}`.\n#[derive(Debug)]\npub enum {}Response {{",
            op.id, op.type_name
        );
        for (status, schema, headers) in &op.responses {
            let variant = status_variant(*status)?;
            match (schema, headers.is_empty()) {
                (None, _) => {
                    let _ = writeln!(code, "    {variant},");
                }
                (Some(ty), true) => {
                    let _ = writeln!(code, "    {variant}(types::{ty}),");
                }
                (Some(ty), false) => {
                    let _ = write!(code, "    {variant} {{ body: types::{ty}");
                    for h in headers {
                        let _ = write!(
                            code,
                            ", {}: String",
                            snake_case(&h.replace('-', "")).to_lowercase()
                        );
                    }
                    code.push_str(" },\n");
                }
            }
        }
        if let Some(status) = op.event_stream {
            let _ = writeln!(
                code,
                "    /// The `{EVENT_STREAM}` form of the {status} answer.\n    {}EventStream(crate::http::EventStream),",
                status_variant(status)?
            );
        }
        code.push_str("}\n\n");
        let _ = writeln!(
            code,
            "impl axum::response::IntoResponse for {}Response {{\n    fn into_response(self) -> axum::response::Response {{\n        match self {{",
            op.type_name
        );
        for (status, schema, headers) in &op.responses {
            let variant = status_variant(*status)?;
            let status_expr =
                format!("http::StatusCode::from_u16({status}).unwrap_or(http::StatusCode::OK)");
            match (schema, headers.is_empty()) {
                (None, _) => {
                    let _ = writeln!(
                        code,
                        "            Self::{variant} => axum::response::IntoResponse::into_response({status_expr}),"
                    );
                }
                (Some(_), true) => {
                    let _ = writeln!(
                        code,
                        "            Self::{variant}(body) => crate::http::ojs_json({status_expr}, &body),"
                    );
                }
                (Some(_), false) => {
                    let names: Vec<String> = headers
                        .iter()
                        .map(|h| snake_case(&h.replace('-', "")).to_lowercase())
                        .collect();
                    let _ = writeln!(
                        code,
                        "            Self::{variant} {{ body, {} }} => {{\n                let mut response = crate::http::ojs_json({status_expr}, &body);",
                        names.join(", ")
                    );
                    for (h, n) in headers.iter().zip(&names) {
                        let _ = writeln!(
                            code,
                            "                if let Ok(value) = http::HeaderValue::from_str(&{n}) {{ response.headers_mut().insert(\"{}\", value); }}",
                            h.to_lowercase()
                        );
                    }
                    code.push_str("                response\n            }\n");
                }
            }
        }
        if let Some(status) = op.event_stream {
            let _ = writeln!(
                code,
                "            Self::{}EventStream(stream) => axum::response::IntoResponse::into_response(stream),",
                status_variant(status)?
            );
        }
        code.push_str("        }\n    }\n}\n\n");
    }

    // The service trait.
    code.push_str(
        "/// The HTTP binding as one async method per OpenAPI operation.\n\
         pub trait HttpApi: Send + Sync + 'static {\n",
    );
    for op in operations {
        code.push_str(&doc(&op.summary, "    "));
        let _ = write!(
            code,
            "    fn {}(&self, ctx: crate::http::RequestContext",
            op.fn_name
        );
        for p in &op.path_params {
            let _ = write!(code, ", {}: String", field_ident(p));
        }
        if !op.query.is_empty() {
            let _ = write!(code, ", query: {}Query", op.type_name);
        }
        if !op.headers.is_empty() {
            let _ = write!(code, ", headers: {}Headers", op.type_name);
        }
        if op.event_stream.is_some() {
            // Whether the client's Accept asks for the text/event-stream answer.
            code.push_str(", event_stream: bool");
        }
        if let Some((ty, required)) = &op.body {
            if *required {
                let _ = write!(code, ", body: types::{ty}");
            } else {
                let _ = write!(code, ", body: Option<types::{ty}>");
            }
        }
        let _ = writeln!(
            code,
            ") -> impl std::future::Future<Output = Result<{}Response, crate::http::ApiError>> + Send;",
            op.type_name
        );
    }
    code.push_str("}\n\n");

    // Handlers.
    for op in operations {
        let _ = write!(
            code,
            "async fn handle_{}<A: HttpApi>(axum::extract::State(api): axum::extract::State<std::sync::Arc<A>>, ctx: crate::http::RequestContext",
            op.fn_name
        );
        if !op.path_params.is_empty() {
            let names: Vec<String> = op.path_params.iter().map(|p| field_ident(p)).collect();
            let types: Vec<&str> = op.path_params.iter().map(|_| "String").collect();
            let _ = write!(
                code,
                ", crate::http::OjsPath(({},)): crate::http::OjsPath<({},)>",
                names.join(", "),
                types.join(", ")
            );
        }
        let needs_headers = !op.headers.is_empty() || op.event_stream.is_some();
        if needs_headers {
            code.push_str(", header_map: http::HeaderMap");
        }
        if !op.query.is_empty() {
            let _ = write!(
                code,
                ", crate::http::OjsQuery(query): crate::http::OjsQuery<{}Query>",
                op.type_name
            );
        }
        if let Some((ty, required)) = &op.body {
            if *required {
                let _ = write!(
                    code,
                    ", crate::http::OjsJson(body): crate::http::OjsJson<types::{ty}>"
                );
            } else {
                let _ = write!(
                    code,
                    ", crate::http::OptionalOjsJson(body): crate::http::OptionalOjsJson<types::{ty}>"
                );
            }
        }
        code.push_str(") -> axum::response::Response {\n");
        if !op.headers.is_empty() {
            let _ = writeln!(code, "    let headers = {}Headers {{", op.type_name);
            for h in &op.headers {
                let _ = writeln!(
                    code,
                    "        {}: match crate::http::header_param(&header_map, \"{h}\") {{ Ok(v) => v, Err(e) => return axum::response::IntoResponse::into_response(e.with_request_id(&ctx.request_id)) }},",
                    header_ident(h)
                );
            }
            code.push_str("    };\n");
        }
        if op.event_stream.is_some() {
            code.push_str(
                "    let event_stream = crate::http::accepts_event_stream(&header_map);\n",
            );
        }
        let _ = write!(code, "    let result = api.{}(ctx.clone()", op.fn_name);
        for p in &op.path_params {
            let _ = write!(code, ", {}", field_ident(p));
        }
        if !op.query.is_empty() {
            code.push_str(", query");
        }
        if !op.headers.is_empty() {
            code.push_str(", headers");
        }
        if op.event_stream.is_some() {
            code.push_str(", event_stream");
        }
        if op.body.is_some() {
            code.push_str(", body");
        }
        code.push_str(").await;\n    crate::http::respond(&ctx, result)\n}\n\n");
    }

    // Router.
    let mut by_path: BTreeMap<&str, Vec<&Operation>> = BTreeMap::new();
    for op in operations {
        by_path.entry(op.path.as_str()).or_default().push(*op);
    }
    code.push_str(
        "/// The axum router calling `api` for every OpenAPI operation.\n\
         pub fn router<A: HttpApi>(api: std::sync::Arc<A>) -> axum::Router {\n    axum::Router::new()\n",
    );
    for (path, ops) in by_path {
        let mut chain = String::new();
        for (i, op) in ops.iter().enumerate() {
            let method = op.method.to_lowercase();
            if i == 0 {
                let _ = write!(chain, "axum::routing::{method}(handle_{}::<A>)", op.fn_name);
            } else {
                let _ = write!(chain, ".{method}(handle_{}::<A>)", op.fn_name);
            }
        }
        let _ = writeln!(code, "        .route(\"{path}\", {chain})");
    }
    code.push_str("        .with_state(api)\n}\n");
    Ok(code)
}
