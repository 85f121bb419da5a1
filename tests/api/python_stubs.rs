//! A service written in another language: Python stubs generated from `proto/` with grpcio-tools
//! enqueue, fetch and ack a job against a real pgvs3; the test then reads the job over HTTP.
//!
//! Needs `python3`. When `grpc_tools` and `grpc` cannot be imported, a venv is created at
//! `target/pyenv-grpc` and `grpcio-tools` is installed into it from PyPI. Every failure fails the test.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

/// The Python client: one line of JSON with what it observed.
const CLIENT: &str = r#"
import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grpc
from google.protobuf import json_format, struct_pb2
from ojs.v1 import job_pb2, service_pb2_grpc, worker_pb2

def as_dict(message):
    return json.loads(json_format.MessageToJson(message, preserving_proto_field_name=True))

args = json.loads(os.environ["PGVS3_JOB_ARGS"])
result = json.loads(os.environ["PGVS3_JOB_RESULT"])
with grpc.insecure_channel(os.environ["PGVS3_GRPC_ADDR"]) as channel:
    stub = service_pb2_grpc.OJSServiceStub(channel)
    values = struct_pb2.ListValue()
    values.extend(args)
    request = job_pb2.EnqueueRequest(type="py.stub", options=job_pb2.EnqueueOptions(queue="py-stubs"))
    request.args.extend(values.values)
    enqueued = stub.Enqueue(request, timeout=10).job
    fetched = stub.Fetch(worker_pb2.FetchRequest(queues=["py-stubs"], count=1, worker_id="py-1"), timeout=10).jobs
    ack_result = struct_pb2.Struct()
    ack_result.update(result)
    token = fetched[0].lease_token if fetched else ""
    ack = stub.Ack(worker_pb2.AckRequest(job_id=enqueued.id, lease_token=token, result=ack_result), timeout=10)
print(json.dumps({"enqueued": as_dict(enqueued), "fetched": [as_dict(j) for j in fetched], "ack": as_dict(ack)}))
"#;

/// Runs a command; on failure panics with its stderr and stdout. Returns stdout.
fn run(command: &mut Command, what: &str) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: could not run {command:?}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{what} failed ({}): {command:?}\n--- stderr ---\n{stderr}\n--- stdout ---\n{stdout}",
        output.status
    );
    stdout
}

fn can_import_grpc(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", "import grpc_tools, grpc"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A Python interpreter with `grpc_tools` and `grpc`, installing them into a venv if needed.
fn python_with_grpc() -> PathBuf {
    let system = PathBuf::from("python3");
    if can_import_grpc(&system) {
        return system;
    }
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .to_path_buf();
    let venv = target.join("pyenv-grpc");
    let python = venv.join("bin").join("python");
    if python.exists() && can_import_grpc(&python) {
        return python;
    }
    run(
        Command::new("python3").arg("-m").arg("venv").arg(&venv),
        "python3 -m venv",
    );
    run(
        Command::new(&python).args([
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--quiet",
            "grpcio-tools",
        ]),
        "pip install grpcio-tools",
    );
    assert!(
        can_import_grpc(&python),
        "grpc_tools/grpc still not importable with {}",
        python.display()
    );
    python
}

/// Protobuf JSON renders every number as a double (`42.0`): integral ones back to integers.
fn integral(value: Value) -> Value {
    match value {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => json!(f as i64),
            _ => Value::Number(n),
        },
        Value::Array(items) => Value::Array(items.into_iter().map(integral).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, integral(v))).collect())
        }
        other => other,
    }
}

fn proto_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            proto_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
}

/// Generates the Python stubs for every .proto under `proto/` into `out`.
fn generate_stubs(python: &Path, out: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    proto_files(&root.join("proto"), &mut files);
    files.sort();
    assert!(!files.is_empty(), "no .proto files under proto/");
    let mut command = Command::new(python);
    command
        .current_dir(root)
        .args(["-m", "grpc_tools.protoc", "-I", "proto"])
        .arg(format!("--python_out={}", out.display()))
        .arg(format!("--grpc_python_out={}", out.display()));
    for file in &files {
        command.arg(file.strip_prefix(root).expect("a file under the crate"));
    }
    run(&mut command, "grpc_tools.protoc");
    assert!(
        out.join("ojs/v1/service_pb2_grpc.py").exists(),
        "protoc produced no ojs/v1/service_pb2_grpc.py in {}",
        out.display()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_stubs_drive_a_job_through_grpc() {
    let python = tokio::task::spawn_blocking(python_with_grpc)
        .await
        .expect("find python");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "python-stubs-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).expect("create the stub directory");
    {
        let (python, dir) = (python.clone(), dir.clone());
        tokio::task::spawn_blocking(move || generate_stubs(&python, &dir))
            .await
            .expect("generate stubs");
    }
    let script = dir.join("client.py");
    std::fs::write(&script, CLIENT).expect("write the client script");

    let app = common::spawn_app().await;
    let address = app
        .grpc_url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let args = json!(["hello from python", 42, {"nested": [true, null, "x"]}, 2.5]);
    let result = json!({"processed": 3, "by": "python", "ok": true, "items": ["a", "b"]});
    let stdout = {
        let (python, script) = (python.clone(), script.clone());
        let (args, result) = (args.to_string(), result.to_string());
        tokio::task::spawn_blocking(move || {
            run(
                Command::new(&python)
                    .arg(&script)
                    .env("PGVS3_GRPC_ADDR", address)
                    .env("PGVS3_JOB_ARGS", args)
                    .env("PGVS3_JOB_RESULT", result)
                    .env("PYTHONDONTWRITEBYTECODE", "1"),
                "python client",
            )
        })
        .await
        .expect("run the python client")
    };
    let line = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_else(|| panic!("the python client printed nothing"));
    let seen: Value = serde_json::from_str(line)
        .map(integral)
        .unwrap_or_else(|e| panic!("the python client printed no JSON ({e}): {stdout}"));

    let enqueued = &seen["enqueued"];
    let id = enqueued["id"]
        .as_str()
        .expect("enqueued job id")
        .to_string();
    assert_eq!(enqueued["state"], json!("JOB_STATE_AVAILABLE"), "{seen}");
    assert_eq!(enqueued["queue"], json!("py-stubs"), "{seen}");
    assert_eq!(enqueued["args"], args, "{seen}");
    let fetched = seen["fetched"].as_array().expect("fetched jobs");
    assert_eq!(fetched.len(), 1, "{seen}");
    assert_eq!(fetched[0]["id"], json!(id), "{seen}");
    assert_eq!(fetched[0]["state"], json!("JOB_STATE_ACTIVE"), "{seen}");
    assert!(
        fetched[0]["lease_token"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "the fetched job has no lease_token (field 1001): {seen}"
    );
    assert_eq!(seen["ack"]["acknowledged"], json!(true), "{seen}");

    // The test itself reads the job over HTTP.
    let response = reqwest::Client::new()
        .get(format!("{}/ojs/v1/jobs/{id}", app.http_url))
        .send()
        .await
        .expect("GET the job");
    assert_eq!(response.status().as_u16(), 200);
    let body: Value = serde_json::from_str(&response.text().await.expect("body")).expect("JSON");
    let job = &body["job"];
    assert_eq!(job["state"], json!("completed"), "{body}");
    assert_eq!(job["result"], result, "{body}");
    assert_eq!(job["args"], args, "{body}");
    assert_eq!(job["type"], json!("py.stub"), "{body}");
    assert_eq!(job["queue"], json!("py-stubs"), "{body}");

    let _ = std::fs::remove_dir_all(&dir);
}
