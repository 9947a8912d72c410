"""The chaos run's payment provider: a real HTTP server process on loopback with its own SQLite ledger.

Two providers in one process, so both count real effects across SIGKILLed workers:

- ``/a``: honours ``Idempotency-Key`` like Stripe: the same key answers the first charge's id, records nothing new;
- ``/b``: ignores every key (a new charge per call) but stores ``metadata.rf_key``, and answers
  ``GET /b/charges?rf_key=K`` (the lookup a reconcile hook uses).

``POST /faults`` sets the misbehaviour rates (``p_5xx``, ``p_hang``, ``p_drop``, ``hang_s``) for later charges:

- 5xx: answers 503 and charges nothing;
- hang: charges, then answers only after ``hang_s`` (past the client's timeout);
- drop: charges, then closes the connection without an answer.

Every charge request is logged (time, provider, order, worker, fault) for the run's per-fault figures.
``python -m bench.chaos.provider --db PATH`` prints ``port=<n>`` once it listens.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import socket
import sqlite3
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

SCHEMA = """
CREATE TABLE IF NOT EXISTS charges (
    id INTEGER PRIMARY KEY AUTOINCREMENT, provider TEXT NOT NULL, order_id INTEGER NOT NULL,
    amount INTEGER NOT NULL, idem_key TEXT, rf_key TEXT, worker TEXT, ts REAL NOT NULL);
CREATE INDEX IF NOT EXISTS charges_key ON charges (provider, idem_key);
CREATE INDEX IF NOT EXISTS charges_rf ON charges (provider, rf_key);
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, provider TEXT NOT NULL, order_id INTEGER NOT NULL,
    worker TEXT, fault TEXT, charged INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS lookups (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, rf_key TEXT NOT NULL, found INTEGER NOT NULL);
"""
PROVIDERS = ("a", "b")


class Ledger:
    """The providers' storage. One lock: a key check and its insert are one decision."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=OFF")  # this process is never killed; the OS keeps the pages
        self.db.executescript(SCHEMA)
        self.lock = threading.Lock()
        self.faults = {"p_5xx": 0.0, "p_hang": 0.0, "p_drop": 0.0, "hang_s": 3.0}

    def draw_fault(self) -> str:
        r, f = random.random(), self.faults
        for name in ("5xx", "hang", "drop"):
            r -= f[f"p_{name}"]
            if r < 0:
                return name
        return ""

    def charge(self, provider: str, body: dict[str, Any], idem_key: str | None, worker: str, fault: str) -> str:
        order_id, amount = int(body["order_id"]), int(body["amount"])
        rf_key = (body.get("metadata") or {}).get("rf_key")
        now = time.time()
        with self.lock:
            self.db.execute("INSERT INTO requests (ts, provider, order_id, worker, fault, charged) "
                            "VALUES (?, ?, ?, ?, ?, ?)", (now, provider, order_id, worker, fault, fault != "5xx"))
            if fault == "5xx":
                return ""
            if provider == "a" and idem_key is not None:
                found = self.db.execute("SELECT id FROM charges WHERE provider = 'a' AND idem_key = ?",
                                        (idem_key,)).fetchone()
                if found is not None:
                    return f"ch_{found[0]}"
            cur = self.db.execute(
                "INSERT INTO charges (provider, order_id, amount, idem_key, rf_key, worker, ts) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)", (provider, order_id, amount, idem_key, rf_key, worker, now))
            return f"ch_{cur.lastrowid}"

    def lookup(self, rf_key: str) -> str | None:
        with self.lock:
            found = self.db.execute("SELECT id FROM charges WHERE provider = 'b' AND rf_key = ? ORDER BY id",
                                    (rf_key,)).fetchone()
            self.db.execute("INSERT INTO lookups (ts, rf_key, found) VALUES (?, ?, ?)",
                            (time.time(), rf_key, found is not None))
        return None if found is None else f"ch_{found[0]}"


def make_handler(ledger: Ledger) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path == "/faults":
                ledger.faults.update({k: float(v) for k, v in body.items() if k in ledger.faults})
                return self._send(200, ledger.faults)
            provider = self.path.removesuffix("/charges").strip("/")
            if provider not in PROVIDERS or not self.path.endswith("/charges"):
                return self._send(404, {"error": "not found"})
            fault = ledger.draw_fault()
            ref = ledger.charge(provider, body, self.headers.get("Idempotency-Key"),
                                self.headers.get("X-Chaos-Worker", ""), fault)
            if fault == "5xx":
                return self._send(503, {"error": "provider unavailable"})
            if fault == "drop":  # charged; the answer never leaves
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return None
            if fault == "hang":
                time.sleep(ledger.faults["hang_s"])
            return self._send(200, {"id": ref})

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            if parts.path != "/b/charges":
                return self._send(404, {"error": "not found"})
            rf_key = parse_qs(parts.query).get("rf_key", [""])[0]
            self._send(200, {"id": ledger.lookup(rf_key)})

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                self.close_connection = True  # the client gave up (timeout) or was killed

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


class ProviderError(Exception):
    """The provider answered an error status."""


class Client:
    """What a worker uses: one keep-alive connection per thread (like an SDK's session), a timeout per call."""

    def __init__(self, url: str, timeout_s: float, worker: str = "") -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.timeout_s, self.worker = timeout_s, worker
        self._local = threading.local()

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None) -> dict[str, Any]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        data = json.dumps(body).encode() if body is not None else None
        try:
            conn.request(method, path, body=data, headers={"Content-Type": "application/json",
                                                           "X-Chaos-Worker": self.worker, **(headers or {})})
            resp = conn.getresponse()
            payload = json.loads(resp.read())
        except (OSError, http.client.HTTPException):
            conn.close()  # timed out or dropped: the next call opens a new connection
            self._local.conn = None
            raise
        if resp.status != 200:
            raise ProviderError(f"provider answered {resp.status}: {payload}")
        return dict(payload)

    def charge_a(self, order_id: int, amount: int, idempotency_key: str) -> str:
        """Provider a: deduplicates by the idempotency key."""
        body = {"order_id": order_id, "amount": amount}
        return str(self._request("POST", "/a/charges", body, {"Idempotency-Key": idempotency_key})["id"])

    def charge_b(self, order_id: int, amount: int, rf_key: str) -> str:
        """Provider b: ignores keys (this client sends a random one per call, as SDKs do); keeps metadata."""
        body = {"order_id": order_id, "amount": amount, "metadata": {"rf_key": rf_key}}
        return str(self._request("POST", "/b/charges", body, {"Idempotency-Key": uuid.uuid4().hex})["id"])

    def find_b(self, rf_key: str) -> str | None:
        """Provider b's search by metadata: the charge made with ``rf_key``, or None."""
        found = self._request("GET", f"/b/charges?rf_key={rf_key}")["id"]
        return None if found is None else str(found)

    def set_faults(self, **rates: float) -> None:
        self._request("POST", "/faults", rates)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", required=True, help="SQLite file of the providers' ledger")
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(Ledger(args.db)))
    server.daemon_threads = True
    print(f"port={server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
