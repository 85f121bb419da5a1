#!/usr/bin/env bash
# Property-based API test: schemathesis drives openapi/pgvs3.yaml with generated inputs against a
# real pgvs3 (debug build) and fails on any 5xx, any status the spec does not document for the
# operation, and any response whose content type or body does not match the documented one.
#
# The server uses DATABASE_URL when set, else a private PostgreSQL cluster under
# target/schemathesis-pg (started by pgvs3 itself, stopped when it exits).
#
# Knobs (environment): SCHEMATHESIS_SEED (default 42), SCHEMATHESIS_MAX_EXAMPLES (test cases per
# operation, default 100), SCHEMATHESIS_WORKERS (default 1: with one worker and a fresh cluster a
# run is reproducible from its seed; more workers interleave requests differently every run).
set -euo pipefail
cd "$(dirname "$0")/.."

SCHEMATHESIS_VERSION=4.32.5
SEED=${SCHEMATHESIS_SEED:-42}
MAX_EXAMPLES=${SCHEMATHESIS_MAX_EXAMPLES:-100}
WORKERS=${SCHEMATHESIS_WORKERS:-1}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
VENV=target/pyenv-schemathesis
DATA_DIR=target/schemathesis-pg
SERVER_LOG=target/schemathesis-server.log
REPORT_DIR=target/schemathesis-report
CONFIG=target/schemathesis.toml

log() { echo "schemathesis.sh: $*"; }

# --- schemathesis, pinned, in its own venv ---------------------------------------------------
if [[ ! -x "$VENV/bin/schemathesis" ]] ||
    [[ "$("$VENV/bin/schemathesis" --version 2>/dev/null)" != *"$SCHEMATHESIS_VERSION"* ]]; then
    log "installing schemathesis $SCHEMATHESIS_VERSION into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
fi
PY="$VENV/bin/python"

# --- the server ------------------------------------------------------------------------------
log "cargo build"
cargo build
BIN="$TARGET_DIR/debug/pgvs3"

# A fresh private cluster each run keeps runs comparable. A cluster still running there (its
# postmaster.pid left behind by a killed run) is reused rather than pulled out from under itself.
if [[ -z "${DATABASE_URL:-}" && ! -e "$DATA_DIR/pgdata/postmaster.pid" ]]; then
    rm -rf "$DATA_DIR"
fi
mkdir -p "$DATA_DIR" "$REPORT_DIR"

PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL="http://127.0.0.1:$PORT"

SERVER_PID=""
ST_PID=""
stop_server() {
    if [[ -n "$ST_PID" ]] && kill -0 "$ST_PID" 2>/dev/null; then
        kill -TERM "$ST_PID" 2>/dev/null || true
        wait "$ST_PID" 2>/dev/null || true
    fi
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        log "stopping pgvs3 (pid $SERVER_PID)"
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        # pgvs3 finishes in-flight requests (bounded by --shutdown-timeout-secs) and stops its
        # private cluster; give it a generous bound before forcing it.
        for _ in $(seq 600); do
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$SERVER_PID" 2>/dev/null; then
            log "pgvs3 did not exit after SIGTERM; killing it"
            kill -KILL "$SERVER_PID" 2>/dev/null || true
        fi
    fi
    if [[ -n "$SERVER_PID" ]]; then
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
    fi
}
trap stop_server EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log "starting pgvs3 on $URL (log: $SERVER_LOG)"
NO_COLOR=1 "$BIN" serve --listen "127.0.0.1:$PORT" --data-dir "$DATA_DIR" >"$SERVER_LOG" 2>&1 &
SERVER_PID=$!

# Wait for GET /ojs/v1/health to answer 200 (initdb on first use takes a few seconds).
ready=""
for _ in $(seq 240); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        break
    fi
    if "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
        "$URL/ojs/v1/health" 2>/dev/null; then
        ready=1
        break
    fi
    sleep 0.5
done
if [[ -z "$ready" ]]; then
    log "pgvs3 did not become healthy; its log:"
    tail -n 50 "$SERVER_LOG" || true
    exit 1
fi
log "pgvs3 is healthy"

# --- schemathesis ----------------------------------------------------------------------------
# Its crash cache (./.schemathesis/, replayed at the start of the next run) is off: every run
# starts from the seed alone and leaves nothing in the work tree.
cat >"$CONFIG" <<'TOML'
[cache]
enabled = false
TOML
# Phases: coverage (boundary and invalid values per schema: the minimum/maximum of every bounded
# number in openapi/pgvs3.yaml, and one past each), fuzzing (random positive and negative inputs,
# strings with NUL characters included) and stateful (chains through inferred links, e.g.
# enqueue -> get/cancel).
# The examples phase has nothing to run (the spec carries no examples).
# It runs in the background and is waited for, so that SIGINT/SIGTERM reach the traps at once.
# Hypothesis keeps its caches (unicode tables, constants) under target/ instead of ./.hypothesis.
rc=0
HYPOTHESIS_STORAGE_DIRECTORY=target/schemathesis-hypothesis "$VENV/bin/schemathesis" --config-file "$CONFIG" run openapi/pgvs3.yaml \
    --url "$URL" \
    --seed "$SEED" \
    --max-examples "$MAX_EXAMPLES" \
    --workers "$WORKERS" \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
    --continue-on-failure \
    --generation-database none \
    --generation-allow-x00 true \
    --request-timeout 30 \
    --report junit \
    --report-junit-path "$REPORT_DIR/junit.xml" \
    --no-color &
ST_PID=$!
wait "$ST_PID" || rc=$?
ST_PID=""

if [[ $rc -ne 0 ]]; then
    log "schemathesis failed (exit $rc); server-side errors from $SERVER_LOG:"
    grep -E ' (ERROR|WARN) ' "$SERVER_LOG" | grep -v 'tower_http::trace::on_failure' | tail -n 40 || true
    exit "$rc"
fi
log "schemathesis passed"
