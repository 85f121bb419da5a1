//! openapi/pgvs3.yaml → the HTTP binding (`openapi.rs`: the wire types, one query/header struct
//! and one response enum per operation, the `HttpApi` trait, the handlers and the axum router)
//! and the HTTP operation table (`http_operations.rs`: `crate::contract::HTTP_OPERATIONS`).
//!
//! Every status an operation documents is accounted for (see [`answer`]): a success status is a
//! variant of the operation's response enum; an error status whose body is the `ErrorEnvelope`
//! is an answer of `crate::http::ApiError`, the one error type every operation returns; anything
//! else fails the build, naming the operation and the status.

use std::collections::BTreeMap;
use std::path::Path;

use proc_macro2::{Ident, TokenStream};
use quote::{format_ident, quote};
use serde_json::Value;

use crate::BuildResult;
use crate::ident::{Case, distinct, ident};

const SPEC_PATH: &str = "openapi/pgvs3.yaml";

/// The media type of server-sent events; a response offering it is negotiated on `Accept`.
const EVENT_STREAM: &str = "text/event-stream";

/// The schema of the shared error body; an error status answering it is served by `ApiError`.
const ERROR_ENVELOPE: &str = "ErrorEnvelope";

/// A status a response enum can have a variant for: the code, the variant and the
/// `http::StatusCode` constant.
struct Status {
    code: u16,
    variant: &'static str,
    constant: &'static str,
}

/// The success statuses an operation may document; each is a variant of its response enum.
const SUCCESS_STATUSES: &[Status] = &[
    Status {
        code: 200,
        variant: "Ok",
        constant: "OK",
    },
    Status {
        code: 201,
        variant: "Created",
        constant: "CREATED",
    },
    Status {
        code: 202,
        variant: "Accepted",
        constant: "ACCEPTED",
    },
    Status {
        code: 204,
        variant: "NoContent",
        constant: "NO_CONTENT",
    },
];

/// The error statuses an operation may answer with a body of its own, not the error envelope
/// (the health check's 503 carries the health report); each is a variant of its response enum.
const OWN_BODY_ERROR_STATUSES: &[Status] = &[Status {
    code: 503,
    variant: "ServiceUnavailable",
    constant: "SERVICE_UNAVAILABLE",
}];

/// The Rust type of a schema.
enum Ty {
    /// A component schema: a struct of the `types` module.
    Schema(Ident),
    String,
    Bool,
    F64,
    I32,
    I64,
    /// Any JSON value.
    Json,
    /// A JSON object without named properties.
    JsonMap,
    /// Any JSON value marked `x-raw-json`: passed through as text, never parsed.
    RawJson,
    Vec(Box<Ty>),
}

