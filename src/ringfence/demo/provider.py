"""A fake payment provider: a real HTTP server process on loopback with its own SQLite storage.

The ledger is :class:`ringfence.testing.FakeProvider` (the one fake provider of the tests, the chaos bench and
users' tests) on a file; this module puts it behind HTTP.

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
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from ringfence.fake_provider import FakeProvider


class JsonHandler(BaseHTTPRequestHandler):
    """A JSON-over-HTTP handler on keep-alive connections (the chaos bench's provider extends it)."""

    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse one connection

    def body(self) -> dict[str, Any]:
        return dict(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}"))

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
        pass  # quiet: thousands of requests per run


def make_handler(provider: FakeProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def do_POST(self) -> None:
            if self.path != "/charges":
                return self._send(404, {"error": "not found"})
            body = self.body()
            ref = provider.charge(int(body["amount"]), self.headers.get("Idempotency-Key"),
                                  order=int(body["order_id"]))
            self._send(200, {"id": ref})

        def do_GET(self) -> None:
            if self.path != "/stats":
                return self._send(404, {"error": "not found"})
            self._send(200, provider.stats())

    return Handler


class ProviderClient:
    """A tiny client of the fake provider (one connection per thread, like an SDK's session)."""

    error: type[Exception] = RuntimeError  # raised on an error status

    def __init__(self, url: str, timeout_s: float = 10.0, headers: dict[str, str] | None = None) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.timeout_s = timeout_s
        self.headers = {"Content-Type": "application/json", **(headers or {})}  # sent with every request
        self._local = threading.local()

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None) -> dict[str, Any]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        data = json.dumps(body).encode() if body is not None else None
        try:
            conn.request(method, path, body=data, headers={**self.headers, **(headers or {})})
            resp = conn.getresponse()
            payload = json.loads(resp.read())
        except (OSError, http.client.HTTPException):
            conn.close()  # a broken keep-alive connection: the next call opens a new one
            self._local.conn = None
            raise
        if resp.status != 200:
            raise self.error(f"provider answered {resp.status}: {payload}")
        return dict(payload)

    def charge(self, order_id: int, amount: int, idempotency_key: str | None = None) -> str:
        """Charge an order; returns the provider's charge id."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return str(self._request("POST", "/charges", {"order_id": order_id, "amount": amount}, headers)["id"])

    def stats(self) -> dict[str, int]:
        return {k: int(v) for k, v in self._request("GET", "/stats").items()}


def serve(handler: type[BaseHTTPRequestHandler]) -> None:
    """Serve on a free loopback port, announced as ``port=<n>`` on stdout, until interrupted."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    print(f"port={server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", required=True, help="SQLite file of the provider's own storage")
    args = parser.parse_args(argv)
    serve(make_handler(FakeProvider(args.db)))


if __name__ == "__main__":
    main()
