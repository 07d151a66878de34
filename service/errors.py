"""One error shape for every route, registered in one place.

Body: ``{"error": message, "status": code, "type": kind, "details": [...] | null}``. ``error`` is a string so
Open Inference Protocol clients (which read ``error``) understand it too. Never a traceback.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

log = logging.getLogger("service.errors")

KINDS = {400: "bad_request", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed",
         408: "request_timeout", 413: "too_large", 422: "invalid_input", 499: "client_closed", 500: "internal",
         503: "unavailable", 504: "timeout"}


class ErrorBody(BaseModel):
    """The JSON body of every error response."""

    error: str = Field(..., description="what went wrong, for a person to read")
    status: int = Field(..., description="the HTTP status code, repeated")
    type: str = Field(..., description="kind of error, for a program to branch on: bad_request, unauthorized, "
                                       "not_found, method_not_allowed, request_timeout, too_large, invalid_input, "
                                       "internal, unavailable, timeout")
    details: list[dict[str, Any]] | None = Field(None, description="one entry per problem, with its location (loc) "
                                                                   "and message (msg): every 422, some 400s")


class ApiError(Exception):
    """An error with an HTTP status that reaches the client as an ``ErrorBody``."""

    def __init__(self, status: int, message: str, details: list[dict[str, Any]] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.details = details
        self.headers = headers


SHOWN_CHARACTERS = 100  # of a client's string quoted back in an error


def shown(value: str) -> str:
    """A client's string as an error quotes it: ``repr``, cut to ``SHOWN_CHARACTERS`` (a 4 MB model name is not
    echoed back)."""
    if len(value) <= SHOWN_CHARACTERS:
        return repr(value)
    return f"{value[:SHOWN_CHARACTERS]!r}... ({len(value):,} characters)"


def bad_input(message: str) -> ApiError:
    return ApiError(400, message)


def not_found(message: str) -> ApiError:
    return ApiError(404, message)


def too_large(message: str) -> ApiError:
    return ApiError(413, message)


def invalid(message: str, loc: list[str | int] | None = None) -> ApiError:
    return ApiError(422, message, [{"loc": loc or [], "msg": message}])


def overloaded(message: str, retry_after_s: int = 1) -> ApiError:
    return ApiError(503, message, headers={"Retry-After": str(retry_after_s)})


class ErrorResponse(JSONResponse):
    """JSON written as ASCII: a message that quotes what a client sent (a lone UTF-16 surrogate included) is still
    encodable, and the error reads the same once parsed."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def error_response(status: int, message: str, details: list[dict[str, Any]] | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorBody(error=message, status=status, type=KINDS.get(status, "error"), details=details)
    return ErrorResponse(body.model_dump(), status_code=status, headers=headers)


def _validation_details(exc: RequestValidationError) -> list[dict[str, Any]]:
    """Pydantic errors without the offending input (which may be megabytes of pixels)."""
    return [{"loc": list(err.get("loc", ())), "msg": str(err.get("msg", "")), "type": str(err.get("type", ""))}
            for err in exc.errors()]


def register_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.details, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        details = _validation_details(exc)
        if any(d["type"] == "json_invalid" for d in details):
            return error_response(400, "request body is not valid JSON", details)
        return error_response(422, "request does not match the schema", details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(ClientDisconnect)
    async def _gone(_: Request, __: ClientDisconnect) -> JSONResponse:
        # the client left (or its body timed out) while its body was read: nothing reaches it, but the metrics must
        # not count it as a server error; 499 is nginx's "client closed request"
        return error_response(499, "client closed the request before its body arrived")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal server error")


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "undecodable input (bad base64, not PNG/JPEG, invalid JSON, OIP text "
                                            "not UTF-8), or coverage / max_risk asked of a version without a "
                                            "conformal calibration"},
    401: {"model": ErrorBody, "description": "API key configured and missing or wrong"},
    404: {"model": ErrorBody, "description": "unknown model or version"},
    408: {"model": ErrorBody, "description": "the request body did not arrive in full within DIRECTOR_BODY_TIMEOUT_S "
                                            "(the connection is closed)"},
    413: {"model": ErrorBody, "description": "body, image pixels, text (over the model's character limit) or number "
                                            "of inputs too large"},
    422: {"model": ErrorBody, "description": "schema violation: bad n_samples, wrong shape, NaN/Inf, empty text, "
                                            "text to an image model, image or pixels to a text model"},
    503: {"model": ErrorBody, "description": "queue full (refused before the body is read), model not ready, "
                                            "server draining or feedback database unavailable; see Retry-After"},
    504: {"model": ErrorBody, "description": "request timed out in the queue or in inference"},
}
