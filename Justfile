# pgvs3 developer commands. `just --list` shows them.

# Serve on 127.0.0.1:8080 with a private PostgreSQL under ./.pgvs3 (or DATABASE_URL).
serve:
    cargo run --release -- serve

# The whole test suite (real PostgreSQL; private cluster unless DATABASE_URL is set).
test:
    cargo test

# OJS conformance cases of the given levels, e.g. `just conformance 0,1`; the suite is
# OJS_CONFORMANCE_DIR (here a run without it would only print SKIPPED, so it is an error).
conformance levels="0":
    @: "${OJS_CONFORMANCE_DIR:?set OJS_CONFORMANCE_DIR to the suite (…/ojs-conformance)}"
    OJS_LEVELS={{levels}} cargo test --test api conformance:: -- --nocapture

# Format and lint as CI does.
lint:
    cargo fmt --all -- --check
    cargo clippy --all-targets --all-features -- -D warnings

# The jobs/outboxes/streams guide's recipes, run and checked against a private pgvs3 (guides/).
guides:
    bash guides/run.sh

# Benchmark against a plain-SQL floor (private PostgreSQL unless DATABASE_URL); e.g. `just bench --scenario jobs`.
bench *args:
    cargo run --release --features bench --bin pgvs3-bench -- {{args}}

# What CI runs.
ci:
    bash .ci/run
