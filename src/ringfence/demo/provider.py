"""A fake payment provider: a real HTTP server process on loopback with its own SQLite storage.

``python -m ringfence.demo.provider --db PATH`` binds 127.0.0.1 on a free port and prints
``port=<n>`` on stdout once it listens.

- ``POST /charges`` with JSON ``{"order_id": int, "amount": int}`` records a charge and
  answers ``{"id": "ch_<n>"}``. With an ``Idempotency-Key`` header it behaves like Stripe:
  the same key answers the first charge's id and records nothing new.
- ``GET /stats`` answers ``{"charges": n, "double_charged_orders": m}`` from its storage.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sqlite3
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

SCHEMA = """
CREATE TABLE IF NOT EXISTS charges (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    order_id INTEGER NOT NULL,
    amount INTEGER NOT NULL,
    idem_key TEXT UNIQUE
)
"""


class Ledger:
    """The provider's own storage. One lock: the key check and the insert are one decision."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute(SCHEMA)
        self.lock = threading.Lock()

    def charge(self, order_id: int, amount: int, key: str | None) -> str:
        with self.lock:
            if key is not None:
                found = self.db.execute("SELECT id FROM charges WHERE idem_key = ?", (key,)).fetchone()
                if found is not None:
                    return f"ch_{found[0]}"
            cur = self.db.execute("INSERT INTO charges (order_id, amount, idem_key) VALUES (?, ?, ?)",
                                  (order_id, amount, key))
            return f"ch_{cur.lastrowid}"

    def stats(self) -> dict[str, int]:
        with self.lock:
            charges = self.db.execute("SELECT count(*) FROM charges").fetchone()[0]
            doubled = self.db.execute(
                "SELECT count(*) FROM (SELECT order_id FROM charges GROUP BY order_id HAVING count(*) > 1)"
            ).fetchone()[0]
        return {"charges": charges, "double_charged_orders": doubled}


def make_handler(ledger: Ledger) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: clients reuse one connection

        def do_POST(self) -> None:
            if self.path != "/charges":
                return self._send(404, {"error": "not found"})
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            ref = ledger.charge(int(body["order_id"]), int(body["amount"]), self.headers.get("Idempotency-Key"))
            self._send(200, {"id": ref})

        def do_GET(self) -> None:
            if self.path != "/stats":
                return self._send(404, {"error": "not found"})
            self._send(200, ledger.stats())

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: thousands of requests per run

    return Handler


class ProviderClient:
    """A tiny client of the fake provider (one connection per thread, like an SDK's session)."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.timeout_s = timeout_s
        self._local = threading.local()

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None) -> dict[str, Any]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        data = json.dumps(body).encode() if body is not None else None
        try:
            conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
            resp = conn.getresponse()
            payload = json.loads(resp.read())
        except (OSError, http.client.HTTPException):
            conn.close()  # a broken keep-alive connection: the next call opens a new one
            self._local.conn = None
            raise
        if resp.status != 200:
            raise RuntimeError(f"provider answered {resp.status}: {payload}")
        return dict(payload)

    def charge(self, order_id: int, amount: int, idempotency_key: str | None = None) -> str:
        """Charge an order; returns the provider's charge id."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return str(self._request("POST", "/charges", {"order_id": order_id, "amount": amount}, headers)["id"])

    def stats(self) -> dict[str, int]:
        return {k: int(v) for k, v in self._request("GET", "/stats").items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", required=True, help="SQLite file of the provider's own storage")
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
        sys.stdout.flush()


if __name__ == "__main__":
    main()
