"""The chaos run's payment provider: a real HTTP server process on loopback over one SQLite ledger.

Two providers in one process, each a :class:`ringfence.testing.FakeProvider` on the same file, so both count
real effects across SIGKILLed workers (the HTTP layer is the demo's, ``ringfence.demo.provider``):

- ``/a``: honours ``Idempotency-Key`` like Stripe: the same key answers the first charge's id, records nothing new;
- ``/b``: ignores every key (a new charge per call) but stores ``metadata.rf_key``, and answers
  ``GET /b/charges?rf_key=K`` (the lookup a reconcile hook uses).

``POST /faults`` sets the misbehaviour rates (``p_5xx``, ``p_hang``, ``p_drop``, ``hang_s``) for later charges:

- 5xx: answers 503 and charges nothing;
- hang: charges, then answers only after ``hang_s`` (past the client's timeout);
- drop: charges, then closes the connection without an answer.

Every charge request is logged by the ledger (``calls``: time, provider, order, caller ``kind:pid``, fault) for
the run's per-fault figures. ``python -m bench.chaos.provider --db PATH`` prints ``port=<n>`` once it listens.
"""

from __future__ import annotations

import argparse
import random
import socket
import time
import uuid
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from ringfence.demo.provider import JsonHandler, ProviderClient, serve
from ringfence.testing import FakeProvider, LostAnswer, ProviderUnavailable


class Faults:
    """The misbehaviour rates, drawn per charge request."""

    def __init__(self) -> None:
        self.rates = {"p_5xx": 0.0, "p_hang": 0.0, "p_drop": 0.0, "hang_s": 3.0}

    def draw(self) -> str:
        r, f = random.random(), self.rates
        for name in ("5xx", "hang", "drop"):
            r -= f[f"p_{name}"]
            if r < 0:
                return name
        return ""


def make_handler(path: str) -> type[BaseHTTPRequestHandler]:
    providers = {"a": FakeProvider(path, name="a"), "b": FakeProvider(path, name="b", honours_keys=False)}
    faults = Faults()

    class Handler(JsonHandler):
        def do_POST(self) -> None:
            body = self.body()
            if self.path == "/faults":
                faults.rates.update({k: float(v) for k, v in body.items() if k in faults.rates})
                return self._send(200, faults.rates)
            provider = providers.get(self.path.removesuffix("/charges").strip("/"))
            if provider is None or not self.path.endswith("/charges"):
                return self._send(404, {"error": "not found"})
            # b ignores the header and keeps the key the caller put in its metadata (what it can search by)
            key = self.headers.get("Idempotency-Key") if provider.honours_keys else (body.get("metadata") or {}).get(
                "rf_key")
            fault = faults.draw()
            try:
                ref = provider.charge(int(body["amount"]), key, order=int(body["order_id"]),
                                      caller=self.headers.get("X-Chaos-Worker", ""), fault=fault)
            except ProviderUnavailable:
                return self._send(503, {"error": "provider unavailable"})
            except LostAnswer as lost:
                if lost.fault == "drop":  # charged; the answer never leaves
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return None
                time.sleep(faults.rates["hang_s"])  # hang: charged; the answer comes after the client gave up
                ref = lost.reference
            return self._send(200, {"id": ref})

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            if parts.path != "/b/charges":
                return self._send(404, {"error": "not found"})
            rf_key = parse_qs(parts.query).get("rf_key", [""])[0]
            self._send(200, {"id": providers["b"].lookup(rf_key)})

    return Handler


class ProviderError(Exception):
    """The provider answered an error status."""


class Client(ProviderClient):
    """What a worker uses: one keep-alive connection per thread (like an SDK's session), a timeout per call."""

    error = ProviderError

    def __init__(self, url: str, timeout_s: float, worker: str = "") -> None:
        super().__init__(url, timeout_s, headers={"X-Chaos-Worker": worker})

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
    serve(make_handler(args.db))


if __name__ == "__main__":
    main()
