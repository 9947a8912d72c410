"""A FastAPI app that sends jobs three ways and mounts the ringfence dashboard.

- POST /orders: the order row and its charge job (a row of ringfence_outbox) commit in ONE transaction;
  ``ringfence relay`` sends the job to Redis afterwards (``task.enqueue_in``);
- POST /orders/{id}/cancel: the cancellation mail is queued once the transaction commits, never on rollback
  (``task.enqueue_on_commit``);
- POST /contact: no database write to wait for, so the job is sent at once (``await task.aenqueue``);
- /ops/ringfence: the dashboard; actions need the X-Ops-Token header.

Install (from the ringfence checkout): ``pip install -e '.[dashboard]' fastapi`` (the dashboard extra brings
uvicorn). Run: ``uvicorn fastapi_app.main:api`` (from examples/), a worker and a relay beside it::

    ringfence worker --app fastapi_app.jobs:app --queues critical=6,default=3,low=1
    ringfence relay --app fastapi_app.jobs:app
"""

from __future__ import annotations

import hmac
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field
from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from fastapi_app.jobs import app, charge_order, engine, metadata, orders, send_cancellation, send_contact_mail
from ringfence.dashboard import create_app
from ringfence.fence import create_all
from ringfence.outbox import create_outbox

OPS_TOKEN = os.environ.get("OPS_TOKEN", "")


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    # At start: the shop's tables and ringfence's (fences, failed jobs, outbox) in the same database — in
    # production your migrations make them (`ringfence fence ddl`, `ringfence outbox ddl`) — and one round
    # trip to Redis, so a wrong URL fails the start, not the first request.
    metadata.create_all(engine)
    create_all(engine)
    create_outbox(engine)
    app.broker.sync.ping()
    yield
    # At stop: Redis connections and the database pool.
    app.close()
    engine.dispose()


api = FastAPI(lifespan=lifespan)


def ops_only(request: Request) -> bool:
    """Who may press the dashboard's buttons: here, whoever sends the operators' token."""
    sent = request.headers.get("x-ops-token", "")
    return bool(OPS_TOKEN) and hmac.compare_digest(sent, OPS_TOKEN)


api.mount("/ops/ringfence", create_app(app, authorize=ops_only))


class NewOrder(BaseModel):
    amount: int = Field(gt=0, le=1_000_000, strict=True, description="cents")


@api.post("/orders")
def create_order(body: NewOrder) -> dict[str, object]:
    with engine.begin() as conn:  # one transaction: the order and its charge job, or neither
        order_id = conn.execute(insert(orders).values(amount=body.amount, status="new")).inserted_primary_key[0]
        job_id = charge_order.enqueue_in(conn, order_id=order_id, amount=body.amount)
    return {"order_id": order_id, "job_id": job_id}


@api.post("/orders/{order_id}/cancel")
def cancel_order(order_id: int) -> dict[str, object]:
    with Session(engine) as session, session.begin():
        # Only a new order: one the charge job has claimed (charging) or paid stays as it is.
        cancelled = session.execute(update(orders).where(orders.c.id == order_id, orders.c.status == "new")
                                    .values(status="cancelled"))
        if cancelled.rowcount != 1:  # raising rolls the transaction back: no mail is queued
            status = session.execute(select(orders.c.status).where(orders.c.id == order_id)).scalar()
            raise HTTPException(404 if status is None else 409,
                                f"no order {order_id}" if status is None else f"order {order_id} is {status}")
        job_id = send_cancellation.enqueue_on_commit(session, order_id=order_id)
    return {"order_id": order_id, "job_id": job_id}


class Contact(BaseModel):
    email: str = Field(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$", max_length=254)
    message: str = Field(min_length=1, max_length=5000)


@api.post("/contact")
async def contact(body: Contact) -> dict[str, str]:
    return {"job_id": await send_contact_mail.aenqueue(email=body.email, message=body.message)}


@api.get("/orders/{order_id}")
def show_order(order_id: int) -> dict[str, object]:
    with engine.connect() as conn:
        row = conn.execute(select(orders).where(orders.c.id == order_id)).mappings().first()
    if row is None:
        raise HTTPException(404, f"no order {order_id}")
    return dict(row)
