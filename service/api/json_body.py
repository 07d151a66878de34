"""Request bodies parsed as JSON by pydantic-core's parser (jiter), with the standard library's as the fallback.

Why: the standard library's ``json.loads`` was the largest single cost of a ``/predict`` on the event loop (a
Fashion-MNIST image as a pixel list, 6 kB: about 100 us, against 40 us here; docs/benchmarks-overhead.md). Both
parsers give the same values for what they both accept, ``NaN`` / ``Infinity`` and integers past 64 bits included
(orjson turns those into floats, so it is not used). What jiter refuses (malformed JSON, a lone UTF-16 surrogate
escape, nesting past its depth limit) goes to ``json.loads``, so such a body gets the answer it always got:
parsed as before, or refused with the standard library's error."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

import pydantic_core
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response


def parse_json(raw: bytes) -> Any:
    """``raw`` as JSON; raises what ``json.loads`` raises for what it refuses."""
    try:
        return pydantic_core.from_json(raw)
    except ValueError:
        return json.loads(raw)


class JsonRequest(Request):
    """A request whose ``json()`` is ``parse_json`` (FastAPI parses a JSON body through it)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_json(await self.body())
        return self._json


class JsonRoute(APIRoute):
    """An ``APIRoute`` that hands its endpoint (and FastAPI's body parsing) a ``JsonRequest``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            return await handler(JsonRequest(request.scope, request.receive))

        return handle
