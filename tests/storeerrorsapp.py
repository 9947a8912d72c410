"""The fenced tasks of test_fence_store_errors.py, a sync and an async step, on the fence database
``RINGFENCE_FENCE_URL`` names (the worker's app), or on any App (``declare``)."""

from __future__ import annotations

from ringfence import App, JobContext, RetryPolicy
from support import FAST


def declare(app: App) -> App:
    @app.task(name="charge", store_result=True)
    def charge(ctx: JobContext, order: int) -> str:
        with ctx.fence(f"order:{order}", "charge") as step:
            return "charged" if step.done else step.effect(lambda: "charged")

    @app.task(name="acharge", store_result=True)
    async def acharge(ctx: JobContext, order: int) -> str:
        async with ctx.fence(f"order:{order}", "acharge") as step:
            return "charged" if step.done else await step.effect(lambda: "charged")

    return app


app = declare(App(retry=RetryPolicy(max_attempts=3, base_s=0.05, cap_s=0.1), worker=FAST))
