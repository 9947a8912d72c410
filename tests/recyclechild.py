"""A stand-in worker for tests/test_recycle.py's supervisor test: the first one started says it serves, then that it
is recycling, and exits 75 three seconds later (as a worker finishing a long job); each records its start and exit
times in the folder given. Later ones serve until SIGTERM."""

import os
import signal
import sys
import time
from pathlib import Path

folder = Path(sys.argv[1])
n = len(list(folder.glob("start-*")))
(folder / f"start-{n}").write_text(repr(time.time()))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
fd = int(os.environ["RINGFENCE_SUPERVISOR_FD"])
os.write(fd, b"1")
if n == 0:
    time.sleep(0.5)
    os.write(fd, b"r")
    time.sleep(3)
    (folder / f"exit-{n}").write_text(repr(time.time()))
    sys.exit(75)
while True:
    time.sleep(1)
