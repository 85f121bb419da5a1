#!/usr/bin/env bash
# What maintenance costs an idle server: 1,000 queues holding one available job each, nobody
# working. Prints the CPU of the server process and of its PostgreSQL client backends over 60 s
# with nothing due and with the looks at every queue spread as in steady state, the queue steps
# in each window, how many queues one /metrics scrape reports, and `pgvs3 maintain --once` with
# nothing due and with every queue due (what every pass cost before passes stepped only through
# due queues).
#
# Needs a PostgreSQL whose admin URL is ADMIN_URL (default: the local one, user postgres) and a
# release build (cargo build --release). The database idle1000 is dropped and made again. Takes
# about 8 minutes on a 2-core machine, most of it creating the 1,000 queue schemas.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-target/release/pgvs3}
ADMIN_URL=${ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
URL=${ADMIN_URL%/*}/idle1000
PORT=${PORT:-8098}

psql -q "$ADMIN_URL" -c "DROP DATABASE IF EXISTS idle1000" -c "CREATE DATABASE idle1000" >/dev/null
"$BIN" serve --database-url "$URL" --listen "127.0.0.1:$PORT" >target/idle-maintenance.log 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
sleep 3

python3 - "$PORT" <<'PY'
import http.client, json, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
for n in range(1000):
    body = {"type": "idle.job", "args": [n], "options": {"queue": f"idle-{n:04d}"}}
    c.request("POST", "/ojs/v1/jobs", json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    r.read()
    assert r.status == 201, r.status
PY

metric() { curl -s "127.0.0.1:$PORT/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }
# The first passes step through every new queue once.
for _ in $(seq 120); do
    [ "$(metric pgvs3_maintenance_queue_steps_total)" -ge 1000 ] && break
    sleep 1
done
backends=$(psql -qAt "$ADMIN_URL" -c "SELECT string_agg(pid::text, ' ') FROM pg_stat_activity
                                        WHERE datname = 'idle1000' AND backend_type = 'client backend'")
ticks() { for p in $SERVER $backends; do awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null; done | paste -sd+ | bc; }
hz=$(getconf CLK_TCK)
# CPU of the server and its backends over 60 s; scrapes stay outside the window (with 1,000
# queues /metrics is itself expensive).
window() {
    local s0 p0 t0 t1 s1 p1
    s0=$(metric pgvs3_maintenance_queue_steps_total); p0=$(metric pgvs3_maintenance_passes_total)
    sleep 5
    t0=$(ticks)
    sleep 60
    t1=$(ticks)
    s1=$(metric pgvs3_maintenance_queue_steps_total); p1=$(metric pgvs3_maintenance_passes_total)
    echo "idle 60 s, $1: server + client backends $(echo "scale=2; 100 * ($t1 - $t0) / $hz / 60" | bc) %" \
         "of one core; passes $((p1 - p0)), queue steps $((s1 - s0))"
}
window "nothing due"
# Steady state: each queue's next look spread evenly over 30 minutes, the mean of the 20-40
# minute look, so steps come at the steady rate of 1,000 per 30 minutes.
psql -q "$URL" -c "UPDATE s3p.queues SET maintain_after = now() + random() * interval '30 minutes'" >/dev/null
window "looks spread over 30 minutes"
echo "/metrics reports $(curl -s "127.0.0.1:$PORT/metrics" | grep -c '^pgvs3_jobs{queue="idle-[0-9]*",state="available"} 1$') of 1000 queues"

kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
timed() { local start end; start=$(date +%s.%N); "$BIN" maintain --once --database-url "$URL" 2>/dev/null; end=$(date +%s.%N);
          echo "  $(echo "($end - $start) * 1000 / 1" | bc) ms"; }
echo "maintain --once, nothing due:"; timed
psql -q "$URL" -c "UPDATE s3p.queues SET maintain_after = NULL" >/dev/null
echo "maintain --once, all 1,000 due:"; timed
