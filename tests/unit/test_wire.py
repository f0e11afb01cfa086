"""gov.http.wire: an answer's writes within one turn of the loop leave as one write."""

from __future__ import annotations

import asyncio
from typing import Any

from gov.http.wire import JoinedWrites
from tests.aio import run_async


class Recorder(asyncio.Transport):
    """A transport that keeps what it is asked to send, one entry per write."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: Any) -> None:
        self.sent.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 9)}.get(name, default)


def test_a_head_and_body_written_in_one_turn_leave_as_one_write() -> None:
    async def go() -> tuple[list[bytes], list[bytes], int]:
        raw = Recorder()
        joined = JoinedWrites(raw, asyncio.get_running_loop())
        joined.write(b"HTTP/1.1 200 OK\r\ncontent-length: 13\r\n\r\n")
        joined.write(b'{"sent":true}')
        before = list(raw.sent)  # nothing leaves before the turn ends
        pending = joined.get_write_buffer_size()
        await asyncio.sleep(0)
        return before, raw.sent, pending

    before, sent, pending = run_async(go())
    assert before == []
    assert pending == 52
    assert sent == [b'HTTP/1.1 200 OK\r\ncontent-length: 13\r\n\r\n{"sent":true}']


def test_close_sends_what_is_pending_first_and_abort_drops_it() -> None:
    async def go() -> tuple[Recorder, Recorder]:
        loop = asyncio.get_running_loop()
        closing, aborting = Recorder(), Recorder()
        a, b = JoinedWrites(closing, loop), JoinedWrites(aborting, loop)
        a.write(b"last answer")
        a.close()
        b.write(b"never sent")
        b.abort()
        await asyncio.sleep(0)  # the scheduled flush finds nothing more to send
        return closing, aborting

    closing, aborting = run_async(go())
    assert closing.sent == [b"last answer"] and closing.closed
    assert aborting.sent == [] and aborting.aborted


def test_everything_else_is_the_transports() -> None:
    async def go() -> Any:
        joined = JoinedWrites(Recorder(), asyncio.get_running_loop())
        return joined.get_extra_info("peername"), joined.is_closing()

    assert run_async(go()) == (("127.0.0.1", 9), False)
