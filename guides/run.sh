#!/usr/bin/env bash
# Runs the recipes of the jobs/outboxes/streams guide against a real pgvs3 and checks every expected
# outcome; any deviation fails the run (exit 1). See guides/README.md.
#
# The server (debug build) uses DATABASE_URL when set, else a fresh private PostgreSQL cluster under
# target/guides-pg, which pgvs3 starts and stops itself. It runs with a 2 s job retention and a
# 200 ms maintenance interval so that retention-bounded ID reuse can be observed. The guide_app
# schema is created (and dropped first) in the same database.
#
# Sections: outbox (commit/rollback, relay, lost response, mismatched duplicate), worker (effect,
# death before ACK, lease reclaim, stale token, redelivery; needs outbox), envelope (args/meta
# validation, ID reuse after retention), stream (the receive roundtrip). A failing section is
# reported and the others still run.
set -euo pipefail
cd "$(dirname "$0")/.."

GUIDES=guides
TARGET_DIR=${CARGO_TARGET_DIR:-target}
DATA_DIR=target/guides-pg
SERVER_LOG=target/guides-server.log
EVENT_42=018f0000-0000-7000-8000-000000000042 # the guide's demo event (order.fulfill, guide-jobs)
EVENT_43=018f0000-0000-7000-8000-000000000043 # a second intent (order.audit, guide-audit)
EVENT_44=018f0000-0000-7000-8000-000000000044 # collides with a job stored by "someone else"
QUEUES=(guide-jobs guide-audit guide-retention guide-events)

log() { echo "guides: $*"; }
fail() {
    echo "guides: FAIL: $*" >&2
    exit 1
}

# --- tools -------------------------------------------------------------------------------------
command -v python3 >/dev/null 2>&1 || fail "python3 is required"
if [[ -z "${PSQL:-}" ]]; then
    if command -v psql >/dev/null 2>&1; then
        PSQL=psql
    else
        PSQL=$(compgen -G "/usr/lib/postgresql/*/bin/psql" | sort -V | tail -n 1 || true)
        [[ -n "$PSQL" ]] || fail "psql is required (Debian/Ubuntu: apt-get install postgresql-client)"
    fi
fi
export PSQL

# --- the server --------------------------------------------------------------------------------
log "cargo build"
cargo build
BIN="$TARGET_DIR/debug/pgvs3"

# A fresh private cluster per run. One still running there (a killed run's postmaster.pid) is
# reused rather than pulled out from under itself; the pre-clean below handles its old data.
if [[ -z "${DATABASE_URL:-}" && ! -e "$DATA_DIR/pgdata/postmaster.pid" ]]; then
    rm -rf "$DATA_DIR"
fi
mkdir -p "$DATA_DIR"

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export PGVS3_ENDPOINT="http://127.0.0.1:$PORT"

SERVER_PID=""
stop_server() {
    local rc=$?
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        log "stopping pgvs3 (pid $SERVER_PID)"
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        # pgvs3 finishes in-flight requests and stops its private cluster; bound the wait.
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
    exit "$rc"
}
trap stop_server EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log "starting pgvs3 on $PGVS3_ENDPOINT (log: $SERVER_LOG)"
NO_COLOR=1 "$BIN" serve --listen "127.0.0.1:$PORT" --data-dir "$DATA_DIR" \
    --job-retention-secs 2 --maintenance-interval-ms 200 >"$SERVER_LOG" 2>&1 &
SERVER_PID=$!

ready=""
for _ in $(seq 240); do
    kill -0 "$SERVER_PID" 2>/dev/null || break
    if python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
        "$PGVS3_ENDPOINT/ojs/v1/health" 2>/dev/null; then
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
if [[ -n "${DATABASE_URL:-}" ]]; then
    PGVS3_URL=$DATABASE_URL
else
    PGVS3_URL=$(cat "$DATA_DIR/database_url")
fi
export PGVS3_URL
log "pgvs3 is healthy; application database $PGVS3_URL"

# --- helpers -----------------------------------------------------------------------------------
sql_file() { "$PSQL" "$PGVS3_URL" -XAtq -v ON_ERROR_STOP=1 -f "$GUIDES/$1"; }
sql() { "$PSQL" "$PGVS3_URL" -XAt -v ON_ERROR_STOP=1 -c "$1"; }
ojs() { python3 "$GUIDES/ojs.py" "$@"; }
state() { sql_file state.sql; }

