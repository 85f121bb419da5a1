//! Generated boundary checks over gRPC, the counterpart of the schemathesis stage for HTTP: every
//! RPC of the served protos gets messages built from its descriptor with extreme numbers (the
//! type's largest and smallest values, -1, 0), extreme and hostile strings (NUL characters,
//! durations and times past every bound, 100,000 characters, valid-looking names and ids), unknown
//! enum values, nested messages (timestamps, durations, structs) filled the same way, and repeated
//! fields with several elements. No answer may be a server error: INTERNAL, UNKNOWN, DATA_LOSS or
//! a broken call (a panic drops the stream) fails the test; refusals (INVALID_ARGUMENT and the
//! like), not-found and successes are all fine.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::raw::Raw;
use prost::Message;
use prost::bytes::BufMut;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};
use tonic::Code;

/// Any answer; its content does not matter here.
#[derive(Clone, PartialEq, Message)]
struct Ignored {}

/// One way of filling every field.
#[derive(Clone, Copy)]
struct Variant {
    int: i64,
    text: &'static str,
    float: f64,
    enum_value: i32,
}

const LONG: &str = "long";

const VARIANTS: &[Variant] = &[
    Variant {
        int: i64::MAX,
        text: "q1",
        float: f64::MAX,
        enum_value: 1,
    },
    Variant {
        int: i64::MIN,
        text: "q1",
        float: f64::MIN,
        enum_value: 999,
    },
    Variant {
        int: -1,
        text: "a\u{0}b",
        float: f64::NAN,
        enum_value: -1,
    },
    Variant {
        int: 0,
        text: "+P100000000D",
        float: f64::INFINITY,
        enum_value: 0,
    },
    Variant {
        int: i32::MAX as i64,
        text: "20000000d",
        float: -0.0,
        enum_value: 2,
    },
    Variant {
        int: 1,
        text: "01a2337f-d78e-7113-8add-ade6264bb5e9",
        float: 1e-300,
        enum_value: 3,
    },
    Variant {
        int: 9_000_000_000_000_000_000,
        text: "9999-12-31T23:59:59Z",
        float: 0.5,
        enum_value: 4,
    },
    Variant {
        int: 2,
        text: LONG,
        float: 1.0,
        enum_value: 5,
    },
];

fn key(buf: &mut Vec<u8>, number: i32, wire_type: u32) {
    prost::encoding::encode_varint((u64::from(number as u32) << 3) | u64::from(wire_type), buf);
}

/// Encodes one message of `type_name` filled as `variant` says, `depth` levels deep at most.
fn encode(
    types: &HashMap<String, DescriptorProto>,
    type_name: &str,
    variant: Variant,
    depth: usize,
) -> Vec<u8> {
    let mut buf = Vec::new();
    let Some(message) = types.get(type_name) else {
        return buf;
    };
    for field in &message.field {
        let number = field.number();
        let repeats = if field.label() == Label::Repeated {
            3
        } else {
            1
        };
        for _ in 0..repeats {
            match field.r#type() {
                Type::Int64 | Type::Uint64 | Type::Int32 | Type::Uint32 => {
                    let value = match field.r#type() {
                        Type::Int32 | Type::Uint32 => i64::from(
                            variant.int.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32,
                        ),
                        _ => variant.int,
                    };
                    key(&mut buf, number, 0);
                    prost::encoding::encode_varint(value as u64, &mut buf);
                }
                Type::Sint64 | Type::Sint32 => {
                    key(&mut buf, number, 0);
                    let v = variant.int;
                    prost::encoding::encode_varint(((v << 1) ^ (v >> 63)) as u64, &mut buf);
                }
                Type::Fixed64 | Type::Sfixed64 => {
                    key(&mut buf, number, 1);
                    buf.put_i64_le(variant.int);
                }
                Type::Fixed32 | Type::Sfixed32 => {
                    key(&mut buf, number, 5);
                    buf.put_i32_le(variant.int as i32);
                }
                Type::Double => {
                    key(&mut buf, number, 1);
                    buf.put_f64_le(variant.float);
                }
                Type::Float => {
                    key(&mut buf, number, 5);
                    buf.put_f32_le(variant.float as f32);
                }
                Type::Bool => {
                    key(&mut buf, number, 0);
                    prost::encoding::encode_varint(1, &mut buf);
                }
                Type::Enum => {
                    key(&mut buf, number, 0);
                    prost::encoding::encode_varint(i64::from(variant.enum_value) as u64, &mut buf);
                }
                Type::String | Type::Bytes => {
                    let text = if variant.text == LONG {
                        "x".repeat(100_000)
                    } else {
                        variant.text.to_string()
                    };
                    key(&mut buf, number, 2);
                    prost::encoding::encode_varint(text.len() as u64, &mut buf);
                    buf.put_slice(text.as_bytes());
                }
                Type::Message if depth > 0 => {
                    let inner = encode(types, field.type_name(), variant, depth - 1);
                    key(&mut buf, number, 2);
                    prost::encoding::encode_varint(inner.len() as u64, &mut buf);
                    buf.put_slice(&inner);
                }
                Type::Message | Type::Group => {}
            }
        }
    }
    buf
}

/// Every message type of the descriptor set by its full name (`.package.Message`).
fn message_types(set: &FileDescriptorSet) -> HashMap<String, DescriptorProto> {
    fn add(prefix: &str, message: &DescriptorProto, out: &mut HashMap<String, DescriptorProto>) {
        let name = format!("{prefix}.{}", message.name());
        for nested in &message.nested_type {
            add(&name, nested, out);
        }
        out.insert(name, message.clone());
    }
    let mut out = HashMap::new();
    for file in &set.file {
        let prefix = if file.package().is_empty() {
            String::new()
        } else {
            format!(".{}", file.package())
        };
        for message in &file.message_type {
            add(&prefix, message, &mut out);
        }
    }
    out
}

