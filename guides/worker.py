"""The guide's worker step ("Commit a deduplicated SQL effect before ACK").

Fetch one job from guide-jobs, validate it against the application intent in guide_app.outbox,
commit the deduplicated effect (effect.sql, the guide's SQL), then ACK with the job's lease_token.
Prints one JSON line of what it observed.

    PGVS3_URL=postgres://... PGVS3_ENDPOINT=http://... python3 worker.py

Options for the failure-window demo:
    --visibility-timeout-ms N   lease length asked for at fetch (the guide uses 30000)
    --die-before-ack            commit the effect, then exit without ACK (a worker that died)
    --stale-lease-token TOKEN   after fetching, first ACK with TOKEN (the dead worker's lease,
                                arriving late) and report the answer; then carry on normally
"""
import argparse
import json
import os
import subprocess
import uuid
from urllib.error import HTTPError
from urllib.request import Request, urlopen

HERE = os.path.dirname(os.path.abspath(__file__))
# The effect SQL of the guide is written for this one demo event of order 42.
DEMO_EVENT_ID = "018f0000-0000-7000-8000-000000000042"
DEMO_ORDER_ID = 42


def psql(*arguments):
    return subprocess.check_output([
        os.environ.get("PSQL", "psql"), os.environ["PGVS3_URL"],
        "-XAt", "-v", "ON_ERROR_STOP=1", *arguments
    ], text=True, timeout=30).strip()


def post(path, body):
    """POST JSON; returns (status, body) for 2xx and 4xx alike."""
    request = Request(os.environ["PGVS3_ENDPOINT"] + "/ojs/v1" + path,
                      data=json.dumps(body).encode(),
                      headers={"Content-Type": "application/openjobspec+json"})
    try:
        with urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except HTTPError as error:
        if error.code >= 500:
            raise
        return error.code, json.load(error)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker-id", default="guide-worker")
    parser.add_argument("--visibility-timeout-ms", type=int, default=30000)
    parser.add_argument("--die-before-ack", action="store_true")
    parser.add_argument("--stale-lease-token")
    options = parser.parse_args()
    observed = {"worker_id": options.worker_id}

    # 1. Fetch on a writable endpoint (the guide's fetch body).
    status, fetched = post("/workers/fetch", {
        "queues": ["guide-jobs"], "count": 1, "worker_id": options.worker_id,
        "visibility_timeout_ms": options.visibility_timeout_ms})
    if status != 200:
        raise RuntimeError("fetch answered %d: %s" % (status, json.dumps(fetched)))
    if not fetched["jobs"]:
        observed["fetched"] = 0
        print(json.dumps(observed))
        raise SystemExit(3)
    job = fetched["jobs"][0]
    event_id = str(uuid.UUID(job["id"]))
    observed.update(fetched=1, job_id=event_id, attempt=job["attempt"],
                    lease_token=job["lease_token"])

    # 2. Validate type, argument version, order ID and stable event ID against the intent.
    raw = psql("-c", "SELECT job FROM guide_app.outbox WHERE event_id='" + event_id + "'::uuid")
    if not raw:
        raise RuntimeError("no application intent for job " + event_id)
    intent = json.loads(raw)
    for field in ("id", "type", "args", "queue"):
        if job[field] != intent[field]:
            raise RuntimeError("job does not match its intent: " + field)
    if job["type"] != "order.fulfill" or not job["args"] or job["args"][0].get("version") != 1:
        raise RuntimeError("unsupported job type or argument version")
    order_id = job["args"][0].get("order_id")
    if event_id != DEMO_EVENT_ID or order_id != DEMO_ORDER_ID:
        raise RuntimeError("this demo effect handles only event %s of order %d"
                           % (DEMO_EVENT_ID, DEMO_ORDER_ID))

    # The dead worker's late ACK, while this delivery holds the lease.
    if options.stale_lease_token:
        status, answer = post("/workers/ack", {
            "job_id": event_id, "lease_token": options.stale_lease_token,
            "result": {"applied": True}})
        observed["stale_ack"] = {"status": status,
                                 "code": answer.get("error", {}).get("code")}

    # 3. The deduplicated effect: receipt and effect commit together.
    tags = psql("-f", os.path.join(HERE, "effect.sql")).splitlines()
    if "UPDATE 1" in tags:
        observed["effect"] = "applied"
    elif "UPDATE 0" in tags:
        # A receipt already exists: accept the collision only if it is this payload's.
        receipt = psql("-c", "SELECT order_id FROM guide_app.receipts "
                             "WHERE event_id='" + event_id + "'::uuid")
        if receipt != str(order_id):
            raise RuntimeError("receipt of %s belongs to order %s" % (event_id, receipt))
        observed["effect"] = "already_applied"
    else:
        raise RuntimeError("unexpected effect output: %r" % tags)

    if options.die_before_ack:
        observed["acked"] = False
        print(json.dumps(observed))
        return

    # 4. ACK with the job ID and the current lease_token.
    status, answer = post("/workers/ack", {
        "job_id": event_id, "lease_token": job["lease_token"], "result": {"applied": True}})
    if status != 200:
        observed.update(acked=False, ack_status=status,
                        ack_code=answer.get("error", {}).get("code"))
        print(json.dumps(observed))
        raise SystemExit(4)
    observed.update(acked=True, state=answer["state"])
    print(json.dumps(observed))


if __name__ == "__main__":
    main()