# check WHAT JSON EXPR: EXPR is Python over d, the parsed JSON.
check() {
    local what=$1 json=$2 expr=$3
    if python3 -c 'import json, sys; d = json.loads(sys.argv[1]); sys.exit(0 if eval(sys.argv[2]) else 1)' \
        "$json" "$expr" 2>/dev/null; then
        echo "   ok  $what"
    else
        fail "$what: expected $expr; observed $json"
    fi
}
# as_json KEY VALUE: {"KEY": "VALUE"} as JSON, for checking a program's text output.
as_json() { python3 -c 'import json, sys; print(json.dumps({sys.argv[1]: sys.argv[2]}))' "$1" "$2"; }
# program FILE ARGS...: runs a guide program, prints its stdout; fails showing its stderr if it fails.
program() {
    local rc=0 out
    out=$(python3 "$GUIDES/$1" "${@:2}" 2>"$TARGET_DIR/guides-program.stderr") || rc=$?
    if ((rc != 0)); then
        echo "   $1 exited $rc; stdout: $out; stderr:" >&2
        tail -n 5 "$TARGET_DIR/guides-program.stderr" | sed 's/^/     /' >&2
        fail "$1 failed"
    fi
    echo "$out"
}
# relay: runs relay.py like program; when it fails, also shows the intent it was relaying and the
# job the server stores under that ID, for the report.
relay() {
    local rc=0 out head
    out=$(python3 "$GUIDES/relay.py" 2>"$TARGET_DIR/guides-program.stderr") || rc=$?
    if ((rc != 0)); then
        echo "   relay.py exited $rc; stdout: $out; stderr:" >&2
        tail -n 5 "$TARGET_DIR/guides-program.stderr" | sed 's/^/     /' >&2
        head=$(sql "SELECT job FROM guide_app.outbox WHERE published_at IS NULL ORDER BY created_at, event_id LIMIT 1")
        echo "   the intent: $head" >&2
        echo "   the stored job: $(ojs GET "/jobs/$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["id"])' "$head")" |
            python3 -c 'import json, sys; d = json.load(sys.stdin); j = (d["body"] or {}).get("job") or d["body"]; print(json.dumps({k: j[k] for k in ("id", "type", "args", "queue", "state") if k in j}))')" >&2
        fail "relay.py failed"
    fi
    echo "$out"
}
# show LABEL JSON: print one observed JSON line.
show() { echo "   $1: $2"; }

# The guide's demo IDs are fixed. On a reused database (DATABASE_URL, or a cluster left running),
# remove what an earlier run left: the guide queues, and jobs with those IDs in any other queue
# (cancelled, then gone after the 2 s retention).
preclean() {
    local q id answer
    for q in "${QUEUES[@]}"; do
        ojs DELETE "/queues/$q" >/dev/null
    done
    for id in "$EVENT_42" "$EVENT_43" "$EVENT_44"; do
        answer=$(ojs GET "/jobs/$id")
        [[ $answer == '{"status": 404'* ]] && continue
        log "removing job $id left by an earlier run"
        ojs DELETE "/jobs/$id" >/dev/null
        for _ in $(seq 100); do
            answer=$(ojs GET "/jobs/$id")
            [[ $answer == '{"status": 404'* ]] && break
            sleep 0.2
        done
        [[ $answer == '{"status": 404'* ]] || fail "job $id from an earlier run is still stored: $answer"
    done
}

