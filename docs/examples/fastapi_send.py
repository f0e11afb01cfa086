"""A FastAPI app that records its own row and decides its notification in ONE transaction.

    GOV_DATABASE_URL=postgresql://app@db/app uvicorn docs.examples.fastapi_send:app

``POST /orders/{order_id}/ship`` marks the order shipped and asks gov whether the
"your order shipped" notification may go, in the same transaction: if anything fails
after the decision (here, an order that does not exist), both are rolled back and no
budget is spent; if it commits, both are kept, and the message waits in the outbox for
``gov dispatch`` (nothing is visible to a runner before the commit). Tested in
tests/acceptance/test_fastapi_example.py over ASGI.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import gov
from gov.aio import AsyncGovernor
from gov.db import sqlalchemy_url


def create_app(database_url: str) -> FastAPI:
    engine: AsyncEngine = create_async_engine(sqlalchemy_url(database_url))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await engine.dispose()

    app = FastAPI(lifespan=lifespan)

    @app.post("/orders/{order_id}/ship")
    async def ship(order_id: str) -> dict[str, object]:
        async with engine.connect() as connection:  # one transaction: the order and the decision
            governor = AsyncGovernor(connection)  # given a connection: gov works in its transaction
            result = await governor.send(gov.Message(
                user_id="customer-of-" + order_id, id=f"shipped-{order_id}", tier="P0",
                title="Your order shipped", url=f"https://shop.example/orders/{order_id}",
            ))
            updated = await connection.execute(
                text("UPDATE orders SET shipped = true WHERE id = :id"), {"id": order_id})
            if updated.rowcount != 1:
                await connection.rollback()  # the decision goes with it
                raise HTTPException(404, f"no order {order_id}")
            await connection.commit()
            return {"order": order_id, "notification": result.as_json()}

    return app


app = create_app(os.environ["GOV_DATABASE_URL"]) if "GOV_DATABASE_URL" in os.environ else None
