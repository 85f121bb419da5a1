"""Two rules of the guide's job envelope, observed on a live server.

1. args must be a JSON array (an object is rejected) and meta, if present, an object.
2. A caller ID names a stored job, not a permanent unique-work key: while the job is stored the ID
   answers 409 duplicate; once retention removed the terminal job, the same ID enqueues again (201).
   The server must run with a short retention (run.sh: --job-retention-secs 2).

    PGVS3_ENDPOINT=http://... python3 ids_and_args.py

Prints one JSON line of what it observed. Uses its own queue, guide-retention.
"""
import json
import os
import time
import uuid
from urllib.error import HTTPError
from urllib.request import Request, urlopen

QUEUE = "guide-retention"
WAIT_FOR_REMOVAL_SECS = 20


def call(method, path, body=None):
    """Returns (status, body) for 2xx and 4xx alike."""
    request = Request(os.environ["PGVS3_ENDPOINT"] + "/ojs/v1" + path, method=method,
                      data=None if body is None else json.dumps(body).encode(),
                      headers={"Content-Type": "application/openjobspec+json"})
    try:
        with urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except HTTPError as error:
        if error.code >= 500:
            raise
        return error.code, json.load(error)


def uuid7():
    """A fresh lowercase UUIDv7 (Python's uuid module has none before 3.14)."""
    value = bytearray(int(time.time() * 1000).to_bytes(6, "big") + os.urandom(10))
    value[6] = 0x70 | (value[6] & 0x0F)
    value[8] = 0x80 | (value[8] & 0x3F)
    return str(uuid.UUID(bytes=bytes(value)))


def code(answer):
    return answer.get("error", {}).get("code")


observed = {}

# 1. Envelope validation.
status, answer = call("POST", "/jobs", {
    "type": "order.fulfill", "args": {"order_id": 42}, "options": {"queue": QUEUE}})
observed["object_args"] = {"status": status, "code": code(answer)}
status, answer = call("POST", "/jobs", {
    "type": "order.fulfill", "args": [{"order_id": 42}], "meta": ["not", "an", "object"],
    "options": {"queue": QUEUE}})
observed["array_meta"] = {"status": status, "code": code(answer)}

# 2. Enqueue with a caller ID, run it to completion, and watch retention free the ID.
job_id = uuid7()
envelope = {"id": job_id, "type": "guide.retention", "args": [{"order_id": 42}],
            "options": {"queue": QUEUE}}
status, answer = call("POST", "/jobs", envelope)
observed["enqueue"] = status
status, fetched = call("POST", "/workers/fetch", {
    "queues": [QUEUE], "count": 1, "worker_id": "guide-retention", "visibility_timeout_ms": 30000})
jobs = fetched.get("jobs") or []
if status != 200 or not jobs or jobs[0]["id"] != job_id:
    raise RuntimeError("fetch did not return %s: %d %s" % (job_id, status, json.dumps(fetched)))
status, answer = call("POST", "/workers/ack", {
    "job_id": job_id, "lease_token": jobs[0]["lease_token"], "result": {"done": True}})
acked_at = time.monotonic()
observed["ack"] = {"status": status, "state": answer.get("state")}

status, answer = call("POST", "/jobs", envelope)
observed["reuse_while_stored"] = {"status": status, "code": code(answer)}

removed_after = None
while time.monotonic() - acked_at < WAIT_FOR_REMOVAL_SECS:
    status, _ = call("GET", "/jobs/" + job_id)
    if status == 404:
        removed_after = round(time.monotonic() - acked_at, 1)
        break
    time.sleep(0.2)
observed["removed_after_secs"] = removed_after

status, answer = call("POST", "/jobs", envelope)
observed["reuse_after_retention"] = {"status": status, "state": answer.get("job", {}).get("state")}
# Leave no live demo work behind: cancel the re-inserted job.
if status == 201:
    call("DELETE", "/jobs/" + job_id)
observed["job_id"] = job_id
print(json.dumps(observed))