# --- sections ----------------------------------------------------------------------------------
section_outbox() {
    local out err rc payload
    sql_file schema.sql
    check "guide_app schema created, order 42 unpaid" "$(state)" \
        'd == {"order_paid": False, "fulfillment_count": 0, "outbox_rows": 0, "outbox_unsent": [], "receipts": 0}'

    echo " 1. commit business state and intent together"
    sql_file intent-rollback.sql
    out=$(state)
    show "after ROLLBACK" "$out"
    check "ROLLBACK leaves neither the business change nor the intent" "$out" \
        'd["order_paid"] is False and d["outbox_rows"] == 0'
    sql_file intent.sql
    out=$(state)
    show "after COMMIT" "$out"
    check "COMMIT leaves a paid order and one unsent intent" "$out" \
        'd["order_paid"] is True and d["outbox_rows"] == 1 and d["outbox_unsent"] == ["'$EVENT_42'"]'
    check "no OJS job exists before the relay runs" "$(ojs GET "/jobs/$EVENT_42")" 'd["status"] == 404'

    echo " 2. relay: a lost response, then a retry that reconciles"
    payload=$(sql "SELECT job FROM guide_app.outbox WHERE event_id = '$EVENT_42'")
    out=$(ojs POST /jobs "$payload")
    check "the first POST (its response is 'lost') stored the job" "$out" 'd["status"] == 201'
    check "the intent is still unsent" "$(state)" 'd["outbox_unsent"] == ["'$EVENT_42'"]'
    out=$(relay)
    show "relay.py" "$out"
    check "relay.py reconciled through 409 + GET + envelope comparison and published" "$out" \
        'd == {"published": "'$EVENT_42'", "observed_state": "available"}'
    check "the intent is marked published" "$(state)" 'd["outbox_unsent"] == []'
    check "the job is in the intent's queue, once" "$(ojs GET "/jobs/$EVENT_42")" \
        'd["status"] == 200 and d["body"]["job"]["queue"] == "guide-jobs" and d["body"]["job"]["args"] == [{"version": 1, "order_id": 42}]'
    out=$(relay)
    check "relay.py with nothing unsent does nothing" "$(as_json stdout "$out")" 'd["stdout"] == ""'

    echo " 2b. relay: the plain path (201 on the first POST)"
    sql_file second-intent.sql
    out=$(relay)
    show "relay.py" "$out"
    check "relay.py published the second intent" "$out" \
        'd == {"published": "'$EVENT_43'", "observed_state": "available"}'
    check "the second job is in its queue" "$(ojs GET "/jobs/$EVENT_43")" \
        'd["status"] == 200 and d["body"]["job"]["queue"] == "guide-audit" and d["body"]["job"]["type"] == "order.audit"'
    check "nothing is unsent" "$(state)" 'd["outbox_unsent"] == []'

    echo " 2c. relay: a mismatched duplicate stops the relay"
    out=$(ojs POST /jobs '{"id":"'$EVENT_44'","type":"order.refund","args":[{"version":1,"order_id":7}],"queue":"guide-audit"}')
    check "another producer's job holds ID $EVENT_44" "$out" 'd["status"] == 201'
    sql_file collision-intent.sql
    rc=0
    out=$(python3 "$GUIDES/relay.py" 2>"$TARGET_DIR/guides-relay.stderr") || rc=$?
    err=$(tail -n 1 "$TARGET_DIR/guides-relay.stderr")
    show "relay.py exit $rc, stderr" "$err"
    check "relay.py exits non-zero" "{\"rc\": $rc}" 'd["rc"] != 0'
    check "relay.py names the collision" "$(as_json stderr "$err")" \
        '"job ID collision or changed envelope" in d["stderr"]'
    check "relay.py printed nothing" "$(as_json stdout "$out")" 'd["stdout"] == ""'
    check "the colliding intent stays unsent" "$(state)" 'd["outbox_unsent"] == ["'$EVENT_44'"]'
    check "the stored job is unchanged" "$(ojs GET "/jobs/$EVENT_44")" \
        'd["status"] == 200 and d["body"]["job"]["type"] == "order.refund" and d["body"]["job"]["args"] == [{"version": 1, "order_id": 7}]'
    # As the operator who investigated: remove the demo's colliding intent and job.
    sql "DELETE FROM guide_app.outbox WHERE event_id = '$EVENT_44'" >/dev/null
    ojs DELETE "/jobs/$EVENT_44" >/dev/null
}

