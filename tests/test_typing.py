"""Types: the wheel ships ``py.typed`` and ``Task`` is generic over its handler's payload parameters, so mypy — run
as a user runs it, on code beside the wheel installed in a fresh venv — rejects a wrong payload field or enqueue
option and accepts the right ones; at run time the typed calls do what they did."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, get_type_hints

import pytest

from installed import build_wheel, fresh_venv
from ringfence import PayloadError
from ringfence.jobs import find_job
from ringfence.tasks import EnqueueOptions

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # venvs built with pip: minutes on a busy machine

HEADER = '''
from pydantic import BaseModel

from ringfence import App, JobContext

app = App("redis://127.0.0.1:6379/0")


class Refund(BaseModel):
    order_id: int


@app.task(queue="critical")
def charge(ctx, order_id: int, amount: int, note: str = "") -> None: ...


@app.task
async def receipt(ctx: JobContext, order_id: int) -> None: ...


@app.task(payload=Refund, version=2)
def refund(ctx, p: Refund) -> None: ...
'''

GOOD = HEADER + '''

job: str = charge.enqueue(order_id=1, amount=5)
charge.enqueue(1, 5, note="gift")
charge.with_options(delay_s=5, job_id="order-1", unique_for=60).enqueue(order_id=1, amount=5)
charge.with_options(queue="low").with_options(max_attempts=3).enqueue(order_id=1, amount=5)
refund.enqueue(Refund(order_id=1))
refund.enqueue(order_id=1)
charge.enqueue_on_commit(None, order_id=1, amount=5, using="default")


async def send() -> str:
    return await receipt.aenqueue(order_id=1)


def in_transaction(conn: object) -> str:
    return charge.enqueue_in(conn, order_id=1, amount=5)
'''

BAD = {  # line: what mypy must say there
    "charge.enqueue(ordr_id=1, amount=5)": 'Unexpected keyword argument "ordr_id"',
    'charge.enqueue(order_id=1, amount="5")': 'Argument "amount" to "enqueue" of "Task" has incompatible type "str"',
    "charge.enqueue(order_id=1)": 'Missing positional argument "amount"',
    "charge.with_options(delay=5).enqueue(order_id=1, amount=5)": 'Unexpected keyword argument "delay"',
    'charge.with_options(delay_s="5").enqueue(order_id=1, amount=5)': 'Argument "delay_s" to "with_options"',
    "charge.with_options(queue='low').enqueue(order_id=1, amont=5)": 'Unexpected keyword argument "amont"',
    "receipt.enqueue_in(None, order='1')": 'Unexpected keyword argument "order"',
    "_ = receipt.aenqueue(order_id='1')": 'Argument "order_id" to "aenqueue" of "Task" has incompatible type',
}


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """mypy from this venv on good.py and bad.py (no project config), resolving imports in the site-packages of
    a fresh venv where ringfence is the installed wheel."""
    wheel = build_wheel(tmp_path_factory.mktemp("wheel"))
    python = fresh_venv(wheel, "", tmp_path_factory.mktemp("venv") / "venv") / "python"
    folder = tmp_path_factory.mktemp("samples")
    (folder / "good.py").write_text(GOOD)
    (folder / "bad.py").write_text(HEADER + "\n" + "\n".join(BAD) + "\n")
    return subprocess.run([sys.executable, "-m", "mypy", "--python-executable", str(python), "--no-incremental",
                           "--show-error-codes", "good.py", "bad.py"], cwd=folder, capture_output=True, text=True,
                          timeout=300)


def test_mypy_sees_the_installed_package_and_accepts_right_enqueues(checked: subprocess.CompletedProcess[str]) -> None:
    assert "bad.py" in checked.stdout, checked.stdout + checked.stderr  # it ran, and found the bad calls
    assert [e for e in checked.stdout.splitlines() if e.startswith("good.py")] == []


def test_mypy_rejects_a_wrong_field_name_type_or_option(checked: subprocess.CompletedProcess[str]) -> None:
    assert checked.returncode == 1, checked.stdout + checked.stderr
    first = HEADER.count("\n") + 2  # the line number of the first bad call
    for n, line in enumerate(BAD):
        said = [e for e in checked.stdout.splitlines() if e.startswith(f"bad.py:{first + n}: error:")]
        assert any(BAD[line] in e for e in said), (line, checked.stdout)


def test_the_typed_option_names_are_the_enqueue_options() -> None:
    from ringfence.tasks import OptionFields

    assert set(get_type_hints(OptionFields)) == set(EnqueueOptions.__dataclass_fields__)


def test_positional_payload_values_bind_to_the_handler_fields(make_app: Any) -> None:
    app = make_app()

    @app.task(name="typing.charge")
    def charge(ctx: Any, order_id: int, amount: int, note: str = "") -> None: ...

    job = charge.enqueue(7, 500, note="gift")
    view = find_job(app, job)
    assert view is not None and view.args == {"order_id": 7, "amount": 500, "note": "gift"}
    with pytest.raises(PayloadError, match="takes 3 payload field"):
        charge.enqueue(7, 500, "gift", "extra")  # type: ignore[call-arg]
    with pytest.raises(PayloadError, match="order_id given twice"):
        charge.enqueue(7, order_id=8, amount=500)  # type: ignore[misc]
