#!/usr/bin/env python3
"""WAL written per job, by relation and record type, for one enqueue + batch-ack work-off.

Needs a running `pgvs3 serve` and psql access to its database with pg_walinspect available
(PostgreSQL 15+). Nothing else may write to the cluster meanwhile: the window is the cluster's.

    scripts/wal-by-relation.py --url http://127.0.0.1:8080 --psql 'postgres://postgres@/pgvs3' \
        [--jobs 20000] [--batch 1000] [--workers 4] [--fetch 10]
"""
import argparse
import json
import subprocess
import threading
import urllib.request


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req) as answer:
        return json.loads(answer.read())


def psql(dsn, sql):
    return subprocess.run(["psql", "-XAtq", "-F", "\t", dsn, "-c", sql], check=True,
                          capture_output=True, text=True).stdout.strip()


def diff(dsn, lo, hi):
    return float(psql(dsn, f"SELECT pg_wal_lsn_diff('{hi}', '{lo}')"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--psql", required=True)
    p.add_argument("--queue", default="walprobe")
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--fetch", type=int, default=10)
    a = p.parse_args()

    # The queue exists before the window opens (its schema is not part of a job's cost).
    post(a.url + "/ojs/v1/jobs", {"type": "probe.warm", "args": [], "options": {"queue": a.queue}})
    warm = post(a.url + "/ojs/v1/workers/fetch", {"queues": [a.queue], "count": 1, "worker_id": "w"})
    for j in warm["jobs"]:
        post(a.url + "/ojs/v1/workers/ack/batch",
             {"acks": [{"job_id": j["id"], "lease_token": j["lease_token"], "worker_id": "w"}]})
    psql(a.psql, "CREATE EXTENSION IF NOT EXISTS pg_walinspect; CHECKPOINT")

    start = psql(a.psql, "SELECT pg_current_wal_lsn()")
    for first in range(0, a.jobs, a.batch):
        jobs = [{"type": "bench.job", "args": [i, "bench payload"], "options": {"queue": a.queue}}
                for i in range(first, min(first + a.batch, a.jobs))]
        post(a.url + "/ojs/v1/jobs/batch", {"jobs": jobs})
    enqueued = psql(a.psql, "SELECT pg_current_wal_lsn()")

    def work(n):
        worker = f"w{n}"
        while True:
            got = post(a.url + "/ojs/v1/workers/fetch",
                       {"queues": [a.queue], "count": a.fetch, "worker_id": worker,
                        "visibility_timeout_ms": 60000, "wait_ms": 0})["jobs"]
            if not got:
                return
            post(a.url + "/ojs/v1/workers/ack/batch",
                 {"acks": [{"job_id": j["id"], "lease_token": j["lease_token"], "worker_id": worker}
                           for j in got]})

    threads = [threading.Thread(target=work, args=(n,)) for n in range(a.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    end = psql(a.psql, "SELECT pg_current_wal_lsn()")

    for label, lo, hi in (("enqueue", start, enqueued), ("work-off", enqueued, end)):
        print(f"== {label}: {diff(a.psql, lo, hi) / a.jobs:.0f} B/job")
        print(psql(a.psql, f"""
            SELECT round(sum(record_length + fpi_length)::numeric / {a.jobs}, 1) AS b_per_job,
                   round(sum(fpi_length)::numeric / {a.jobs}, 1) AS of_it_page_images, count(*),
                   coalesce((SELECT c.relname FROM pg_class c
                              WHERE c.relfilenode = substring(block_ref from 'rel \\d+/\\d+/(\\d+)')::oid),
                            '-') || ' ' || resource_manager || '/' || record_type
              FROM pg_get_wal_records_info('{lo}', '{hi}')
             GROUP BY 4 ORDER BY 1 DESC LIMIT 25"""))
    print(f"== total: {diff(a.psql, start, end) / a.jobs:.0f} B/job")


if __name__ == "__main__":
    main()