section_worker() {
    local out token1 job
    echo " 3. worker: effect committed, death before ACK, lease reclaim, stale token, redelivery"
    out=$(program worker.py --worker-id guide-worker-1 --visibility-timeout-ms 1000 --die-before-ack)
    show "worker.py (dies before ACK)" "$out"
    check "the first delivery applied the effect and did not ACK" "$out" \
        'd["job_id"] == "'$EVENT_42'" and d["attempt"] == 1 and d["effect"] == "applied" and d["acked"] is False'
    token1=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["lease_token"])' "$out")
    check "effect and receipt committed together" "$(state)" 'd["fulfillment_count"] == 1 and d["receipts"] == 1'

    # The lease (1 s) expires; GET shows a job whose lease expired with attempts left as available.
    for _ in $(seq 100); do
        job=$(ojs GET "/jobs/$EVENT_42")
        python3 -c 'import json, sys; sys.exit(json.loads(sys.argv[1])["body"]["job"]["state"] != "available")' "$job" && break
        sleep 0.2
    done
    check "the lease expired (job available again)" "$job" 'd["body"]["job"]["state"] == "available"'

    out=$(program worker.py --worker-id guide-worker-2 --stale-lease-token "$token1")
    show "worker.py (redelivery)" "$out"
    check "another fetch reclaimed the job with a new lease token" "$out" \
        'd["job_id"] == "'$EVENT_42'" and d["attempt"] == 2 and d["lease_token"] != "'"$token1"'"'
    check "the old token got 409 stale_lease" "$out" 'd["stale_ack"] == {"status": 409, "code": "stale_lease"}'
    check "the redelivery saw the receipt and suppressed a second effect" "$out" 'd["effect"] == "already_applied"'
    check "the redelivery ACKed with the new token" "$out" 'd["acked"] is True and d["state"] == "completed"'
    check "exactly one effect and one receipt exist" "$(state)" \
        'd["fulfillment_count"] == 1 and d["receipts"] == 1 and d["order_paid"] is True'
}

section_envelope() {
    local out
    echo " 4. envelope: args must be an array; a terminal job's ID is reusable after retention"
    out=$(program ids_and_args.py)
    show "ids_and_args.py" "$out"
    check "args that are not a JSON array are rejected (4xx)" "$out" '400 <= d["object_args"]["status"] < 500'
    check "meta that is not an object is rejected (4xx)" "$out" '400 <= d["array_meta"]["status"] < 500'
    check "a caller ID enqueues, runs and completes" "$out" \
        'd["enqueue"] == 201 and d["ack"] == {"status": 200, "state": "completed"}'
    check "while the job is stored its ID answers 409 duplicate" "$out" \
        'd["reuse_while_stored"] == {"status": 409, "code": "duplicate"}'
    check "retention (2 s) removed the terminal job, not before" "$out" \
        'd["removed_after_secs"] is not None and d["removed_after_secs"] >= 1.5'
    check "the ID enqueues again after retention (201)" "$out" 'd["reuse_after_retention"]["status"] == 201'
}

section_stream() {
    local out
    echo " 5. stream roundtrip: from tick 0, two appended, max 1 -> 413, max 100 -> both, same batch again, ack"
    out=$(program stream.py)
    show "stream.py" "$out"
    check "the roundtrip completed" "$out" 'd == {"processed": 2, "redelivered_same_batch": True}'
    check "the consumer has no active batch after the ack" "$(ojs GET /queues/guide-events/consumers)" \
        'd["status"] == 200 and [c["active_batches"] for c in d["body"]["consumers"] if c["consumer"] == "audit"] == [[]]'
}

# run_section NAME: runs section_NAME in a subshell that stops at its first failure.
FAILED=()
run_section() {
    local rc
    log "== $1"
    set +e
    (
        set -e
        "section_$1"
    )
    rc=$?
    set -e
    if ((rc != 0)); then
        FAILED+=("$1")
        log "section $1 FAILED"
    fi
}

preclean
run_section outbox
if [[ " ${FAILED[*]} " == *" outbox "* ]]; then
    log "== worker: skipped (needs the job the outbox section publishes)"
    FAILED+=("worker (skipped)")
else
    run_section worker
fi
run_section envelope
run_section stream

if ((${#FAILED[@]} > 0)); then
    log "FAILED: ${FAILED[*]}"
    log "server warnings and errors ($SERVER_LOG):"
    grep -E ' (ERROR|WARN) ' "$SERVER_LOG" | tail -n 20 || true
    exit 1
fi
log "all guide recipes behaved as the guide says"
