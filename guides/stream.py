# The guide's stream roundtrip ("Streams: a receive ceiling is not pagination"), exactly as the
# guide shows it. Run: PGVS3_ENDPOINT=http://... python3 stream.py

import json
import os
from urllib.error import HTTPError
from urllib.request import Request, urlopen

def post(path, body):
    request = Request(os.environ["PGVS3_ENDPOINT"] + "/ojs/v1" + path,
                      data=json.dumps(body).encode(),
                      headers={"Content-Type": "application/openjobspec+json"})
    with urlopen(request, timeout=10) as response:
        return json.load(response)

post("/queues/guide-events/consumers", {"consumer": "audit", "from_tick": 0})
post("/queues/guide-events/messages/batch", {"messages": [
    {"type": "order.paid", "payload": {"id": 42}},
    {"type": "order.paid", "payload": {"id": 43}}
]})
try:
    post("/queues/guide-events/receive", {"consumer": "audit", "max": 1})
except HTTPError as error:
    if error.code != 413:
        raise
else:
    raise RuntimeError("expected batch_too_large, not a partial page")
batch = post("/queues/guide-events/receive", {"consumer": "audit", "max": 100})
again = post("/queues/guide-events/receive", {"consumer": "audit", "max": 100})
assert batch["batch_id"] == again["batch_id"] and batch["count"] == 2
post("/streams/ack", {"queue": "guide-events", "batch_id": batch["batch_id"]})
print(json.dumps({"processed": batch["count"], "redelivered_same_batch": True}))
