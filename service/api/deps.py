"""Typed FastAPI dependencies: the shared state, the API-key guard and the feedback client."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.api.auth import CHALLENGE, FEEDBACK_CLIENT, KEY_CHECKED, MESSAGE, authorized, feedback_key_name
from service.errors import ApiError
from service.state import AppState

bearer = HTTPBearer(auto_error=False, description="the server's API key, when DIRECTOR_API_KEY is set")


# async on purpose: FastAPI runs a plain ``def`` dependency in its thread pool, two thread hops per request
# that also wait for the GIL (under a refusal flood they took about a fifth of the event loop's time)
async def get_state(request: Request) -> AppState:
    return request.app.state.director


AppStateDep = Annotated[AppState, Depends(get_state)]


async def require_api_key(request: Request, state: AppStateDep,
                          _: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
    """The key check of ``service.api.auth``, which the gateway (``service.api.gateway``) already made before the body
    was read (and marked in the scope, so the key is compared once); kept so the OpenAPI schema declares the bearer
    scheme on every guarded route, and as a second line for a request the gateway did not check."""
    if not request.scope.get(KEY_CHECKED) and not authorized(state.settings.api_key, request.scope):
        raise ApiError(401, MESSAGE, headers=CHALLENGE)


async def feedback_client(request: Request, state: AppStateDep,
                          _: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> str:
    """Who sent a label: the name of the feedback key it carried when the server has feedback keys (then only they
    are taken), else the peer's address (behind a proxy, the proxy's unless uvicorn trusts its forwarded headers)."""
    keys = state.settings.feedback_keys
    if not keys:
        if not request.scope.get(KEY_CHECKED) and not authorized(state.settings.api_key, request.scope):
            raise ApiError(401, MESSAGE, headers=CHALLENGE)
        return f"address:{request.client.host}" if request.client is not None else "address:unknown"
    name = request.scope.get(FEEDBACK_CLIENT) or feedback_key_name(keys, request.scope)
    if name is None:
        raise ApiError(401, MESSAGE, headers=CHALLENGE)
    return f"key:{name}"


FeedbackClientDep = Annotated[str, Depends(feedback_client)]
