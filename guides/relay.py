# The guide's outbox relay ("Relay, reconcile an ambiguous response, then mark published"),
# exactly as the guide shows it. Run: PGVS3_URL=postgres://... PGVS3_ENDPOINT=http://... python3 relay.py

import json
import os
import subprocess
import uuid
from urllib.error import HTTPError
from urllib.request import Request, urlopen

def sql(statement):
    return subprocess.check_output([
        os.environ.get("PSQL", "psql"), os.environ["PGVS3_URL"],
        "-XAt", "-v", "ON_ERROR_STOP=1", "-c", statement
    ], text=True, timeout=30).strip()

def call(path, job=None):
    request = Request(os.environ["PGVS3_ENDPOINT"] + "/ojs/v1" + path,
                      data=None if job is None else json.dumps(job).encode(),
                      headers={"Content-Type": "application/openjobspec+json"})
    with urlopen(request, timeout=10) as response:
        return json.load(response)

raw = sql("SELECT job FROM guide_app.outbox WHERE published_at IS NULL "
          "ORDER BY created_at, event_id LIMIT 1")
if raw:
    expected = json.loads(raw)
    event_id = str(uuid.UUID(expected["id"]))
    try:
        actual = call("/jobs", expected)["job"]
    except HTTPError as error:
        if error.code != 409:
            raise
        actual = call("/jobs/" + event_id)["job"]
    for field in ("id", "type", "args", "queue"):
        if actual[field] != expected[field]:
            raise RuntimeError("job ID collision or changed envelope: " + field)
    sql("UPDATE guide_app.outbox SET published_at=now() "
        "WHERE event_id='" + event_id + "'::uuid AND published_at IS NULL")
    print(json.dumps({"published": event_id, "observed_state": actual["state"]}))
