"""CORS in front of everything (a browser's preflight carries no key), its preflight answers shaped like every other
answer of the server: an ``X-Request-ID`` (the caller's when valid, else a new one) and, for a refused preflight, the
API's JSON error body instead of Starlette's plain text."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from service.api.request_context import REQUEST_ID
from service.errors import error_response
from service.random_ids import random_hex


class Cors(CORSMiddleware):
    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        given = request_headers.get("x-request-id", "")
        request_id = given if REQUEST_ID.fullmatch(given) else random_hex(16)
        headers = {key: value for key, value in response.headers.items() if key.lower() != "content-length"
                   and key.lower() != "content-type"}
        headers["X-Request-ID"] = request_id
        if response.status_code >= 400:
            return error_response(response.status_code, bytes(response.body).decode(), headers=headers)
        response.headers["X-Request-ID"] = request_id
        return response