impl Ty {
    /// The type inside the `types` module (`Job`) or outside it (`types::Job`).
    fn tokens(&self, outside_types: bool) -> TokenStream {
        match self {
            Ty::Schema(name) if outside_types => quote!(types::#name),
            Ty::Schema(name) => quote!(#name),
            Ty::String => quote!(String),
            Ty::Bool => quote!(bool),
            Ty::F64 => quote!(f64),
            Ty::I32 => quote!(i32),
            Ty::I64 => quote!(i64),
            Ty::Json => quote!(serde_json::Value),
            Ty::RawJson => quote!(crate::model::raw_json::RawJson),
            Ty::JsonMap => quote!(serde_json::Map<String, serde_json::Value>),
            Ty::Vec(item) => {
                let item = item.tokens(outside_types);
                quote!(Vec<#item>)
            }
        }
    }
}

/// A query parameter or a property: its name in the document, its Rust field and type.
struct Field {
    name: String,
    ident: Ident,
    ty: Ty,
    required: bool,
    description: Option<String>,
}

/// A header (a parameter or a response header): its HTTP name and its Rust field.
struct Header {
    name: String,
    ident: Ident,
}

/// One documented answer that is a variant of the operation's response enum.
struct Response {
    status: &'static Status,
    body: Option<Ty>,
    headers: Vec<Header>,
}

struct Operation {
    id: String,
    /// `enqueue_job`: the trait method; `handle_enqueue_job` is its handler.
    fn_name: Ident,
    /// `EnqueueJob`: the prefix of its `…Query`, `…Headers` and `…Response` types.
    type_name: Ident,
    method: String,
    path: String,
    summary: String,
    read_only: bool,
    /// The `crate::core::Role` variant the operation needs.
    role: &'static str,
    path_params: Vec<Ident>,
    query: Vec<Field>,
    /// Optional string header parameters.
    headers: Vec<Header>,
    /// The body type and whether the body is required.
    body: Option<(Ty, bool)>,
    responses: Vec<Response>,
    /// The status of a successful answer that may also be `text/event-stream`.
    event_stream: Option<&'static Status>,
    /// `x-external: true`: served by its own router (its answer is not JSON); only the
    /// operation table names it.
    external: bool,
    /// Its row in `HTTP_OPERATIONS`, whose guard its route is wrapped in.
    index: usize,
}

pub fn generate(out_dir: &Path) -> BuildResult<()> {
    println!("cargo:rerun-if-changed={SPEC_PATH}");
    let spec: Value = serde_yaml::from_str(&std::fs::read_to_string(SPEC_PATH)?)?;

    let types = generate_types(&spec)?;
    let operations = collect_operations(&spec)?;
    let served = generate_operations(&operations);
    crate::write_rust(
        &out_dir.join("openapi.rs"),
        SPEC_PATH,
        quote!(#types #served),
    )?;
    crate::write_rust(
        &out_dir.join("http_operations.rs"),
        SPEC_PATH,
        generate_operation_table(&operations),
    )?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Reading the document

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

/// The last segment of a `$ref`: `#/components/schemas/Job` is `Job`.
fn ref_name(reference: &str) -> &str {
    reference.rsplit('/').next().unwrap_or(reference)
}

fn rust_type(schema: &Value) -> BuildResult<Ty> {
    if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
        return Ok(Ty::Schema(ident(ref_name(reference), Case::Pascal)?));
    }
    Ok(match schema.get("type").and_then(Value::as_str) {
        None if schema.get("x-raw-json") == Some(&Value::Bool(true)) => Ty::RawJson,
        None => Ty::Json,
        Some("string") => Ty::String,
        Some("boolean") => Ty::Bool,
        Some("number") => Ty::F64,
        Some("integer") => match schema.get("format").and_then(Value::as_str) {
            Some("int32") => Ty::I32,
            _ => Ty::I64,
        },
        Some("array") => {
            let items = schema.get("items").cloned().unwrap_or(Value::Null);
            Ty::Vec(Box::new(rust_type(&items)?))
        }
        Some("object") => {
            if schema.get("properties").is_some() {
                return Err("inline objects with properties are not supported; use a $ref".into());
            }
            Ty::JsonMap
        }
        Some(other) => return Err(format!("unsupported schema type {other}").into()),
    })
}

/// One `#[doc]` attribute per line of `text`, as `/// line` would write them.
fn doc(text: &str) -> TokenStream {
    let lines = text.trim().lines().map(|l| format!(" {}", l.trim_end()));
    quote!(#(#[doc = #lines])*)
}

/// `#[serde(rename = "…")]` when the Rust field is not spelled as the JSON name.
fn rename(field: &Field) -> TokenStream {
    let name = &field.name;
    if field.ident.to_string().trim_start_matches("r#") == name {
        quote!()
    } else {
        quote!(#[serde(rename = #name)])
    }
}

fn fields(schema: &Value) -> BuildResult<Vec<Field>> {
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
    properties
        .iter()
        .map(|(name, property)| {
            Ok(Field {
                name: name.clone(),
                ident: ident(name, Case::Snake)?,
                ty: rust_type(property)?,
                required: required.contains(&name.as_str()),
                description: property
                    .get("description")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            })
        })
        .collect()
}

fn generate_types(spec: &Value) -> BuildResult<TokenStream> {
    let schemas = spec
        .pointer("/components/schemas")
        .and_then(Value::as_object)
        .ok_or("components.schemas missing")?;
    if !schemas.contains_key(ERROR_ENVELOPE) {
        return Err(format!("components.schemas.{ERROR_ENVELOPE} missing").into());
    }
    let mut structs = Vec::new();
    let mut names = Vec::new();
    for (name, schema) in schemas {
        let type_name = ident(name, Case::Pascal)?;
        names.push((name.as_str(), type_name.clone()));
        let description = schema
            .get("description")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("The `{name}` schema."));
        let description = doc(&description);
        let fields = fields(schema)?;
        distinct(
            &format!("the properties of schema {name}"),
            fields.iter().map(|f| (f.name.as_str(), &f.ident)),
        )?;
        let fields = fields.iter().map(|field| {
            let docs = field.description.as_deref().map(doc).unwrap_or_default();
            let rename = rename(field);
            let ident = &field.ident;
            let ty = field.ty.tokens(false);
            if field.required {
                quote! { #docs #rename pub #ident: #ty, }
            } else if matches!(field.ty, Ty::Json) {
                // Any-JSON fields keep an explicit null (Some(Null)) apart from absence (None).
                quote! {
                    #docs
                    #rename
                    #[serde(default, deserialize_with = "crate::http::present", skip_serializing_if = "Option::is_none")]
                    pub #ident: Option<#ty>,
                }
            } else {
                quote! {
                    #docs
                    #rename
                    #[serde(default, skip_serializing_if = "Option::is_none")]
                    pub #ident: Option<#ty>,
                }
            }
        });
        let extra = if schema.get("additionalProperties") == Some(&Value::Bool(true)) {
            quote! {
                /// Fields the schema does not name, kept as they came.
                #[serde(flatten)]
                pub extra: serde_json::Map<String, serde_json::Value>,
            }
        } else {
            quote!()
        };
        // `additionalProperties: false`: a field the schema does not name is refused (400), not
        // dropped, where dropping it would widen what the request acts on.
        let closed = if schema.get("additionalProperties") == Some(&Value::Bool(false)) {
            quote! { #[serde(deny_unknown_fields)] }
        } else {
            quote!()
        };
        structs.push(quote! {
            #description
            #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
            #closed
            pub struct #type_name {
                #(#fields)*
                #extra
            }
        });
    }
    distinct(
        "the component schemas",
        names.iter().map(|(name, id)| (*name, id)),
    )?;
    Ok(quote! {
        /// Wire types generated from the OpenAPI component schemas.
        pub mod types {
            #![allow(clippy::all)]
            use serde::{Deserialize, Serialize};
            #(#structs)*
        }
    })
}

/// Follows a `$ref` to `#/components/responses/…`.
fn resolve_response<'a>(spec: &'a Value, response: &'a Value) -> BuildResult<&'a Value> {
    match response.get("$ref").and_then(Value::as_str) {
        None => Ok(response),
        Some(reference) => {
            let pointer = reference
                .strip_prefix('#')
                .ok_or_else(|| format!("response $ref {reference} is not in this document"))?;
            spec.pointer(pointer)
                .ok_or_else(|| format!("response $ref {reference} resolves to nothing").into())
        }
    }
}

/// What a documented status becomes.
enum Answer {
    /// A variant of the operation's response enum.
    Variant(&'static Status),
    /// An error answered through `crate::http::ApiError` in the error envelope.
    Error,
}

/// The rule for the statuses an operation documents: a success status (2xx) is a response
/// variant, and must be one of [`SUCCESS_STATUSES`]; an error status (4xx, 5xx) whose body is the
/// `ErrorEnvelope` is served by `ApiError`, one whose body is something else is a response variant
/// and must be one of [`OWN_BODY_ERROR_STATUSES`]; any other status fails the build.
fn answer(operation: &str, code: &str, body: Option<&Value>) -> BuildResult<Answer> {
    let fail = |why: String| -> Box<dyn std::error::Error> {
        format!("{operation}: documented status {code}: {why}").into()
    };
    let status: u16 = code
        .parse()
        .ok()
        .filter(|s| (100..=599).contains(s))
        .ok_or_else(|| {
            fail("only numeric statuses are supported (no `default`, no ranges)".into())
        })?;
    let known = |table: &'static [Status]| table.iter().find(|s| s.code == status);
    let error_envelope = body
        .and_then(|b| b.get("$ref"))
        .and_then(Value::as_str)
        .is_some_and(|r| r == format!("#/components/schemas/{ERROR_ENVELOPE}"));
    match status {
        200..=299 => known(SUCCESS_STATUSES).map(Answer::Variant).ok_or_else(|| {
            fail(format!(
                "no response variant for this success status; add it to SUCCESS_STATUSES in \
                 build/http.rs (and serve it) or remove it from {SPEC_PATH}"
            ))
        }),
        400..=599 if error_envelope => Ok(Answer::Error),
        400..=599 => match known(OWN_BODY_ERROR_STATUSES) {
            Some(s) if body.is_some() => Ok(Answer::Variant(s)),
            _ => Err(fail(format!(
                "an error status must answer the {ERROR_ENVELOPE} (it is served by \
                 crate::http::ApiError); only {:?} may carry a body of their own \
                 (OWN_BODY_ERROR_STATUSES in build/http.rs)",
                OWN_BODY_ERROR_STATUSES
                    .iter()
                    .map(|s| s.code)
                    .collect::<Vec<_>>()
            ))),
        },
        _ => Err(fail(
            "informational and redirection statuses are not generated; remove it".into(),
        )),
    }
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
                let schema = p.get("schema").unwrap_or(&Value::Null);
                let required = p.get("required") == Some(&Value::Bool(true));
                match p.get("in").and_then(Value::as_str) {
                    Some("path") => path_params.push(name.to_string()),
                    Some("query") => query.push(Field {
                        name: name.to_string(),
                        ident: ident(name, Case::Snake)?,
                        ty: rust_type(schema)?,
                        required,
                        description: None,
                    }),
                    Some("header") => {
                        if !matches!(rust_type(schema)?, Ty::String) || required {
                            return Err(
                                format!("{id}: header {name} must be an optional string").into()
                            );
                        }
                        headers.push(Header {
                            name: name.to_string(),
                            ident: ident(name, Case::Snake)?,
                        });
                    }
                    _ => return Err(format!("{id}: unsupported parameter {name}").into()),
                }
            }
            // The path's `{name}`s and the declared path parameters are the same names; they are
            // passed in the order they appear in the path.
            let mut in_path: Vec<&str> = path
                .split('{')
                .skip(1)
                .filter_map(|rest| rest.split_once('}').map(|(name, _)| name))
                .collect();
            in_path.sort_unstable();
            let mut declared: Vec<&str> = path_params.iter().map(String::as_str).collect();
            declared.sort_unstable();
            if in_path != declared {
                return Err(format!(
                    "{method} {path} ({id}): the path names {in_path:?} but declares the path \
                     parameters {declared:?}"
                )
                .into());
            }
            path_params.sort_by_key(|p| path.find(&format!("{{{p}}}")));
            let path_idents = path_params
                .iter()
                .map(|p| ident(p, Case::Snake))
                .collect::<BuildResult<Vec<_>>>()?;
            distinct(
                &format!("{id}: the path parameters"),
                path_params.iter().map(String::as_str).zip(&path_idents),
            )?;
            // A handler binds its path parameters beside the names `handler` gives its own.
            if let Some(p) = path_idents
                .iter()
                .find(|p| HANDLER_NAMES.contains(&p.to_string().as_str()))
            {
                return Err(format!(
                    "{method} {path} ({id}): the path parameter `{p}` is a name the generated \
                     handler binds itself ({HANDLER_NAMES:?}); rename it"
                )
                .into());
            }
            distinct(
                &format!("{id}: the query parameters"),
                query.iter().map(|q| (q.name.as_str(), &q.ident)),
            )?;
            distinct(
                &format!("{id}: the header parameters"),
                headers.iter().map(|h| (h.name.as_str(), &h.ident)),
            )?;
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
                .ok_or_else(|| format!("{id}: responses missing"))?
            {
                let response = resolve_response(spec, response)?;
                let schema = content_schema(response.get("content"));
                let status = match answer(&format!("{method} {path} ({id})"), code, schema)? {
                    Answer::Error => continue,
                    Answer::Variant(status) => status,
                };
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
                    .map(|h| {
                        h.keys()
                            .map(|name| {
                                Ok(Header {
                                    name: name.clone(),
                                    ident: ident(name, Case::Snake)?,
                                })
                            })
                            .collect::<BuildResult<Vec<_>>>()
                    })
                    .transpose()?
                    .unwrap_or_default();
                distinct(
                    &format!("{id}: the headers of status {code}"),
                    headers
                        .iter()
                        .map(|h| (h.name.as_str(), &h.ident))
                        .chain([("the body", &format_ident!("body"))]),
                )?;
                responses.push(Response {
                    status,
                    body: schema.map(rust_type).transpose()?,
                    headers,
                });
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
                fn_name: ident(id, Case::Snake)?,
                type_name: ident(id, Case::Pascal)?,
                method: method.to_uppercase(),
                path: path.clone(),
                summary: op
                    .get("summary")
                    .and_then(Value::as_str)
                    .unwrap_or(id)
                    .to_string(),
                read_only,
                role,
                path_params: path_idents,
                query,
                headers,
                body,
                responses,
                event_stream,
                external,
                index: operations.len(),
            });
        }
    }
    distinct(
        "the operationIds",
        operations.iter().map(|op| (op.id.as_str(), &op.fn_name)),
    )?;
    Ok(operations)
}

// ---------------------------------------------------------------------------------------------
// Writing the code

/// The HTTP operation table (`crate::contract::HTTP_OPERATIONS`), a file of its own so that the
/// middleware reads it without the HTTP adapter.
fn generate_operation_table(operations: &[Operation]) -> TokenStream {
    let rows = operations.iter().map(|op| {
        let (id, method, path, read_only) = (&op.id, &op.method, &op.path, op.read_only);
        let role = format_ident!("{}", op.role);
        quote! {
            HttpOperation { id: #id, method: #method, path: #path, read_only: #read_only, role: crate::core::Role::#role }
        }
    });
    quote! {
        /// Every HTTP operation of the OpenAPI document.
        pub const HTTP_OPERATIONS: &[HttpOperation] = &[#(#rows),*];
    }
}

/// The `…Query` struct of an operation with query parameters.
fn query_struct(op: &Operation) -> TokenStream {
    if op.query.is_empty() {
        return quote!();
    }
    let name = format_ident!("{}Query", op.type_name);
    let docs = doc(&format!("Query parameters of `{}`.", op.id));
    let fields = op.query.iter().map(|p| {
        let (ident, ty, rename) = (&p.ident, p.ty.tokens(true), rename(p));
        if p.required {
            quote! { #rename pub #ident: #ty, }
        } else {
            quote! { #rename #[serde(default)] pub #ident: Option<#ty>, }
        }
    });
    quote! {
        #docs
        #[derive(Debug, Clone, Default, serde::Deserialize)]
        pub struct #name { #(#fields)* }
    }
}

/// The `…Headers` struct of an operation with header parameters.
fn headers_struct(op: &Operation) -> TokenStream {
    if op.headers.is_empty() {
        return quote!();
    }
    let name = format_ident!("{}Headers", op.type_name);
    let docs = doc(&format!("Header parameters of `{}`.", op.id));
    let fields = op.headers.iter().map(|h| {
        let field_doc = doc(&format!("`{}`.", h.name));
        let ident = &h.ident;
        quote! { #field_doc pub #ident: Option<String>, }
    });
    quote! {
        #docs
        #[derive(Debug, Clone, Default)]
        pub struct #name { #(#fields)* }
    }
}

/// The `…Response` enum of an operation and its `IntoResponse`.
fn response_enum(op: &Operation) -> TokenStream {
    let name = format_ident!("{}Response", op.type_name);
    let docs = doc(&format!("Successful answers of `{}`.", op.id));
    let mut variants = Vec::new();
    let mut arms = Vec::new();
    for response in &op.responses {
        let variant = format_ident!("{}", response.status.variant);
        let constant = format_ident!("{}", response.status.constant);
        let status = quote!(http::StatusCode::#constant);
        match (&response.body, response.headers.is_empty()) {
            (None, _) => {
                variants.push(quote!(#variant));
                arms.push(quote! {
                    Self::#variant => axum::response::IntoResponse::into_response(#status),
                });
            }
            (Some(ty), true) => {
                let ty = ty.tokens(true);
                variants.push(quote!(#variant(#ty)));
                arms.push(quote! {
                    Self::#variant(body) => crate::http::ojs_json(#status, &body),
                });
            }
            (Some(ty), false) => {
                let ty = ty.tokens(true);
                let fields: Vec<&Ident> = response.headers.iter().map(|h| &h.ident).collect();
                variants.push(quote!(#variant { body: #ty, #(#fields: String),* }));
                let inserts = response.headers.iter().map(|h| {
                    let (field, header) = (&h.ident, h.name.to_ascii_lowercase());
                    quote! {
                        if let Ok(value) = http::HeaderValue::from_str(&#field) {
                            response.headers_mut().insert(#header, value);
                        }
                    }
                });
                arms.push(quote! {
                    Self::#variant { body, #(#fields),* } => {
                        let mut response = crate::http::ojs_json(#status, &body);
                        #(#inserts)*
                        response
                    }
                });
            }
        }
    }
    if let Some(status) = op.event_stream {
        let variant = format_ident!("{}EventStream", status.variant);
        let variant_doc = doc(&format!(
            "The `{EVENT_STREAM}` form of the {} answer.",
            status.code
        ));
        variants.push(quote!(#variant_doc #variant(crate::http::EventStream)));
        arms.push(quote! {
            Self::#variant(stream) => axum::response::IntoResponse::into_response(stream),
        });
    }
    quote! {
        #docs
        #[derive(Debug)]
        pub enum #name { #(#variants),* }

        impl axum::response::IntoResponse for #name {
            fn into_response(self) -> axum::response::Response {
                match self { #(#arms)* }
            }
        }
    }
}

/// The `HttpApi` method of an operation.
fn trait_method(op: &Operation) -> TokenStream {
    let docs = doc(&op.summary);
    let fn_name = &op.fn_name;
    let mut params = vec![quote!(ctx: crate::http::RequestContext)];
    params.extend(op.path_params.iter().map(|p| quote!(#p: String)));
    if !op.query.is_empty() {
        let ty = format_ident!("{}Query", op.type_name);
        params.push(quote!(query: #ty));
    }
    if !op.headers.is_empty() {
        let ty = format_ident!("{}Headers", op.type_name);
        params.push(quote!(headers: #ty));
    }
    if op.event_stream.is_some() {
        // Whether the client's Accept asks for the text/event-stream answer.
        params.push(quote!(event_stream: bool));
    }
    if let Some((ty, required)) = &op.body {
        let ty = ty.tokens(true);
        params.push(if *required {
            quote!(body: #ty)
        } else {
            quote!(body: Option<#ty>)
        });
    }
    let response = format_ident!("{}Response", op.type_name);
    quote! {
        #docs
        fn #fn_name(&self, #(#params),*)
            -> impl std::future::Future<Output = Result<#response, crate::http::ApiError>> + Send;
    }
}

/// The names a handler binds besides the path parameters (see `handler`).
const HANDLER_NAMES: [&str; 8] = [
    "api",
    "ctx",
    "header_map",
    "query",
    "headers",
    "event_stream",
    "body",
    "result",
];

/// The axum handler of an operation: extracts its inputs and calls the `HttpApi` method.
fn handler(op: &Operation) -> TokenStream {
    let handler = format_ident!("handle_{}", op.fn_name);
    let fn_name = &op.fn_name;
    let mut params = vec![
        quote!(axum::extract::State(api): axum::extract::State<std::sync::Arc<A>>),
        quote!(ctx: crate::http::RequestContext),
    ];
    let mut args = vec![quote!(ctx.clone())];
    if !op.path_params.is_empty() {
        let names = &op.path_params;
        let types = names.iter().map(|_| quote!(String));
        params.push(quote! {
            crate::http::OjsPath((#(#names,)*)): crate::http::OjsPath<(#(#types,)*)>
        });
        args.extend(names.iter().map(|p| quote!(#p)));
    }
    if !op.headers.is_empty() || op.event_stream.is_some() {
        params.push(quote!(header_map: http::HeaderMap));
    }
    if !op.query.is_empty() {
        let ty = format_ident!("{}Query", op.type_name);
        params.push(quote!(crate::http::OjsQuery(query): crate::http::OjsQuery<#ty>));
        args.push(quote!(query));
    }
    let mut prelude = Vec::new();
    if !op.headers.is_empty() {
        let ty = format_ident!("{}Headers", op.type_name);
        let fields = op.headers.iter().map(|h| {
            let (ident, name) = (&h.ident, &h.name);
            quote! {
                #ident: match crate::http::header_param(&header_map, #name) {
                    Ok(v) => v,
                    Err(e) => return axum::response::IntoResponse::into_response(e.with_request_id(&ctx.request_id)),
                },
            }
        });
        prelude.push(quote! { let headers = #ty { #(#fields)* }; });
        args.push(quote!(headers));
    }
    if op.event_stream.is_some() {
        prelude.push(quote! {
            let event_stream = crate::http::accepts_event_stream(&header_map);
        });
        args.push(quote!(event_stream));
    }
    if let Some((ty, required)) = &op.body {
        let ty = ty.tokens(true);
        params.push(if *required {
            quote!(crate::http::OjsJson(body): crate::http::OjsJson<#ty>)
        } else {
            quote!(crate::http::OptionalOjsJson(body): crate::http::OptionalOjsJson<#ty>)
        });
        args.push(quote!(body));
    }
    quote! {
        async fn #handler<A: HttpApi>(#(#params),*) -> axum::response::Response {
            #(#prelude)*
            let result = api.#fn_name(#(#args),*).await;
            crate::http::respond(&ctx, result)
        }
    }
}

/// The router: one route per path, merging its methods, each handler wrapped in the guard of
/// its own row of `HTTP_OPERATIONS`: the operation a request is authorized as is the one the
/// router serves it with. Unmatched methods reach the router's 405 answer, no guard.
fn router(operations: &[&Operation]) -> TokenStream {
    let mut by_path: BTreeMap<&str, Vec<&Operation>> = BTreeMap::new();
    for op in operations {
        by_path.entry(op.path.as_str()).or_default().push(*op);
    }
    let routes = by_path.iter().map(|(path, ops)| {
        let mut methods = ops.iter().map(|op| {
            let method = format_ident!("{}", op.method.to_ascii_lowercase());
            let handler = format_ident!("handle_{}", op.fn_name);
            let index = op.index;
            quote! {
                axum::routing::#method(#handler::<A>).route_layer(guard(
                    crate::middleware::Operation::http(&crate::contract::HTTP_OPERATIONS[#index]),
                ))
            }
        });
        let first = methods.next();
        quote!(.route(#path, #first #(.merge(#methods))*))
    });
    quote! {
        /// The axum router calling `api` for every OpenAPI operation, each behind the `Guard`
        /// `guard` makes for it.
        pub fn router<A: HttpApi>(
            api: std::sync::Arc<A>,
            guard: impl Fn(crate::middleware::Operation) -> crate::middleware::Guard,
        ) -> axum::Router {
            axum::Router::new()
                #(#routes)*
                .with_state(api)
        }
    }
}

/// Everything of `openapi.rs` after the types, for the operations this module serves (not the
/// `x-external` ones).
fn generate_operations(operations: &[Operation]) -> TokenStream {
    let served: Vec<&Operation> = operations.iter().filter(|op| !op.external).collect();
    let inputs_and_answers = served.iter().map(|op| {
        let (query, headers, response) = (query_struct(op), headers_struct(op), response_enum(op));
        quote!(#query #headers #response)
    });
    let methods = served.iter().map(|op| trait_method(op));
    let handlers = served.iter().map(|op| handler(op));
    let router = router(&served);
    quote! {
        #(#inputs_and_answers)*

        /// The HTTP binding as one async method per OpenAPI operation.
        pub trait HttpApi: Send + Sync + 'static {
            #(#methods)*
        }

        #(#handlers)*

        #router
    }
}
