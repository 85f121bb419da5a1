"""One OJS HTTP call for run.sh: python3 ojs.py METHOD PATH [JSON_BODY].

Prints one JSON line {"status": <HTTP status>, "body": <response JSON or null>}, whatever the status.
PATH is relative to $PGVS3_ENDPOINT/ojs/v1.
"""
import json
import os
import sys
from urllib.error import HTTPError
from urllib.request import Request, urlopen

method, path = sys.argv[1], sys.argv[2]
data = sys.argv[3].encode() if len(sys.argv) > 3 else None
request = Request(os.environ["PGVS3_ENDPOINT"] + "/ojs/v1" + path, data=data, method=method,
                  headers={"Content-Type": "application/openjobspec+json"})
try:
    with urlopen(request, timeout=10) as response:
        status, raw = response.status, response.read()
except HTTPError as error:
    status, raw = error.code, error.read()
try:
    body = json.loads(raw) if raw else None
except ValueError:
    body = raw.decode(errors="replace")
print(json.dumps({"status": status, "body": body}))
