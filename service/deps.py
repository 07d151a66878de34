"""Typed FastAPI dependencies: the shared state and the API-key guard."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.errors import ApiError
from service.state import AppState

bearer = HTTPBearer(auto_error=False, description="the server's API key, when DIRECTOR_API_KEY is set")


# async on purpose: FastAPI runs a plain ``def`` dependency in its thread pool, two thread hops per request
# that also wait for the GIL (under a refusal flood they took about a fifth of the event loop's time)
async def get_state(request: Request) -> AppState:
    return request.app.state.director


State = Annotated[AppState, Depends(get_state)]


async def require_api_key(state: State, credentials: Annotated[HTTPAuthorizationCredentials | None,
                                                               Depends(bearer)]) -> None:
    key = state.settings.api_key
    if key is None:
        return
    given = credentials.credentials if credentials is not None else ""
    if not hmac.compare_digest(given.encode(), key.get_secret_value().encode()):
        raise ApiError(401, "missing or wrong API key (send 'Authorization: Bearer <key>')",
                       headers={"WWW-Authenticate": "Bearer"})
