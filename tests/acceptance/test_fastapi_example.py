"""docs/examples/fastapi_send.py, driven over ASGI: the app's own row and the decision
commit together, or roll back together."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import httpx
import psycopg

from tests.aio import run_async

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "fastapi_send.py"


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("fastapi_send", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fastapi_example_commits_and_rolls_back_the_decision_with_the_apps_row(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("CREATE TABLE public.orders (id text PRIMARY KEY, shipped boolean NOT NULL DEFAULT false)")
    conn.execute("INSERT INTO public.orders (id) VALUES ('o1')")
    app = load_example().create_app(db_url)

    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            return [await client.post("/orders/o1/ship"), await client.post("/orders/nope/ship")]

    shipped, missing = run_async(go())
    assert shipped.status_code == 200
    assert shipped.json() == {"order": "o1", "notification": {"sent": True}}
    assert missing.status_code == 404
    assert conn.execute("SELECT id, shipped FROM public.orders").fetchall() == [("o1", True)]
    # the decision for the missing order was rolled back with it
    assert conn.execute("SELECT message_id FROM gov.messages").fetchall() == [("shipped-o1",)]
    assert conn.execute("SELECT count(*) FROM gov.outbox WHERE message_id = 'shipped-o1'").fetchone() == (0,)