/// The well-known types the protos use, described by hand (they are not in our descriptor set).
fn well_known(types: &mut HashMap<String, DescriptorProto>) {
    use prost_types::FieldDescriptorProto as Field;
    let field =
        |name: &str, number: i32, ty: Type, type_name: Option<&str>, repeated: bool| Field {
            name: Some(name.into()),
            number: Some(number),
            r#type: Some(ty as i32),
            type_name: type_name.map(str::to_string),
            label: Some(if repeated {
                Label::Repeated
            } else {
                Label::Optional
            } as i32),
            ..Default::default()
        };
    let message = |name: &str, fields: Vec<Field>| DescriptorProto {
        name: Some(name.into()),
        field: fields,
        ..Default::default()
    };
    for name in ["Timestamp", "Duration"] {
        types.insert(
            format!(".google.protobuf.{name}"),
            message(
                name,
                vec![
                    field("seconds", 1, Type::Int64, None, false),
                    field("nanos", 2, Type::Int32, None, false),
                ],
            ),
        );
    }
    types.insert(
        ".google.protobuf.Struct".into(),
        message(
            "Struct",
            vec![field(
                "fields",
                1,
                Type::Message,
                Some(".google.protobuf.Struct.FieldsEntry"),
                true,
            )],
        ),
    );
    types.insert(
        ".google.protobuf.Struct.FieldsEntry".into(),
        message(
            "FieldsEntry",
            vec![
                field("key", 1, Type::String, None, false),
                field(
                    "value",
                    2,
                    Type::Message,
                    Some(".google.protobuf.Value"),
                    false,
                ),
            ],
        ),
    );
    types.insert(
        ".google.protobuf.Value".into(),
        message(
            "Value",
            vec![
                field("number_value", 2, Type::Double, None, false),
                field("string_value", 3, Type::String, None, false),
                field(
                    "struct_value",
                    5,
                    Type::Message,
                    Some(".google.protobuf.Struct"),
                    false,
                ),
            ],
        ),
    );
    types.insert(
        ".google.protobuf.ListValue".into(),
        message(
            "ListValue",
            vec![field(
                "values",
                1,
                Type::Message,
                Some(".google.protobuf.Value"),
                true,
            )],
        ),
    );
}

/// Codes that mean the server failed rather than refused. A call the server dropped (a panic in
/// its handler) reaches the client as CANCELLED.
fn is_server_error(code: Code) -> bool {
    matches!(
        code,
        Code::Internal | Code::Unknown | Code::DataLoss | Code::Unavailable | Code::Cancelled
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_survives_extreme_messages() {
    let app = common::spawn_app().await;
    let set = FileDescriptorSet::decode(pgvs3::grpc::FILE_DESCRIPTOR_SET).expect("descriptor set");
    let mut types = message_types(&set);
    well_known(&mut types);
    let endpoint = tonic::transport::Channel::from_shared(app.grpc_url.clone()).expect("url");
    let mut calls = 0;
    let mut failures = Vec::new();
    let mut codes: std::collections::BTreeMap<String, usize> = Default::default();
    for file in &set.file {
        for service in &file.service {
            let service_name = format!("{}.{}", file.package(), service.name());
            for method in &service.method {
                let path = format!("/{service_name}/{}", method.name());
                for (n, variant) in VARIANTS.iter().enumerate() {
                    let body = encode(&types, method.input_type(), *variant, 3);
                    // A connection of its own: after a message over the size limit is refused
                    // while it is still being sent, its connection closes, and the next call on
                    // it would fail for that reason rather than its own.
                    let channel = endpoint.connect().await.expect("connect gRPC");
                    let mut grpc = tonic::client::Grpc::new(channel);
                    grpc.ready().await.expect("channel ready");
                    let route = http::uri::PathAndQuery::try_from(path.as_str()).expect("path");
                    let codec = tonic_prost::ProstCodec::<Raw, Ignored>::default();
                    let request = tonic::Request::new(Raw(body));
                    calls += 1;
                    let outcome = if method.server_streaming() {
                        let call = async {
                            let mut stream = grpc
                                .server_streaming(request, route, codec)
                                .await?
                                .into_inner();
                            stream.message().await.map(|_| ())
                        };
                        // A stream that is still open after a second has not failed.
                        tokio::time::timeout(Duration::from_secs(1), call)
                            .await
                            .unwrap_or(Ok(()))
                    } else {
                        grpc.unary(request, route, codec).await.map(|_| ())
                    };
                    let code = outcome.as_ref().err().map_or(Code::Ok, |s| s.code());
                    *codes.entry(format!("{code:?}")).or_insert(0) += 1;
                    if let Err(status) = outcome
                        && is_server_error(status.code())
                    {
                        failures.push(format!("{path} variant {n}: {status:?}"));
                    }
                }
            }
        }
    }
    assert!(
        calls > 100,
        "only {calls} calls: the descriptor set lists too few RPCs"
    );
    // Some calls must get through validation, or the extremes never reach the database.
    assert!(
        codes.get("Ok").copied().unwrap_or(0) > 20,
        "answers: {codes:?}"
    );
    eprintln!("answers by code: {codes:?}");
    assert!(
        failures.is_empty(),
        "{} of {calls} calls failed on the server side:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
