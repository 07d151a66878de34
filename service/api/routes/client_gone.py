"""Work that stops when its client leaves. uvicorn does not cancel a request's handler when the connection closes:
a prediction whose client has gone would still wait in its model's queue and take a forward nobody will read. Here
the handler's work runs beside a wait for the ASGI ``http.disconnect`` (what ``receive`` gives once the body is in
and the client closes); when that comes first the work is cancelled, its queued item with it (the batch worker skips
a cancelled request before the forward), and the route answers 499, which only the server's logs and metrics see."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

from service.errors import ApiError

T = TypeVar("T")
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a request whose client went away before the answer
READ_AGAIN_S = 0.05


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(READ_AGAIN_S)  # a receive that does not wait (a wrapper replaying the body) never spins


async def unless_client_leaves(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result, or ``ApiError`` 499 once the client has disconnected (``work`` then cancelled)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the handler itself cancelled (shutdown)
        task.cancel()
        watch.cancel()
        raise
    watch.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise ApiError(CLIENT_CLOSED_REQUEST, "the client closed the connection before the answer")
