//! Tokens made with the CLI, as an operator makes them.

use std::process::Command;

/// Runs `pgvs3 token ...` against `database_url`; its stdout.
pub fn cli(database_url: &str, args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_pgvs3"))
        .arg("token")
        .args(args)
        .args(["--database-url", database_url])
        .env("NO_COLOR", "1")
        .output()
        .expect("run pgvs3 token");
    assert!(
        output.status.success(),
        "pgvs3 token {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8")
}

/// Creates a token with the CLI; the token printed on stdout.
pub fn create_token(
    database_url: &str,
    name: &str,
    roles: &[&str],
    queues: Option<&str>,
) -> String {
    let mut args = vec!["create", "--name", name];
    for role in roles {
        args.extend(["--role", role]);
    }
    if let Some(queues) = queues {
        args.extend(["--queues", queues]);
    }
    let out = cli(database_url, &args);
    let token = out.trim().to_string();
    assert!(
        token.starts_with("pgvs3_") && !token.contains('\n'),
        "{out}"
    );
    token
}
