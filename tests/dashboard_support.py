"""What the dashboard tests share: a logged-in TestClient, real worker processes of an app module in tests/, and a
fence store with a double effect to reconcile."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import warnings
from typing import Any

from ringfence.fence import FenceStore, Owner
from support import ROOT

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


def csrf(client: TestClient, path: str = "/") -> str:
    """The CSRF value of ``path``'s forms (the cookie's, on a page with no form)."""
    page = client.get(path)
    assert page.status_code == 200, page.text
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    return found.group(1) if found else client.cookies.get("rf_csrf", "")


def login(client: TestClient, token: str) -> str:
    """Log ``client`` in with ``token``; the CSRF value it posted (its later forms take it too)."""
    value = csrf(client, "/login")
    r = client.post("/login", data={"csrf": value, "token": token}, follow_redirects=False)
    assert r.status_code == 303, r.text
    return value


def logged_in(web: Any, token: str) -> TestClient:
    client = TestClient(web)
    login(client, token)
    return client


def worker_env(redis_url: str, namespace: str) -> dict[str, str]:
    """The environment of a CLI or worker process on the test's Redis and namespace, with tests/ importable."""
    return {**os.environ, "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace,
            "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


class Workers:
    """Real ``ringfence worker --app <app>`` processes, each in its own process group, SIGKILLed by ``stop``."""

    def __init__(self, env: dict[str, str], app: str) -> None:
        self.env, self.app = env, app
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        self.procs.append(subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", self.app],
                                           env=self.env, start_new_session=True, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.STDOUT))

    def stop(self) -> None:
        for p in self.procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def charged_twice(store: FenceStore) -> None:
    """Two captured ``charge`` steps (order:1, order:2) and the provider's ``callbacks`` table, in which order 1 was
    charged twice."""
    from sqlalchemy import text

    for n in (1, 2):
        store.capture(f"order:{n}", "charge", Owner(f"job{n}", "tok", 30.0), "h", None)
    with store.engine.begin() as c:
        c.execute(text("create table callbacks (order_id integer, charge_id text)"))
        c.execute(text("insert into callbacks values (1, 'ch_a'), (1, 'ch_b'), (2, 'ch_c')"))
