"""The API key, checked on the request's headers before anything reads its body.

Why here and not (only) in a route dependency: FastAPI reads and parses a request body before it resolves the
route's dependencies, so a client without the key could make the server receive and parse megabytes of JSON before
its 401. This pure ASGI middleware answers 401 from the headers alone; the body is never read (uvicorn discards it).

Open without the key: health (``/health/*``, ``/v2/health/*``) and ``/metrics`` (unless
``DIRECTOR_METRICS_REQUIRE_KEY``), which probes and scrapers call without credentials, and, when
``DIRECTOR_PUBLIC_DOCS`` is set, the API documentation (``/docs``, ``/redoc``, ``/openapi.json``). Everything else
needs ``Authorization: Bearer <key>``, unknown paths included (a client without the key learns nothing about which
routes exist). The key is compared in constant time."""

from __future__ import annotations

import hmac
import re
from collections.abc import Callable, Iterable

from pydantic import SecretStr
from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.middleware import ENDPOINT_KEY
from service.errors import error_response

OPEN_PATHS = frozenset({"/health/live", "/health/ready", "/metrics", "/v2/health/live", "/v2/health/ready"})
MESSAGE = "missing or wrong API key (send 'Authorization: Bearer <key>')"
CHALLENGE = {"WWW-Authenticate": "Bearer"}


def authorized(key: SecretStr | None, scope: Scope) -> bool:
    """True without a key, or when the request's ``Authorization: Bearer`` token equals it."""
    header = next((value for name, value in scope.get("headers", []) if name == b"authorization"), b"")
    return bearer_matches(key, header)


def bearer_matches(key: SecretStr | None, header: bytes) -> bool:
    """True without a key, or when an ``Authorization`` value (HTTP header or gRPC metadata) is ``Bearer <key>``."""
    if key is None:
        return True
    scheme, _, given = header.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), key.get_secret_value().encode())


def docs_paths(openapi_url: str | None, docs_url: str | None, redoc_url: str | None,
               oauth2_redirect_url: str | None) -> frozenset[str]:
    """The documentation routes FastAPI serves (a None url is a route it does not serve)."""
    return frozenset(url for url in (openapi_url, docs_url, redoc_url, oauth2_redirect_url) if url)


class ApiKeyGuard:
    """401 (the one error shape, ``WWW-Authenticate: Bearer``) for a request without the key, before its body is
    read. ``get_key`` is read per request. ``templates`` (route templates such as ``/models/{name}``, read at the
    first refusal) only label refusals in the metrics as routed requests are labelled; other paths count as
    ``unmatched``, so the label stays bounded whatever a client sends."""

    def __init__(self, app: ASGIApp, get_key: Callable[[], SecretStr | None], open_paths: frozenset[str],
                 templates: Callable[[], Iterable[str]]) -> None:
        self.app = app
        self.get_key = get_key
        self.open_paths = open_paths
        self.templates = templates
        self._patterns: list[tuple[re.Pattern[str], str]] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths or authorized(self.get_key(), scope):
            await self.app(scope, receive, send)
            return
        scope[ENDPOINT_KEY] = self.template_of(scope["path"])
        await error_response(401, MESSAGE, headers=CHALLENGE)(scope, receive, send)

    def template_of(self, path: str) -> str:
        if self._patterns is None:
            self._patterns = [(compile_path(template)[0], template) for template in self.templates()]
        return next((template for pattern, template in self._patterns if pattern.match(path)), "unmatched")
