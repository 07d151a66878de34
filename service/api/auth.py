"""The API key, checked on the request's headers before anything reads its body.

Why before the route and not (only) in a route dependency: FastAPI reads and parses a request body before it resolves
the route's dependencies, so a client without the key could make the server receive and parse megabytes of JSON
before its 401. The gateway (``service.api.gateway``) answers 401 from the headers alone, before the body limit and
admission; the body is never read (uvicorn discards it).

Open without the key: health (``/health/*``, ``/v2/health/*``) and ``/metrics`` (unless
``DIRECTOR_METRICS_REQUIRE_KEY``), which probes and scrapers call without credentials, and, when
``DIRECTOR_PUBLIC_DOCS`` is set, the API documentation (``/docs``, ``/redoc``, ``/openapi.json``). Everything else
needs ``Authorization: Bearer <key>``, unknown paths included (a client without the key learns nothing about which
routes exist). The key is compared in constant time.

``/feedback`` moves the live gauges and their alerts, so it can have keys of its own (``DIRECTOR_FEEDBACK_KEYS``):
named keys, each held by one labelling client; when they are set, ``/feedback`` takes only them and every label is
attributed to its key's name (docs/operations.md, "Who can move the live gauges")."""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from pydantic import SecretStr
from starlette.types import Scope

OPEN_PATHS = frozenset({"/health/live", "/health/ready", "/metrics", "/v2/health/live", "/v2/health/ready"})
MESSAGE = "missing or wrong API key (send 'Authorization: Bearer <key>')"
KEY_CHECKED = "director.key_checked"  # in the scope once the gateway found the request's key good
FEEDBACK_PATH = "/feedback"
FEEDBACK_CLIENT = "director.feedback_client"  # in the scope: the name of the feedback key the request sent
CHALLENGE = {"WWW-Authenticate": "Bearer"}


def authorized(key: SecretStr | None, scope: Scope) -> bool:
    """True without a key, or when the request's ``Authorization: Bearer`` token equals it."""
    if key is None:
        return True
    header = next((value for name, value in scope.get("headers", []) if name == b"authorization"), b"")
    return bearer_matches(key, header)


def feedback_key_name(keys: Mapping[str, SecretStr], scope: Scope) -> str | None:
    """The name of the feedback key the request's ``Authorization: Bearer`` token is, or None. Every key is compared
    (in constant time), so the time taken does not tell which name came close."""
    header = next((value for name, value in scope.get("headers", []) if name == b"authorization"), b"")
    found = None
    for name, key in keys.items():
        if bearer_matches(key, header):
            found = name
    return found


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
