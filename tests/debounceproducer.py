"""A producer process of tests/test_debounce.py's race test: ``python debounceproducer.py NAME CALLS OUT``
enqueues CALLS debounced jobs over two keys and writes one JSON line per call (send and reply time, key, token,
the id it got) to OUT."""

from __future__ import annotations

import json
import sys
import time

from debounceapp import app, note

name, calls, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with open(out, "w") as f:
    for i in range(calls):
        key, token = f"k{i % 2}", f"{name}-{i}"
        sent = time.time()
        bounce = note.with_options(debounce_s=0.03, max_wait_s=0.1, debounce_key="{key}")
        got = bounce.enqueue(key=key, token=token, sleep_ms=30)
        f.write(json.dumps({"sent": sent, "reply": time.time(), "key": key, "token": token, "id": got}) + "\n")
        time.sleep(0.002 * (i % 5))  # uneven gaps: some jobs come due and start while the others keep coming
app.close()
